//! Whether each watch reaches the API server, for the log.
//!
//! A watch that resumes after an outage sends no event until something
//! changes, so "watch is back" logged at the first event can come minutes
//! late. Instead the watch loop marks a kind as failing, and an observer of
//! the Kubernetes client's requests (`super::requests`) clears the mark at
//! the first successful response to a request for that kind: the list or
//! watch that actually succeeded.
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use tracing::{info, warn};

use super::requests::{Observer, Outcome};

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

    /// An observer of the client's requests (`super::requests`) that
    /// reports successful lists and watches here.
    #[must_use]
    pub fn observer(self: &Arc<Self>) -> Observer {
        let this = self.clone();
        Arc::new(move |outcome: &Outcome| {
            if let Some(kind) = Self::kind_of(outcome.path)
                && outcome.status.is_some_and(|s| (200..300).contains(&s))
            {
                this.succeeded(kind);
            }
        })
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
