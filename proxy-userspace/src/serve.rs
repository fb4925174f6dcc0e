//! The agent's HTTP endpoints: health (kube-proxy's `/healthz` and
//! `/livez`) and metrics (`/metrics`, `/proxyMode`).
use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, info};

use crate::telemetry::Shared;

/// An answer: status, content type, body, and extra headers.
pub struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    #[must_use]
    pub fn new(status: StatusCode, content_type: &'static str, body: String) -> Self {
        Self { status, content_type, body, headers: Vec::new() }
    }

    fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "text/plain", "not found\n".to_owned())
    }
}

/// Answers a request for a path.
pub type Handler = Arc<dyn Fn(&str) -> Reply + Send + Sync>;

/// Binds `addr` (failing with a clear message) and serves `handler` there.
async fn serve(what: &'static str, addr: SocketAddr, handler: Handler) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for {what} on {addr}; choose another address or port"))?;
    let local = listener.local_addr()?;
    info!(address = %local, "serving {what}");
    spawn(what, listener, handler);
    Ok(local)
}

/// Serves `handler` on `listener` until the task is aborted.
pub fn spawn(what: &'static str, listener: TcpListener, handler: Handler) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let reply = handler(req.uri().path());
                    async move {
                        let mut response =
                            Response::builder().status(reply.status).header("content-type", reply.content_type);
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
    })
}

/// `/healthz` and `/livez`: 200 with kube-proxy's JSON while no change has
/// waited longer than `timeout`, 503 after.
pub async fn health(addr: SocketAddr, telemetry: Shared, timeout: Duration) -> anyhow::Result<SocketAddr> {
    let handler: Handler = Arc::new(move |path| match path {
        "/healthz" | "/livez" => {
            let t = telemetry.lock().expect("telemetry lock");
            let status = if t.healthy(std::time::Instant::now(), timeout) {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            Reply::new(status, "application/json", t.health_json())
        }
        _ => Reply::not_found(),
    });
    serve("health", addr, handler).await
}

/// `/metrics` (Prometheus text) and `/proxyMode` (`ebpf`).
pub async fn metrics(addr: SocketAddr, telemetry: Shared) -> anyhow::Result<SocketAddr> {
    let handler: Handler = Arc::new(move |path| match path {
        "/metrics" => {
            let text = telemetry.lock().expect("telemetry lock").prometheus();
            Reply::new(StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        "/proxyMode" => Reply::new(StatusCode::OK, "text/plain", "ebpf".to_owned()),
        _ => Reply::not_found(),
    });
    serve("metrics", addr, handler).await
}
