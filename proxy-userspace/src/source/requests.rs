//! What becomes of the Kubernetes client's requests: a tower layer around
//! its HTTP service hands each request's outcome (method, path, status or
//! no answer, time to the response headers) to observers. The watches'
//! "watch is back" log (`super::reachability`) and client-go's
//! `rest_client_*` metrics (`crate::observe::rest_metrics`) are two of them.
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

/// One request's outcome.
#[derive(Debug, Clone, Copy)]
pub struct Outcome<'a> {
    pub(crate) method: &'a str,
    /// The request's path (no query).
    pub(crate) path: &'a str,
    /// The API server's `host:port` (requests reach the layer before the
    /// client adds it to their URI).
    pub(crate) host: &'a str,
    /// The response's status; `None`: no answer (connection refused, ...).
    pub(crate) status: Option<u16>,
    /// To the response headers (a watch's stream is not counted in it).
    pub(crate) seconds: f64,
}

/// Told about every request's outcome.
pub(crate) type Observer = Arc<dyn Fn(&Outcome) + Send + Sync>;

/// Wraps the client's HTTP service so `observers` see each request.
#[derive(Clone)]
pub(crate) struct ObserveLayer {
    observers: Arc<[Observer]>,
    host: Arc<str>,
}

impl ObserveLayer {
    #[must_use]
    pub(crate) fn new(observers: Vec<Observer>, host: &str) -> Self {
        Self { observers: observers.into(), host: host.into() }
    }
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observe { inner, layer: self.clone() }
    }
}

#[derive(Clone)]
pub(crate) struct Observe<S> {
    inner: S,
    layer: ObserveLayer,
}

impl<S, B, R> tower::Service<http::Request<B>> for Observe<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().to_string();
        let path = request.uri().path().to_owned();
        let layer = self.layer.clone();
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let outcome = Outcome {
                method: &method,
                path: &path,
                host: &layer.host,
                status: result.as_ref().ok().map(|r| r.status().as_u16()),
                seconds: started.elapsed().as_secs_f64(),
            };
            for observe in layer.observers.iter() {
                observe(&outcome);
            }
            result
        })
    }
}
