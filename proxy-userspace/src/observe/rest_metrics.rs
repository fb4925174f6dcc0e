//! client-go's `rest_client_requests_total{code,method,host}` and
//! `rest_client_request_duration_seconds{verb,host}` for the Kubernetes
//! client, so the kube-proxy dashboard's API panels fill. The duration runs
//! to the response headers (a watch's stream is not counted in it), as in
//! client-go.
use std::sync::Arc;

use crate::{
    observe::metrics::{LatencyLabels, Metrics, RequestLabels},
    source::requests::{Observer, Outcome},
};

/// An observer of the Kubernetes client's requests (see
/// `crate::source::requests`) that counts and times them in `metrics`.
#[must_use]
pub(crate) fn observer(metrics: Arc<Metrics>) -> Observer {
    Arc::new(move |o: &Outcome| {
        // client-go labels a request that got no answer "<error>".
        let code = o.status.map_or_else(|| "<error>".to_owned(), |s| s.to_string());
        let host = o.host.to_owned();
        metrics
            .request_duration
            .get_or_create(&LatencyLabels { verb: o.method.to_owned(), host: host.clone() })
            .observe(o.seconds);
        metrics.requests.get_or_create(&RequestLabels { code, method: o.method.to_owned(), host }).inc();
    })
}

#[cfg(test)]
mod tests {
    use std::{
        convert::Infallible,
        sync::Mutex,
        task::{Context, Poll},
    };

    use hyper::{Request, Response};
    use tower::{Layer as _, Service};

    use super::*;
    use crate::{observe::telemetry::Telemetry, source::requests::ObserveLayer};

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
        let mut svc = ObserveLayer::new(vec![observer(metrics.clone())], "10.0.0.1:6443").layer(Echo);
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
