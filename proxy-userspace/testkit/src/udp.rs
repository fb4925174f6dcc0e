//! A UDP echo server bound inside a test namespace: it answers each
//! datagram with `NAME:PAYLOAD` (at most `ECHOED` bytes of the payload, so
//! that the answer to a datagram that fills the MTU fits it too) and
//! counts datagrams.
use std::{
    io,
    net::{IpAddr, SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use ebpf_proxy::sandbox::NetNs;

/// Bytes of a datagram's payload the answer repeats.
const ECHOED: usize = 512;

pub struct UdpBackend {
    name: String,
    received: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpBackend {
    pub fn start(ns: &NetNs, addr: IpAddr, port: u16, name: &str) -> io::Result<Self> {
        let sock = ns.run_inside(move || UdpSocket::bind(SocketAddr::new(addr, port)))??;
        sock.set_read_timeout(Some(Duration::from_millis(20)))?;
        let received = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (received, stop, name) = (received.clone(), stop.clone(), name.to_owned());
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::SeqCst) {
                    if let Ok((n, from)) = sock.recv_from(&mut buf) {
                        received.fetch_add(1, Ordering::SeqCst);
                        let mut reply = format!("{name}:").into_bytes();
                        reply.extend_from_slice(&buf[..n.min(ECHOED)]);
                        let _ = sock.send_to(&reply, from);
                    }
                }
            })
        };
        Ok(Self { name: name.to_owned(), received, stop, thread: Some(thread) })
    }

    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Datagrams received so far.
    #[must_use]
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

impl Drop for UdpBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
