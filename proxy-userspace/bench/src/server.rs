//! The backends: one listening socket per backend namespace (its `local`
//! route makes every endpoint address of that index its own), echoing what
//! each connection sends until it closes. Served by one small tokio
//! runtime in the bench process.
use std::{io, net::SocketAddr};

use proxy_testkit::NetNs;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::spec::BACKEND_PORT;

pub struct Servers {
    _rt: tokio::runtime::Runtime,
}

impl Servers {
    pub fn start(backends: &[NetNs]) -> io::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        for ns in backends {
            let addr = SocketAddr::from(([0, 0, 0, 0], BACKEND_PORT));
            let listener = ns.run_inside(move || {
                let socket = socket2_listener(addr)?;
                socket.set_nonblocking(true)?;
                Ok::<_, io::Error>(socket)
            })??;
            let listener = {
                let _guard = rt.enter();
                tokio::net::TcpListener::from_std(listener)?
            };
            rt.spawn(async move {
                loop {
                    let Ok((mut stream, _)) = listener.accept().await else { continue };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(async move {
                        // Large enough for the bulk mode's chunks to move in few
                        // reads, small enough to be cheap per short connection.
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            match stream.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if stream.write_all(&buf[..n]).await.is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                    });
                }
            });
        }
        Ok(Self { _rt: rt })
    }
}

/// A listening socket with a deep backlog (bursts of short connections).
fn socket2_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    // SAFETY: listen(2) on a socket this function owns; a larger backlog
    // than std's default 128.
    let ret = unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), 4096) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(listener)
}
