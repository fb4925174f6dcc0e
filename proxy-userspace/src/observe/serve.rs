//! The agent's HTTP endpoints: health (kube-proxy's `/healthz` and
//! `/livez`) and metrics (`/metrics`, `/proxyMode`).
//!
//! A port that cannot be bound is never fatal (kube-proxy's
//! `bindAddressHardFail: false`): the agent warns, serves traffic, and
//! retries the bind with backoff, so it can run beside a kube-proxy that
//! still holds :10256 and :10249 during a migration.
use std::{
    convert::Infallible,
    future::Future,
    io,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{
    net::{TcpListener, TcpSocket, TcpStream},
    task::JoinHandle,
};
use tracing::{debug, info, warn};

use super::{
    health::Endpoint,
    metrics::{Metrics, Server},
    telemetry::Shared,
};

/// An answer: status, content type, body, and extra headers.
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) content_type: &'static str,
    pub(crate) body: String,
    pub(crate) headers: Vec<(&'static str, String)>,
}

impl Reply {
    #[must_use]
    pub(crate) fn new(status: StatusCode, content_type: &'static str, body: String) -> Self {
        Self { status, content_type, body, headers: Vec::new() }
    }

    fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "text/plain", "not found\n".to_owned())
    }
}

/// Server tasks, aborted when dropped (when the agent stops).
pub(crate) struct Servers(pub(crate) Vec<JoinHandle<()>>);

impl Drop for Servers {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Answers a request for a path.
pub(crate) type Handler = Arc<dyn Fn(&str) -> Reply + Send + Sync>;

/// A doubling delay between `min` and `max`, back to `min` after a
/// success.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    #[must_use]
    pub(crate) const fn new(min: Duration, max: Duration) -> Self {
        Self { min, max, next: min }
    }

    /// The delay after one more failure.
    pub(crate) fn fail(&mut self) -> Duration {
        let delay = self.next;
        self.next = (delay * 2).min(self.max);
        delay
    }

    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }

    /// Whether the last call was a success (or there was none).
    #[must_use]
    pub(crate) fn at_start(&self) -> bool {
        self.next == self.min
    }
}

/// After a failed accept (EMFILE, ENFILE, ENOBUFS: the process or the
/// system is out of something), wait 5 ms doubling to 1 s, as Go's
/// net/http server (and so kube-proxy) does, instead of spinning.
pub(crate) const ACCEPT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(5), Duration::from_secs(1));
/// A port that cannot be bound is tried again 0.5 s doubling to 5 s later
/// (kube-proxy retries its servers every 5 s).
pub(crate) const BIND_BACKOFF: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));

/// Accepts with `accept` forever, handing each connection to `serve`; an
/// error waits out `backoff` before the next accept.
pub(crate) async fn accept_loop<S, F>(
    what: &str,
    mut backoff: Backoff,
    mut accept: impl FnMut() -> F,
    mut serve: impl FnMut(S),
) where
    F: Future<Output = io::Result<S>>,
{
    loop {
        match accept().await {
            Ok(conn) => {
                backoff.reset();
                serve(conn);
            }
            Err(err) => {
                let first = backoff.at_start();
                let delay = backoff.fail();
                if first {
                    warn!(%err, delay_ms = delay.as_millis(), "cannot accept a {what} connection (out of file descriptors?); backing off");
                } else {
                    debug!(%err, delay_ms = delay.as_millis(), "cannot accept a {what} connection");
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Serves `handler` on `listener` until the task is aborted.
pub(crate) fn spawn(what: &'static str, listener: TcpListener, handler: Handler) -> JoinHandle<()> {
    tokio::spawn(async move {
        let accept = || async { listener.accept().await.map(|(stream, _)| stream) };
        accept_loop(what, ACCEPT_BACKOFF, accept, |stream| serve_connection(what, stream, handler.clone())).await;
    })
}

fn serve_connection(what: &'static str, stream: TcpStream, handler: Handler) {
    tokio::spawn(async move {
        let service = service_fn(move |req: Request<hyper::body::Incoming>| {
            let reply = handler(req.uri().path());
            async move {
                let mut response = Response::builder().status(reply.status).header("content-type", reply.content_type);
                for (name, value) in reply.headers {
                    response = response.header(name, value);
                }
                Ok::<_, Infallible>(response.body(Full::new(Bytes::from(reply.body))).expect("valid response"))
            }
        });
        if let Err(err) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
            debug!(%err, "{what} connection ended");
        }
    });
}

/// Listens on `addr`. An unspecified address (`0.0.0.0` or `::`) means
/// every address of both families: `[::]` with IPv6-only off, so an
/// IPv6-only node serves too (kube-proxy binds `[::]` there), else
/// `0.0.0.0` where the node has no IPv6.
pub(crate) fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    if addr.ip().is_unspecified() {
        let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, addr.port()));
        match bind(any6, true) {
            Ok(listener) => return Ok(listener),
            Err(err) if err.kind() == io::ErrorKind::AddrInUse => return Err(err),
            Err(err) => debug!(%err, "no IPv6 here; listening on IPv4 only"),
        }
        return bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port())), false);
    }
    bind(addr, false)
}

fn bind(addr: SocketAddr, dual_stack: bool) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv6() { TcpSocket::new_v6()? } else { TcpSocket::new_v4()? };
    if dual_stack {
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::Ipv6V6Only, &false)?;
    }
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Serves `handler` on `addr` in the background. A bind that fails is
/// logged once, counted in `ebpf_proxy_bind_failures_total`, and retried
/// with backoff; "serving {what}" is logged once it succeeds.
fn serve(
    what: &'static str,
    server: Server,
    addr: SocketAddr,
    handler: Handler,
    metrics: Arc<Metrics>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut backoff = BIND_BACKOFF;
        let listener = loop {
            match listen(addr) {
                Ok(listener) => break listener,
                Err(err) => {
                    metrics.bind_failed(server);
                    if backoff.at_start() {
                        warn!(address = %addr, %err, "cannot listen for {what}; traffic is served all the same, and the port is tried again with backoff (another kube-proxy still running?)");
                    }
                    tokio::time::sleep(backoff.fail()).await;
                }
            }
        };
        let local = listener.local_addr().unwrap_or(addr);
        info!(address = %local, retried = !backoff.at_start(), "serving {what}");
        let accept = || async { listener.accept().await.map(|(stream, _)| stream) };
        accept_loop(what, ACCEPT_BACKOFF, accept, |stream| serve_connection(what, stream, handler.clone())).await;
    })
}

/// `/healthz` and `/livez`, kube-proxy's rules and JSON (see `health`).
#[must_use]
pub(crate) fn health(addr: SocketAddr, telemetry: Shared, metrics: Arc<Metrics>, timeout: Duration) -> JoinHandle<()> {
    let counts = metrics.clone();
    let handler: Handler = Arc::new(move |path| {
        let endpoint = match path {
            "/healthz" => Endpoint::Healthz,
            "/livez" => Endpoint::Livez,
            _ => return Reply::not_found(),
        };
        let answer = telemetry.lock().expect("telemetry lock").health.answer(
            endpoint,
            std::time::Instant::now(),
            std::time::SystemTime::now(),
            timeout,
        );
        counts.health_answered(endpoint, answer.status);
        let status = StatusCode::from_u16(answer.status).expect("a valid status");
        let mut reply = Reply::new(status, "application/json", answer.body.to_string());
        reply.headers.push(("x-content-type-options", "nosniff".to_owned()));
        reply
    });
    serve("health", Server::Health, addr, handler, metrics)
}

/// `/metrics` (OpenMetrics text) and `/proxyMode` (`ebpf`).
#[must_use]
pub(crate) fn metrics(addr: SocketAddr, metrics: Arc<Metrics>) -> JoinHandle<()> {
    let registry = metrics.clone();
    let handler: Handler = Arc::new(move |path| match path {
        "/metrics" => Reply::new(StatusCode::OK, crate::observe::metrics::CONTENT_TYPE, registry.encode()),
        "/proxyMode" => Reply::new(StatusCode::OK, "text/plain", "ebpf".to_owned()),
        _ => Reply::not_found(),
    });
    serve("metrics", Server::Metrics, addr, handler, metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = ACCEPT_BACKOFF;
        let delays: Vec<u64> = (0..10).map(|_| u64::try_from(b.fail().as_millis()).unwrap()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert!(b.at_start());
        assert_eq!(b.fail(), Duration::from_millis(5));
        let mut b = BIND_BACKOFF;
        let delays: Vec<u64> = (0..6).map(|_| u64::try_from(b.fail().as_millis()).unwrap()).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 5000, 5000]);
    }

    /// Accept errors (EMFILE here) neither end the loop nor lose the
    /// connection that comes after them.
    #[tokio::test]
    async fn accept_loop_survives_errors() {
        let mut script = vec![
            Err(io::Error::from_raw_os_error(libc::EMFILE)),
            Err(io::Error::from_raw_os_error(libc::EMFILE)),
            Ok(7),
        ]
        .into_iter();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let accept = move || {
            let next = script.next();
            async move {
                match next {
                    Some(result) => result,
                    None => std::future::pending().await,
                }
            }
        };
        let task = tokio::spawn(accept_loop("test", ACCEPT_BACKOFF, accept, move |conn: i32| tx.send(conn).unwrap()));
        let got = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("within 10 s");
        assert_eq!(got, Some(7));
        assert!(!task.is_finished());
        task.abort();
    }

    #[tokio::test]
    async fn unspecified_address_serves_both_families() {
        let listener = listen("0.0.0.0:0".parse().unwrap()).unwrap();
        let port = listener.local_addr().unwrap().port();
        if listener.local_addr().unwrap().is_ipv6() {
            TcpStream::connect((Ipv6Addr::LOCALHOST, port)).await.unwrap();
        }
        TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await.unwrap();
    }

    #[tokio::test]
    async fn a_taken_port_is_an_error_not_a_panic() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = listen(held.local_addr().unwrap()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }
}
