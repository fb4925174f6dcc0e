//! Whether each watch reaches the API server, for the log.
//!
//! A watch that resumes after an outage sends no event until something
//! changes, so "watch is back" logged at the first event can come minutes
//! late. Instead the watch loop marks a kind as failing, and a layer on the
//! Kubernetes client clears the mark at the first successful response to a
//! request for that kind: the list or watch that actually succeeded.
use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Instant,
};

use tracing::{info, warn};

/// The kinds the agent watches, by their resource name in API paths.
const KINDS: &[(&str, &str)] = &[("services", "Service"), ("endpointslices", "EndpointSlice"), ("nodes", "Node")];

/// Failing watches, by kind, with when they started failing.
#[derive(Debug, Default)]
pub struct Reachability {
    failing: Mutex<HashMap<&'static str, Instant>>,
}

impl Reachability {
    /// A watch of `kind` failed: the first failure is logged (with
    /// `error`), the rest only counted by the caller.
    pub fn failed(&self, kind: &'static str, error: &dyn std::fmt::Display) {
        let mut failing = self.failing.lock().expect("reachability lock");
        if !failing.contains_key(kind) {
            failing.insert(kind, Instant::now());
            warn!(kind, %error, "watch failed; retrying, the datapath keeps the last applied state");
        }
    }

    /// A list or watch of `kind` succeeded: logs "watch is back" once
    /// after failures.
    pub fn succeeded(&self, kind: &str) {
        let since = self.failing.lock().expect("reachability lock").remove(kind);
        if let Some(since) = since {
            info!(kind, down_seconds = since.elapsed().as_secs_f64(), "watch is back");
        }
    }

    /// Whether a watch of `kind` is failing now.
    #[must_use]
    pub fn is_failing(&self, kind: &str) -> bool {
        self.failing.lock().expect("reachability lock").contains_key(kind)
    }

    /// The kind a request path is for (`/api/v1/services`,
    /// `/apis/discovery.k8s.io/v1/namespaces/x/endpointslices/y`, ...).
    #[must_use]
    pub fn kind_of(path: &str) -> Option<&'static str> {
        let mut segments = path.trim_start_matches('/').split('/');
        // /api/v1/<resource>... or /apis/<group>/<version>/<resource>...
        let resource = match segments.next()? {
            "api" => segments.nth(1),
            "apis" => segments.nth(2),
            _ => None,
        }?;
        let resource = if resource == "namespaces" { segments.nth(1)? } else { resource };
        KINDS.iter().find(|(r, _)| *r == resource).map(|(_, kind)| *kind)
    }
}

/// The client layer that reports successful responses to `Reachability`.
#[derive(Clone)]
pub struct ReachabilityLayer(pub Arc<Reachability>);

impl<S> tower::Layer<S> for ReachabilityLayer {
    type Service = ReachabilityService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ReachabilityService { inner, reachability: self.0.clone() }
    }
}

#[derive(Clone)]
pub struct ReachabilityService<S> {
    inner: S,
    reachability: Arc<Reachability>,
}

impl<S, B, R> tower::Service<http::Request<B>> for ReachabilityService<S>
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
        let kind = Reachability::kind_of(request.uri().path());
        let response = self.inner.call(request);
        let reachability = self.reachability.clone();
        Box::pin(async move {
            let response = response.await?;
            if let Some(kind) = kind
                && response.status().is_success()
            {
                reachability.succeeded(kind);
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Reachability;

    #[test]
    fn request_paths_name_their_kind() {
        let cases = [
            ("/api/v1/services", Some("Service")),
            ("/api/v1/services?watch=true&resourceVersion=12", Some("Service")),
            ("/api/v1/namespaces/shop/services/web", Some("Service")),
            ("/apis/discovery.k8s.io/v1/endpointslices", Some("EndpointSlice")),
            ("/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices", Some("EndpointSlice")),
            ("/api/v1/nodes", Some("Node")),
            ("/apis/events.k8s.io/v1/namespaces/default/events", None),
            ("/api/v1/namespaces", None),
            ("/version", None),
            ("/", None),
        ];
        for (path, kind) in cases {
            assert_eq!(Reachability::kind_of(path.split('?').next().unwrap()), kind, "{path}");
        }
    }

    #[test]
    fn a_kind_fails_until_one_of_its_requests_succeeds() {
        let r = Reachability::default();
        r.failed("Service", &"connection refused");
        r.failed("Service", &"connection refused");
        assert!(r.is_failing("Service") && !r.is_failing("Node"));
        r.succeeded("Node");
        assert!(r.is_failing("Service"));
        r.succeeded("Service");
        assert!(!r.is_failing("Service"));
    }
}
