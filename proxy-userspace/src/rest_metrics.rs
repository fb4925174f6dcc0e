//! client-go's `rest_client_requests_total{code,method,host}` and
//! `rest_client_request_duration_seconds{verb,host}` for the Kubernetes
//! client: a tower layer around its HTTP service, so the kube-proxy
//! dashboard's API panels fill. The duration runs to the response headers
//! (a watch's stream is not counted in it), as in client-go.
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use hyper::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::metrics::{LatencyLabels, Metrics, RequestLabels};

/// Wraps a service in `RequestMetrics`.
#[derive(Debug, Clone)]
pub struct RequestMetricsLayer {
    metrics: Arc<Metrics>,
    /// The API server's `host:port` (requests reach this layer before the
    /// client adds it to their URI).
    host: String,
}

impl RequestMetricsLayer {
    #[must_use]
    pub fn new(metrics: Arc<Metrics>, host: String) -> Self {
        Self { metrics, host }
    }
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestMetrics { inner, layer: self.clone() }
    }
}

/// Counts and times each request of the inner service.
#[derive(Debug, Clone)]
pub struct RequestMetrics<S> {
    inner: S,
    layer: RequestMetricsLayer,
}

impl<S, B, RB> Service<Request<B>> for RequestMetrics<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let method = req.method().to_string();
        let (metrics, host) = (self.layer.metrics.clone(), self.layer.host.clone());
        let started = Instant::now();
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            // client-go labels a request that got no answer "<error>".
            let code = result.as_ref().map_or_else(|_| "<error>".to_owned(), |r| r.status().as_u16().to_string());
            record(&metrics, code, method, host, started.elapsed().as_secs_f64());
            result
        })
    }
}

/// A client of `config` whose requests are counted in `metrics` (when
/// given).
pub fn build_client(config: kube::Config, metrics: Option<&Arc<Metrics>>) -> Result<kube::Client, kube::Error> {
    let Some(metrics) = metrics else { return kube::Client::try_from(config) };
    let host = config.cluster_url.authority().map(ToString::to_string).unwrap_or_default();
    let layer = RequestMetricsLayer::new(metrics.clone(), host);
    Ok(kube::client::ClientBuilder::try_from(config)?.with_layer(&layer).build())
}

fn record(metrics: &Metrics, code: String, method: String, host: String, seconds: f64) {
    metrics
        .request_duration
        .get_or_create(&LatencyLabels { verb: method.clone(), host: host.clone() })
        .observe(seconds);
    metrics.requests.get_or_create(&RequestLabels { code, method, host }).inc();
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, sync::Mutex};

    use super::*;
    use crate::telemetry::Telemetry;

    /// A service answering each request with the status its path names.
    #[derive(Clone)]
    struct Echo;

    impl Service<Request<()>> for Echo {
        type Response = Response<()>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<()>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request<()>) -> Self::Future {
            let status: u16 = req.uri().path().trim_start_matches('/').parse().unwrap();
            std::future::ready(Ok(Response::builder().status(status).body(()).unwrap()))
        }
    }

    #[tokio::test]
    async fn requests_are_counted_by_code_method_and_host() {
        let telemetry = Arc::new(Mutex::new(Telemetry::new(1, 1)));
        let metrics = Arc::new(Metrics::new(telemetry, 0));
        let mut svc = RequestMetricsLayer::new(metrics.clone(), "10.0.0.1:6443".into()).layer(Echo);
        for (method, path) in [("GET", "/200"), ("GET", "/200"), ("POST", "/201"), ("GET", "/404")] {
            let req = Request::builder().method(method).uri(path).body(()).unwrap();
            svc.call(req).await.unwrap();
        }
        let text = metrics.encode();
        for line in [
            "rest_client_requests_total{code=\"200\",method=\"GET\",host=\"10.0.0.1:6443\"} 2",
            "rest_client_requests_total{code=\"201\",method=\"POST\",host=\"10.0.0.1:6443\"} 1",
            "rest_client_requests_total{code=\"404\",method=\"GET\",host=\"10.0.0.1:6443\"} 1",
            "rest_client_request_duration_seconds_count{verb=\"GET\",host=\"10.0.0.1:6443\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }
}
