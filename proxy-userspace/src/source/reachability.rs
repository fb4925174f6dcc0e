//! Whether each watch reaches the API server, for the log.
//!
//! A watch that resumes after an outage sends no event until something
//! changes, so "watch is back" logged at the first event can come minutes
//! late. Instead the watch loop marks a kind as failing, and an observer of
//! the Kubernetes client's requests (`super::requests`) clears the mark at
//! the first successful response to a request for that kind: the list or
//! watch that actually succeeded.
//!
//! A watch back after failing also means the API server answers again:
//! the other watches waiting to retry an unreachable server are woken
//! (`back_since`) instead of each sleeping out its own delay (up to a second,
//! `super::retry`), so they come back together and a relist after an
//! outage waits for the first of them, not the last.
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tracing::{info, warn};

use super::requests::{Observer, Outcome};

/// The kinds the agent watches, by their resource name in API paths.
const KINDS: &[(&str, &str)] = &[("services", "Service"), ("endpointslices", "EndpointSlice"), ("nodes", "Node")];

/// While a watch keeps failing, a reminder is logged at most this often,
/// with the count of failures: the outage stays visible in the log without
/// a line per attempt (about one a second, `super::retry`).
pub(crate) const REMIND_EVERY: Duration = Duration::from_secs(30);

/// A failing watch.
#[derive(Debug, Clone, Copy)]
struct Failing {
    since: Instant,
    /// Failures since `since`.
    failures: u64,
    /// When the last line about it was logged.
    logged: Instant,
}

/// What `Reachability::failed_at` logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Logged {
    /// The first failure of the watch.
    First,
    /// A reminder, `REMIND_EVERY` after the last line.
    Reminder,
    /// Nothing (counted only).
    Nothing,
}

/// Failing watches, by kind.
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    failing: Mutex<HashMap<&'static str, Failing>>,
    /// How often the watch of each kind (`KINDS`' order) came back after
    /// failing (`back_since`).
    back: tokio::sync::watch::Sender<[u64; KINDS.len()]>,
}

impl Reachability {
    /// A watch of `kind` failed: the first failure is logged (with
    /// `error`), then a reminder at most every `REMIND_EVERY`.
    pub(crate) fn failed(&self, kind: &'static str, error: &dyn std::fmt::Display) {
        self.failed_at(kind, error, Instant::now());
    }

    /// `failed` at `now`.
    pub(crate) fn failed_at(&self, kind: &'static str, error: &dyn std::fmt::Display, now: Instant) -> Logged {
        let mut failing = self.failing.lock().expect("reachability lock");
        let Some(f) = failing.get_mut(kind) else {
            failing.insert(kind, Failing { since: now, failures: 1, logged: now });
            warn!(kind, %error, "watch failed; retrying, the datapath keeps the last applied state");
            return Logged::First;
        };
        f.failures += 1;
        if now.saturating_duration_since(f.logged) < REMIND_EVERY {
            return Logged::Nothing;
        }
        f.logged = now;
        let down_seconds = now.saturating_duration_since(f.since).as_secs_f64();
        warn!(
            kind,
            %error,
            failures = f.failures,
            down_seconds,
            "watch still failing; retrying, the datapath keeps the last applied state"
        );
        Logged::Reminder
    }

    /// A list or watch of `kind` succeeded: logs "watch is back" once
    /// after failures, and counts it for the watches waiting in `back_since`.
    pub(crate) fn succeeded(&self, kind: &str) {
        let failing = self.failing.lock().expect("reachability lock").remove(kind);
        if let Some(Failing { since, failures, .. }) = failing {
            info!(kind, down_seconds = since.elapsed().as_secs_f64(), failures, "watch is back");
            if let Some(i) = KINDS.iter().position(|(_, k)| *k == kind) {
                self.back.send_modify(|n| n[i] += 1);
            }
        }
    }

    /// How often the watches of kinds other than `kind` came back so far:
    /// a mark for `back_since`.
    pub(crate) fn generation(&self, kind: &str) -> u64 {
        others(&self.back.borrow(), kind)
    }

    /// Completes when the watch of a kind other than `kind` came back
    /// (`succeeded`) after `generation` was read: the API server answers
    /// again. A watch reads it before each attempt and, when the attempt
    /// finds the server unreachable, waits for this beside its delay; so a
    /// watch that came back while the attempt was under way is not missed.
    /// Its own kind does not count: a server that accepts the watch and
    /// drops it at once would otherwise have it retried without a pause.
    pub(crate) fn back_since(&self, kind: &'static str, generation: u64) -> impl Future<Output = ()> + use<> {
        let mut back = self.back.subscribe();
        async move {
            // An error: the sender is gone with the agent.
            let _ = back.wait_for(|n| others(n, kind) != generation).await;
        }
    }

    /// An observer of the client's requests (`super::requests`) that
    /// reports successful lists and watches here.
    #[must_use]
    pub(crate) fn observer(self: &Arc<Self>) -> Observer {
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
    pub(crate) fn is_failing(&self, kind: &str) -> bool {
        self.failing.lock().expect("reachability lock").contains_key(kind)
    }

    /// The kind a request path is for (`/api/v1/services`,
    /// `/apis/discovery.k8s.io/v1/namespaces/x/endpointslices/y`, ...).
    #[must_use]
    pub(crate) fn kind_of(path: &str) -> Option<&'static str> {
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

/// The sum of `counts` but for `kind`'s.
fn others(counts: &[u64; KINDS.len()], kind: &str) -> u64 {
    KINDS.iter().zip(counts).filter(|((_, k), _)| *k != kind).map(|(_, n)| n).sum()
}

#[cfg(test)]
mod tests {
    use super::Reachability;

    /// Another kind's watch coming back wakes a watch waiting on an
    /// unreachable server, also when it came back before the wait began
    /// (during the attempt); its own kind's does not (a server that drops
    /// each watch at once must not be retried without a pause).
    #[tokio::test]
    async fn another_watch_back_wakes_a_waiting_one_its_own_does_not() {
        use std::time::Duration;
        let r = Reachability::default();
        let before = r.generation("Node");
        r.failed("Node", &"refused");
        r.succeeded("Node");
        let own = tokio::time::timeout(Duration::from_millis(50), r.back_since("Node", before)).await;
        assert!(own.is_err(), "its own kind woke it");
        r.succeeded("Service");
        assert_eq!(r.generation("Node"), before, "a kind that was not failing is not back");
        r.failed("Service", &"refused");
        r.succeeded("Service");
        // Came back before the wait: it ends at once.
        let other = tokio::time::timeout(Duration::from_millis(50), r.back_since("Node", before)).await;
        assert!(other.is_ok(), "another kind back did not wake it");
        assert_eq!(r.generation("Node"), before + 1);
    }

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

    /// A watch failing about once a second for 100 s: its first failure
    /// and then a reminder every 30 s are logged, not a line each; after a
    /// success the next failure is a first one again.
    #[test]
    fn a_long_outage_logs_the_first_failure_and_a_reminder_every_30_seconds() {
        use super::{Logged, REMIND_EVERY};
        use std::time::{Duration, Instant};
        let r = Reachability::default();
        let start = Instant::now();
        let logged: Vec<(u64, Logged)> = (0..=100)
            .map(|s| (s, r.failed_at("Service", &"connection refused", start + Duration::from_secs(s))))
            .filter(|(_, l)| *l != Logged::Nothing)
            .collect();
        assert_eq!(REMIND_EVERY, Duration::from_secs(30));
        assert_eq!(
            logged,
            [(0, Logged::First), (30, Logged::Reminder), (60, Logged::Reminder), (90, Logged::Reminder)]
        );
        r.succeeded("Service");
        assert_eq!(r.failed_at("Service", &"refused", start + Duration::from_secs(101)), Logged::First);
    }
}
