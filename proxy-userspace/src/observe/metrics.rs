//! The metrics endpoint's registry (prometheus-client, OpenMetrics text):
//! kube-proxy's metrics under kube-proxy's names (pkg/proxy/metrics/
//! metrics.go, client-go's rest_client_*, the process collector), so
//! dashboards and alerts written for kube-proxy work, and ebpf-proxy's own
//! (`ebpf_proxy_*`, read at scrape time from `Telemetry`).
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use super::{health::Endpoint, telemetry::Shared};

/// The content type of `encode`'s text.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Per-frontend series (`ebpf_proxy_service_connections_total`) exported
/// at most, by default.
pub(crate) const DEFAULT_MAX_SERVICE_SERIES: usize = 1000;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CodeLabels {
    pub(crate) code: String,
}

/// `internal` or `external` (kube-proxy's `traffic_policy` label).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TrafficPolicyLabels {
    pub(crate) traffic_policy: &'static str,
}

/// A map of the datapath (`SERVICES`, `BACKENDS`, ...).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MapLabels {
    pub(crate) map: &'static str,
}

/// Why the services file, or an object in it, was rejected.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ServerLabels {
    pub(crate) server: &'static str,
}

/// client-go's `rest_client_requests_total` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) code: String,
    pub(crate) method: String,
    pub(crate) host: String,
}

/// client-go's `rest_client_request_duration_seconds` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LatencyLabels {
    pub(crate) verb: String,
    pub(crate) host: String,
}

/// The agent's HTTP servers, as a label.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Server {
    Health,
    Metrics,
}

/// A histogram of client-go's request latency buckets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestBuckets;

impl MetricConstructor<Histogram> for RequestBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new([0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0])
    }
}

/// A float gauge (seconds since the epoch).
pub(crate) type Seconds = Gauge<f64, AtomicU64>;

/// Every metric the agent updates as things happen.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// Time to apply one sync to the maps (kube-proxy's buckets: 1 ms
    /// doubling to 16 s), and the same split by whole-table and partial
    /// syncs.
    pub(crate) sync_duration: Histogram,
    pub(crate) sync_full_duration: Histogram,
    pub(crate) sync_partial_duration: Histogram,
    /// From an EndpointSlice's last-change-trigger-time to its map write.
    pub(crate) network_programming: Histogram,
    pub(crate) last_sync: Seconds,
    pub(crate) last_queued: Seconds,
    /// Frontends added or removed / whose backends changed.
    pub(crate) service_changes: Counter,
    pub(crate) endpoint_changes: Counter,
    /// Services and EndpointSlices read but not yet in the maps.
    pub(crate) service_changes_pending: Gauge,
    pub(crate) endpoint_changes_pending: Gauge,
    /// `--take-over-from-kube-proxy`: differences between kube-proxy's
    /// rules and the desired table found by the last check (-1: no check
    /// yet or it failed; 0 once the rules are removed or none were found).
    pub(crate) takeover_differences: Gauge,
    /// Entries of the connection-tracking map at the last sweep, and the
    /// most it holds (`crate::observe::ct_fill`).
    pub(crate) ct_entries: Gauge,
    pub(crate) ct_capacity: Gauge,
    /// Times `CT` was moved to one twice as big (`crate::agent::resize::grow_ct`).
    pub(crate) ct_growths: Counter,
    /// Service ports with a Local traffic policy and no endpoint on this
    /// node, by policy.
    no_local_endpoints: Family<TrafficPolicyLabels, Gauge>,
    healthz: Family<CodeLabels, Counter>,
    livez: Family<CodeLabels, Counter>,
    bind_failures: Family<ServerLabels, Counter>,
    /// Map entries the drift audit found changed by something else, by map.
    drift: Family<MapLabels, Counter>,
    file_rejections: Family<ReasonLabels, Counter>,
    pub(crate) requests: Family<RequestLabels, Counter>,
    pub(crate) request_duration: Family<LatencyLabels, Histogram, RequestBuckets>,
    max_service_series: usize,
}

impl Metrics {
    fn register_conntrack(&mut self) {
        self.registry.register(
            "ebpf_proxy_ct_entries",
            "Entries of the connection-tracking map (CT, two per flow translated per packet) at the last count (every 10 s)",
            self.ct_entries.clone(),
        );
        self.registry.register(
            "ebpf_proxy_ct_capacity",
            "The most entries the connection-tracking map holds (--ct-map-size, or sized from memory and grown); near it the LRU evicts the least recently used",
            self.ct_capacity.clone(),
        );
        self.registry.register(
            "ebpf_proxy_ct_growths",
            "Times the connection-tracking map, sized from the node's memory, filled up and was moved to one twice as big, its flows carried",
            self.ct_growths.clone(),
        );
    }

    /// The registry, with `telemetry`'s metrics read at each scrape.
    #[must_use]
    pub(crate) fn new(telemetry: Shared, max_service_series: usize) -> Self {
        let sync_buckets = || Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let mut network_buckets = vec![0.25, 0.5];
        network_buckets.extend((1..=59).map(f64::from));
        network_buckets.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
        network_buckets.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
        let m = Self {
            registry: Registry::default(),
            sync_duration: sync_buckets(),
            sync_full_duration: sync_buckets(),
            sync_partial_duration: sync_buckets(),
            network_programming: Histogram::new(network_buckets),
            last_sync: Seconds::default(),
            last_queued: Seconds::default(),
            service_changes: Counter::default(),
            endpoint_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            endpoint_changes_pending: Gauge::default(),
            takeover_differences: Gauge::default(),
            ct_entries: Gauge::default(),
            ct_capacity: Gauge::default(),
            ct_growths: Counter::default(),
            no_local_endpoints: Family::default(),
            healthz: Family::default(),
            livez: Family::default(),
            bind_failures: Family::default(),
            drift: Family::default(),
            file_rejections: Family::default(),
            requests: Family::default(),
            request_duration: Family::new_with_constructor(RequestBuckets),
            max_service_series,
        };
        m.register(telemetry)
    }

    fn register(mut self, telemetry: Shared) -> Self {
        self.register_conntrack();
        let r = &mut self.registry;
        r.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "Time to apply one sync to the BPF maps",
            self.sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "Time to apply a sync that compared the whole table with the maps (start, relist, node change)",
            self.sync_full_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "Time to apply a sync of only the services that changed",
            self.sync_partial_duration.clone(),
        );
        r.register(
            "kubeproxy_network_programming_duration_seconds",
            "Time from an EndpointSlice's last-change-trigger-time to its map write",
            self.network_programming.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "When the last sync finished (Unix time)",
            self.last_sync.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "When the last change arrived that asked for a sync (Unix time)",
            self.last_queued.clone(),
        );
        r.register(
            "ebpf_proxy_takeover_differences",
            "Differences between kube-proxy's rules and the desired table at the last takeover check (-1: not checked yet or the check failed)",
            self.takeover_differences.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Frontends added or removed",
            self.service_changes.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Frontends whose backends changed",
            self.endpoint_changes.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Services read and not yet applied to the maps",
            self.service_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "EndpointSlices read and not yet applied to the maps",
            self.endpoint_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            self.no_local_endpoints.clone(),
        );
        r.register("kubeproxy_proxy_healthz", "/healthz answers by HTTP status code", self.healthz.clone());
        r.register("kubeproxy_proxy_livez", "/livez answers by HTTP status code", self.livez.clone());
        r.register(
            "ebpf_proxy_bind_failures",
            "Failed binds of the health and metrics ports (each retried with backoff; traffic is served meanwhile)",
            self.bind_failures.clone(),
        );
        r.register(
            "ebpf_proxy_datapath_drift",
            "Map entries the drift audit found differing from the desired table (changed, added or deleted by something else) and repaired, by map",
            self.drift.clone(),
        );
        r.register(
            "ebpf_proxy_services_file_rejections",
            "Services file reads and objects not applied, by reason (the last good content stays in effect)",
            self.file_rejections.clone(),
        );
        r.register(
            "rest_client_requests",
            "Requests to the Kubernetes API by status code, method and host",
            self.requests.clone(),
        );
        r.register(
            "rest_client_request_duration_seconds",
            "Time from a request to the Kubernetes API to its response headers, by verb and host",
            self.request_duration.clone(),
        );
        r.register_collector(Box::new(crate::observe::telemetry::Collector {
            telemetry,
            max_service_series: self.max_service_series,
        }));
        r.register_collector(Box::new(crate::observe::process_metrics::ProcessCollector));
        self
    }

    /// The OpenMetrics text of every metric.
    #[must_use]
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    pub(crate) fn health_answered(&self, endpoint: Endpoint, status: u16) {
        let family = match endpoint {
            Endpoint::Healthz => &self.healthz,
            Endpoint::Livez => &self.livez,
        };
        family.get_or_create(&CodeLabels { code: status.to_string() }).inc();
    }

    /// Service ports with a Local internal / external traffic policy and no
    /// endpoint on this node, after the last sync.
    pub(crate) fn set_no_local_endpoints(&self, internal: usize, external: usize) {
        for (traffic_policy, n) in [("internal", internal), ("external", external)] {
            self.no_local_endpoints
                .get_or_create(&TrafficPolicyLabels { traffic_policy })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub(crate) fn bind_failed(&self, server: Server) {
        let server = match server {
            Server::Health => "health",
            Server::Metrics => "metrics",
        };
        self.bind_failures.get_or_create(&ServerLabels { server }).inc();
    }

    /// Counts what a drift audit found differing, map by map.
    pub(crate) fn drift_repaired(&self, drift: &crate::reconcile::audit::Drift) {
        for (map, d) in &drift.maps {
            self.drift.get_or_create(&MapLabels { map }).inc_by(d.total() as u64);
        }
    }

    /// The services file, or an object in it, was rejected for `reason`.
    pub(crate) fn file_rejected(&self, reason: &'static str) {
        self.file_rejections.get_or_create(&ReasonLabels { reason }).inc();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::observe::telemetry::Telemetry;

    /// kube-proxy's metrics that mean something here, as kube-proxy names
    /// them (the sample names a scrape shows).
    const KUBE_PROXY: &[&str] = &[
        // pkg/proxy/metrics/metrics.go: SyncProxyRulesLatency
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        // pkg/proxy/metrics/metrics.go: SyncFullProxyRulesLatency
        "kubeproxy_sync_full_proxy_rules_duration_seconds_bucket",
        // pkg/proxy/metrics/metrics.go: SyncPartialProxyRulesLatency
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket",
        // pkg/proxy/metrics/metrics.go: NetworkProgrammingLatency
        "kubeproxy_network_programming_duration_seconds_bucket",
        // pkg/proxy/metrics/metrics.go: SyncProxyRulesLastTimestamp
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        // pkg/proxy/metrics/metrics.go: SyncProxyRulesLastQueuedTimestamp
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        // pkg/proxy/metrics/metrics.go: ServiceChangesTotal, ServiceChangesPending
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        // pkg/proxy/metrics/metrics.go: EndpointChangesTotal, EndpointChangesPending
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        // pkg/proxy/metrics/metrics.go: SyncProxyRulesNoLocalEndpointsTotal
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\"} 2",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"} 1",
        // pkg/proxy/metrics/metrics.go: ProxyHealthzTotal, ProxyLivezTotal
        "kubeproxy_proxy_healthz_total{code=\"200\"}",
        "kubeproxy_proxy_livez_total{code=\"503\"}",
        // client-go tools/metrics, registered by component-base/metrics/
        // prometheus/restclient/metrics.go: requestResult, requestLatency
        "rest_client_requests_total{code=",
        "rest_client_request_duration_seconds_bucket{le=",
        // prometheus/client_golang's process collector
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ];

    #[test]
    fn kube_proxys_names() {
        let metrics = Metrics::new(Arc::new(Mutex::new(Telemetry::new(1, 1))), DEFAULT_MAX_SERVICE_SERIES);
        metrics.health_answered(Endpoint::Healthz, 200);
        metrics.health_answered(Endpoint::Livez, 503);
        metrics.set_no_local_endpoints(2, 1);
        let labels = LatencyLabels { verb: "GET".into(), host: "h:443".into() };
        metrics.request_duration.get_or_create(&labels).observe(0.01);
        metrics
            .requests
            .get_or_create(&RequestLabels { code: "200".into(), method: "GET".into(), host: "h:443".into() })
            .inc();
        let text = metrics.encode();
        for name in KUBE_PROXY {
            assert!(text.lines().any(|l| l.starts_with(name)), "{name} missing:\n{text}");
        }
        assert!(text.contains("# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram"), "{text}");
        assert!(
            text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.004\"} 0"),
            "kube-proxy's buckets:\n{text}"
        );
        assert!(text.ends_with("# EOF\n"), "a complete OpenMetrics exposition");
    }

    #[test]
    fn bind_failures_are_counted_per_server() {
        let metrics = Metrics::new(Arc::new(Mutex::new(Telemetry::new(1, 1))), 0);
        metrics.bind_failed(Server::Health);
        metrics.bind_failed(Server::Health);
        metrics.bind_failed(Server::Metrics);
        let text = metrics.encode();
        assert!(text.contains("ebpf_proxy_bind_failures_total{server=\"health\"} 2\n"), "{text}");
        assert!(text.contains("ebpf_proxy_bind_failures_total{server=\"metrics\"} 1\n"), "{text}");
    }

    #[test]
    fn services_file_rejections_are_counted_per_reason() {
        let metrics = Metrics::new(Arc::new(Mutex::new(Telemetry::new(1, 1))), 0);
        metrics.file_rejected("not_yaml");
        metrics.file_rejected("not_yaml");
        metrics.file_rejected("empty");
        let text = metrics.encode();
        assert!(text.contains("ebpf_proxy_services_file_rejections_total{reason=\"not_yaml\"} 2\n"), "{text}");
        assert!(text.contains("ebpf_proxy_services_file_rejections_total{reason=\"empty\"} 1\n"), "{text}");
    }
}
