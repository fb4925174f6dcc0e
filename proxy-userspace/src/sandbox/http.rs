//! A minimal HTTP/1.1 server bound inside a test namespace: it answers every
//! request with its own name and closes, and counts connections and
//! remembers where they came from.
use std::{
    io::{self, Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use super::NetNs;

/// An HTTP server in a network namespace that answers with its name.
pub struct HttpBackend {
    name: String,
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HttpBackend {
    /// Listens on `addr:port` inside `ns`, answering with body `NAME\n`.
    pub fn start(ns: &NetNs, addr: IpAddr, port: u16, name: &str) -> io::Result<Self> {
        let sock = SocketAddr::new(addr, port);
        let listener = ns.run_inside(move || TcpListener::bind(sock))??;
        listener.set_nonblocking(true)?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (accepted, peers, stop, body) = (accepted.clone(), peers.clone(), stop.clone(), format!("{name}\n"));
            std::thread::spawn(move || serve(&listener, &accepted, &peers, &stop, &body))
        };
        Ok(Self { name: name.to_owned(), addr: sock, accepted, peers, stop, thread: Some(thread) })
    }

    /// The name it answers with.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address it listens on.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    #[must_use]
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Where the connections came from (the addresses the server saw).
    #[must_use]
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().expect("peers lock").clone()
    }
}

fn serve(
    listener: &TcpListener,
    accepted: &AtomicUsize,
    peers: &Mutex<Vec<SocketAddr>>,
    stop: &AtomicBool,
    body: &str,
) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                accepted.fetch_add(1, Ordering::SeqCst);
                peers.lock().expect("peers lock").push(peer);
                let body = body.to_owned();
                std::thread::spawn(move || answer(stream, &body));
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn answer(mut stream: TcpStream, body: &str) {
    let _ = stream.set_nonblocking(false);
    // Long enough for a test to hold an idle connection across agent
    // restarts (each waits for the kernel's verifier, over a second for
    // the TC programs): the connection is the test's to close.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(15)));
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes());
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
