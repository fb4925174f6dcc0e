//! The proxy's own health, as kube-proxy's `/healthz` and `/livez` report
//! it (pkg/proxy/healthcheck/proxy_health.go), for load balancers and
//! kubelet's probes:
//! - a change that waits longer than the health timeout unapplied makes
//!   both 503 (the proxy is stuck); a sync whose writes failed (a full
//!   map) leaves its changes unapplied, as kube-proxy's failed syncs do;
//! - `/healthz` is also 503 before the first sync, and while this node is
//!   not eligible for traffic: being deleted (deletionTimestamp) or tainted
//!   `ToBeDeletedByClusterAutoscaler`, so load balancers drain it first;
//!   `/livez` ignores eligibility (a node being drained must not restart
//!   its proxy);
//! - `/healthz` is also 503 on a fresh node until traffic from outside is
//!   served (the TC programs attached, after the first sync): a load
//!   balancer that checks it for externalTrafficPolicy Cluster (KEP-3836)
//!   would otherwise send to NodePorts nothing serves yet. kube-proxy's
//!   first sync writes its NodePort rules with the rest. After a restart
//!   the previous agent's programs serve them from the start.
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Healthz,
    Livez,
}

/// What the health endpoints answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

/// The state the rules read; the agent updates it.
#[derive(Debug, Clone)]
pub(crate) struct ProxyHealth {
    /// When the last sync that wrote everything finished (`None`: none
    /// yet).
    pub(crate) last_updated: Option<SystemTime>,
    /// A sync has run (also one whose writes failed).
    pub(crate) synced: bool,
    /// A change seen but not yet applied since this instant.
    pub(crate) pending_since: Option<Instant>,
    /// Traffic from outside is served: the TC programs were attached to
    /// the devices (or found none to attach to), or a previous agent's
    /// serve on the same maps (a restart). Also set when the kernel refused
    /// the TC programs: that is logged as an error and does not change,
    /// and a readiness probe failing for ever would only stall rollouts,
    /// while the pods' connections are served.
    pub(crate) outside_served: bool,
    /// The Node says this node should get traffic. True until its Node
    /// object says otherwise (as kube-proxy assumed before it read its
    /// Node; the file source has none).
    pub(crate) node_eligible: bool,
}

impl Default for ProxyHealth {
    fn default() -> Self {
        Self { last_updated: None, synced: false, pending_since: None, outside_served: false, node_eligible: true }
    }
}

impl ProxyHealth {
    /// A change arrived (kept from the first one until it is applied).
    pub(crate) fn queued(&mut self, now: Instant) {
        self.pending_since.get_or_insert(now);
    }

    /// Everything seen so far is applied.
    pub(crate) fn updated(&mut self, wall: SystemTime) {
        self.pending_since = None;
        self.last_updated = Some(wall);
        self.synced = true;
    }

    /// A sync ran but some writes failed: what waits stays pending (and
    /// `lastUpdated` stays), so the proxy turns unhealthy once the failure
    /// is older than the timeout, as kube-proxy's does when its syncs fail
    /// (it calls `Updated` only after a successful sync).
    pub(crate) fn failed(&mut self) {
        self.synced = true;
    }

    /// kube-proxy's rule: healthy unless a change has waited longer than
    /// `timeout` without being applied (what `/livez` and the
    /// healthCheckNodePorts' `serviceProxyHealthy` report).
    #[must_use]
    pub(crate) fn healthy(&self, now: Instant, timeout: Duration) -> bool {
        self.pending_since.is_none_or(|since| now.duration_since(since) < timeout)
    }

    /// The answer of `endpoint` at `now` (`wall`: the same instant as wall
    /// clock time).
    #[must_use]
    pub(crate) fn answer(&self, endpoint: Endpoint, now: Instant, wall: SystemTime, timeout: Duration) -> Answer {
        let proxier_healthy = self.healthy(now, timeout);
        let ok = match endpoint {
            Endpoint::Livez => proxier_healthy,
            Endpoint::Healthz => proxier_healthy && self.node_eligible && self.synced && self.outside_served,
        };
        // kube-proxy reports "now" as lastUpdated while healthy (older
        // clients read a recent lastUpdated as healthy).
        let last_updated = if ok { Some(wall) } else { self.last_updated };
        let mut body = json!({
            "lastUpdated": go_time(last_updated),
            "currentTime": go_time(Some(wall)),
            "healthy": proxier_healthy,
        });
        if endpoint == Endpoint::Healthz {
            // Ours, beside kube-proxy's fields: why a synced, healthy
            // proxy's /healthz is 503 on a fresh node.
            body["outsideTrafficServed"] = json!(self.outside_served);
        }
        if let Some(synced) = self.last_updated {
            // One proxier serves both families here.
            let proxier = json!({ "lastUpdated": go_time(Some(synced)), "healthy": proxier_healthy });
            body["status"] = json!({ "IPv4": proxier, "IPv6": proxier });
        }
        if endpoint == Endpoint::Healthz {
            body["nodeEligible"] = json!(self.node_eligible);
        }
        Answer { status: if ok { 200 } else { 503 }, body }
    }
}

/// A time as Go's JSON writes a `time.Time` (RFC 3339; never set: Go's
/// zero time).
fn go_time(t: Option<SystemTime>) -> String {
    t.and_then(|t| k8s_openapi::jiff::Timestamp::try_from(t).ok())
        .map_or_else(|| "0001-01-01T00:00:00Z".to_owned(), |t| t.to_string())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{Node, NodeSpec, Taint},
        apimachinery::pkg::apis::meta::v1::Time,
    };

    use super::*;
    use crate::model::{TO_BE_DELETED_TAINT, node_eligible};

    const TIMEOUT: Duration = Duration::from_mins(1);

    fn synced() -> (ProxyHealth, Instant, SystemTime) {
        let mut h = ProxyHealth::default();
        let (now, wall) = (Instant::now(), SystemTime::now());
        h.queued(now);
        h.updated(wall);
        h.outside_served = true;
        (h, now, wall)
    }

    fn node(deleting: bool, taints: &[&str]) -> Node {
        let mut n = Node::default();
        if deleting {
            n.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        }
        let taints =
            taints.iter().map(|k| Taint { key: (*k).to_owned(), effect: "NoSchedule".into(), ..Taint::default() });
        n.spec = Some(NodeSpec { taints: Some(taints.collect()), ..NodeSpec::default() });
        n
    }

    #[test]
    fn eligibility_follows_deletion_and_the_autoscaler_taint() {
        assert!(node_eligible(&node(false, &[])));
        assert!(node_eligible(&node(false, &["node.kubernetes.io/unschedulable"])));
        assert!(!node_eligible(&node(true, &[])), "being deleted");
        assert!(!node_eligible(&node(false, &["x", TO_BE_DELETED_TAINT])), "autoscaler taint");
        assert!(node_eligible(&Node::default()), "no spec at all");
    }

    #[test]
    fn healthy_after_a_sync_with_kube_proxys_fields() {
        let (h, now, wall) = synced();
        let a = h.answer(Endpoint::Healthz, now, wall, TIMEOUT);
        assert_eq!(a.status, 200, "{}", a.body);
        let b = &a.body;
        assert_eq!(b["healthy"], true);
        assert_eq!(b["nodeEligible"], true);
        assert_eq!(b["lastUpdated"], b["currentTime"], "healthy: lastUpdated is now");
        assert!(b["currentTime"].as_str().unwrap().starts_with("20"), "{b}");
        assert_eq!(b["status"]["IPv4"]["healthy"], true);
        assert_eq!(b["status"]["IPv6"]["healthy"], true);
        let l = h.answer(Endpoint::Livez, now, wall, TIMEOUT);
        assert_eq!(l.status, 200);
        assert!(l.body.get("nodeEligible").is_none(), "only /healthz reports eligibility: {}", l.body);
    }

    #[test]
    fn healthz_is_503_before_the_first_sync_livez_is_not() {
        let mut h = ProxyHealth::default();
        let (now, wall) = (Instant::now(), SystemTime::now());
        h.queued(now);
        let a = h.answer(Endpoint::Healthz, now, wall, TIMEOUT);
        assert_eq!(a.status, 503);
        assert_eq!(a.body["lastUpdated"], "0001-01-01T00:00:00Z");
        assert!(a.body.get("status").is_none(), "no proxier has synced: {}", a.body);
        assert_eq!(h.answer(Endpoint::Livez, now, wall, TIMEOUT).status, 200, "starting up is alive");
        // A start that takes longer than the timeout is stuck: both 503.
        let late = now + TIMEOUT + Duration::from_secs(1);
        assert_eq!(h.answer(Endpoint::Livez, late, wall, TIMEOUT).status, 503);
    }

    /// A fresh node's first sync is done but its TC programs are still
    /// being verified: NodePorts are not served yet, so /healthz (which a
    /// load balancer checks) waits; /livez does not.
    #[test]
    fn healthz_waits_for_traffic_from_outside_to_be_served() {
        let (mut h, now, wall) = synced();
        h.outside_served = false;
        let a = h.answer(Endpoint::Healthz, now, wall, TIMEOUT);
        assert_eq!(a.status, 503);
        assert_eq!((&a.body["healthy"], &a.body["outsideTrafficServed"]), (&json!(true), &json!(false)), "{}", a.body);
        assert_eq!(h.answer(Endpoint::Livez, now, wall, TIMEOUT).status, 200);
        h.outside_served = true;
        assert_eq!(h.answer(Endpoint::Healthz, now, wall, TIMEOUT).status, 200);
    }

    #[test]
    fn node_not_eligible_fails_healthz_only() {
        let (mut h, now, wall) = synced();
        h.node_eligible = node_eligible(&node(false, &[TO_BE_DELETED_TAINT]));
        let wall = wall + Duration::from_secs(5);
        let a = h.answer(Endpoint::Healthz, now, wall, TIMEOUT);
        assert_eq!(a.status, 503);
        assert_eq!(a.body["nodeEligible"], false);
        assert_eq!(a.body["healthy"], true, "the proxier itself is fine");
        assert_ne!(a.body["lastUpdated"], a.body["currentTime"], "not healthy: the real last update");
        assert_eq!(h.answer(Endpoint::Livez, now, wall, TIMEOUT).status, 200);
        h.node_eligible = node_eligible(&node(true, &[]));
        assert_eq!(h.answer(Endpoint::Healthz, now, wall, TIMEOUT).status, 503, "being deleted");
    }

    #[test]
    fn stale_changes_fail_both() {
        let (mut h, now, wall) = synced();
        h.queued(now);
        assert_eq!(h.answer(Endpoint::Healthz, now + Duration::from_secs(59), wall, TIMEOUT).status, 200);
        let late = now + Duration::from_secs(61);
        for e in [Endpoint::Healthz, Endpoint::Livez] {
            let a = h.answer(e, late, wall, TIMEOUT);
            assert_eq!(a.status, 503, "{e:?}");
            assert_eq!(a.body["healthy"], false);
            assert_eq!(a.body["status"]["IPv4"]["healthy"], false);
        }
        h.updated(wall);
        assert_eq!(h.answer(Endpoint::Healthz, late, wall, TIMEOUT).status, 200);
    }

    /// kube-proxy (pkg/proxy/healthcheck/proxy_health.go) calls `Updated`
    /// only after a sync that succeeded: while syncs fail, the oldest queued
    /// change stays pending and `/healthz` turns 503 once it is older than
    /// the timeout.
    #[test]
    fn failing_syncs_turn_unhealthy_after_the_timeout() {
        let mut h = ProxyHealth { outside_served: true, ..ProxyHealth::default() };
        let (now, wall) = (Instant::now(), SystemTime::now());
        h.queued(now);
        h.failed();
        let soon = now + Duration::from_secs(30);
        assert_eq!(h.answer(Endpoint::Healthz, soon, wall, TIMEOUT).status, 200, "within the timeout");
        // A retry that fails again does not make the failure younger.
        h.queued(soon);
        h.failed();
        let late = now + Duration::from_secs(61);
        let a = h.answer(Endpoint::Healthz, late, wall, TIMEOUT);
        assert_eq!(a.status, 503, "{}", a.body);
        assert_eq!(a.body["lastUpdated"], "0001-01-01T00:00:00Z", "no sync wrote everything yet");
        assert_eq!(h.answer(Endpoint::Livez, late, wall, TIMEOUT).status, 503);
        h.updated(wall);
        assert_eq!(h.answer(Endpoint::Healthz, late, wall, TIMEOUT).status, 200, "a sync that wrote everything");
    }
}
