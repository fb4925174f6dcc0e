//! What the health and metrics endpoints report: the agent writes it after
//! each sync, the HTTP handlers read it.
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use crate::{
    datapath::counters::{ConnCounters, ExternalStats},
    metrics::Histogram,
    pipeline::Stats,
    source::kube::WatchCounters,
};

#[derive(Debug)]
pub struct Telemetry {
    pub stats: Stats,
    /// Time spent applying each sync (kube-proxy's buckets: 1 ms doubling).
    pub sync_duration: Histogram,
    pub last_sync_wall: Option<SystemTime>,
    /// A change seen but not yet applied since this instant.
    pub pending_since: Option<Instant>,
    pub frontends: usize,
    pub backends: usize,
    pub service_entries: usize,
    pub services_map_size: u32,
    pub backends_map_size: u32,
    /// Frontends added or removed, and frontends whose backends changed.
    pub service_changes: u64,
    pub endpoint_changes: u64,
    /// The kernel's per-frontend connection counters (once loaded).
    pub counters: Option<ConnCounters>,
    /// What the TC programs did with traffic from outside (once loaded).
    pub external_stats: Option<ExternalStats>,
    pub maglev_tables: usize,
    pub health_check_ports: usize,
    /// Devices the TC programs are attached to.
    pub devices: usize,
    /// rev-NAT id -> (service port, frontend), for the counters' labels.
    pub frontends_by_id: BTreeMap<u16, (String, String)>,
    /// frontend -> rev-NAT id, the reverse of `frontends_by_id`.
    id_of: HashMap<String, u16>,
    /// The Kubernetes watches' counters (kube mode only).
    pub watch: Option<Arc<WatchCounters>>,
}

pub type Shared = Arc<Mutex<Telemetry>>;

impl Telemetry {
    #[must_use]
    pub fn new(services_map_size: u32, backends_map_size: u32) -> Self {
        Self {
            stats: Stats::default(),
            sync_duration: Histogram::new((0..15).map(|i| 0.001 * f64::from(1u32 << i)).collect()),
            last_sync_wall: None,
            pending_since: None,
            frontends: 0,
            backends: 0,
            service_entries: 0,
            services_map_size,
            backends_map_size,
            service_changes: 0,
            endpoint_changes: 0,
            counters: None,
            external_stats: None,
            maglev_tables: 0,
            health_check_ports: 0,
            devices: 0,
            frontends_by_id: BTreeMap::new(),
            id_of: HashMap::new(),
            watch: None,
        }
    }

    /// A change arrived (kept from the first one until it is applied).
    pub fn queued(&mut self, now: Instant) {
        self.pending_since.get_or_insert(now);
    }

    /// kube-proxy's rule: healthy unless a change has waited longer than
    /// `timeout` without being applied.
    #[must_use]
    pub fn healthy(&self, now: Instant, timeout: Duration) -> bool {
        self.pending_since.is_none_or(|since| now.duration_since(since) < timeout)
    }

    /// How full the maps the agent writes are.
    fn map_fill(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP ebpf_proxy_map_fill_ratio Entries used over the map's size.\n# TYPE ebpf_proxy_map_fill_ratio gauge"
        );
        let ratio = |used: usize, size: u32| if size == 0 { 0.0 } else { count(used) / f64::from(size) };
        let _ = writeln!(
            out,
            "ebpf_proxy_map_fill_ratio{{map=\"SERVICES\"}} {}",
            ratio(self.service_entries, self.services_map_size)
        );
        let _ = writeln!(
            out,
            "ebpf_proxy_map_fill_ratio{{map=\"BACKENDS\"}} {}",
            ratio(self.backends, self.backends_map_size)
        );
        let _ = writeln!(
            out,
            "ebpf_proxy_map_fill_ratio{{map=\"MAGLEV\"}} {}",
            ratio(self.maglev_tables, proxy_common::map_sizes::MAGLEV)
        );
    }

    /// Metrics of traffic from outside the node (the TC programs).
    fn external_metrics(&self, out: &mut String) {
        gauge(out, "ebpf_proxy_maglev_tables", "Maglev tables in the kernel.", count(self.maglev_tables));
        gauge(
            out,
            "ebpf_proxy_health_check_node_ports",
            "healthCheckNodePorts served (LoadBalancer services with externalTrafficPolicy: Local).",
            count(self.health_check_ports),
        );
        gauge(out, "ebpf_proxy_devices", "Devices the TC programs serve traffic from outside on.", count(self.devices));
        if let Some(Ok(stats)) = self.external_stats.as_ref().map(ExternalStats::read) {
            let _ = writeln!(
                out,
                "# HELP ebpf_proxy_external_packets_total Traffic from outside the node: new flows translated, and packets dropped by reason, counted in the kernel.\n# TYPE ebpf_proxy_external_packets_total counter"
            );
            for (result, n) in stats {
                let _ = writeln!(out, "ebpf_proxy_external_packets_total{{result=\"{result}\"}} {n}");
            }
        }
    }

    /// The body of `/healthz`, as kube-proxy writes it.
    #[must_use]
    pub fn health_json(&self) -> String {
        let time = |t: Option<SystemTime>| {
            t.map_or_else(String::new, |t| {
                k8s_openapi::jiff::Timestamp::try_from(t).map(|t| t.to_string()).unwrap_or_default()
            })
        };
        serde_json::json!({
            "lastUpdated": time(self.last_sync_wall),
            "currentTime": time(Some(SystemTime::now())),
            "nodeEligible": true,
        })
        .to_string()
    }

    /// The Prometheus text exposition.
    #[must_use]
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        histogram(
            &mut out,
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "Time to apply one sync to the BPF maps.",
            &self.sync_duration,
        );
        histogram(
            &mut out,
            "kubeproxy_network_programming_duration_seconds",
            "Time from an EndpointSlice's last-change-trigger-time to its map write.",
            &self.stats.network_programming,
        );
        let last = self
            .last_sync_wall
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        gauge(
            &mut out,
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "When the last sync finished (Unix time).",
            last,
        );
        counter(
            &mut out,
            "kubeproxy_sync_proxy_rules_service_changes_total",
            "Frontends added or removed.",
            self.service_changes,
        );
        counter(
            &mut out,
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "Frontends whose backends changed.",
            self.endpoint_changes,
        );
        gauge(&mut out, "ebpf_proxy_frontends", "Frontends in the maps.", count(self.frontends));
        gauge(&mut out, "ebpf_proxy_backends", "Backends in the maps.", count(self.backends));
        counter(
            &mut out,
            "ebpf_proxy_objects_rejected_total",
            "Objects of the source that could not be parsed.",
            self.stats.objects_rejected,
        );
        counter(
            &mut out,
            "ebpf_proxy_model_problems_total",
            "Problems found in Services and EndpointSlices (each counted once).",
            self.stats.problems,
        );
        counter(
            &mut out,
            "ebpf_proxy_map_write_failures_total",
            "Map writes that failed (and were retried).",
            self.stats.map_write_failures,
        );
        self.map_fill(&mut out);
        self.external_metrics(&mut out);
        if let Some(watch) = &self.watch {
            use std::sync::atomic::Ordering::Relaxed;
            counter(
                &mut out,
                "ebpf_proxy_watch_events_total",
                "Events received from the Kubernetes API.",
                watch.events.load(Relaxed),
            );
            counter(
                &mut out,
                "ebpf_proxy_watch_errors_total",
                "Watch failures (each retried with backoff).",
                watch.errors.load(Relaxed),
            );
        }
        if let Some(counters) = &self.counters {
            let _ = writeln!(
                out,
                "# HELP ebpf_proxy_service_connections_total New connections (and first datagrams of unconnected UDP sockets) per frontend, counted in the kernel.\n# TYPE ebpf_proxy_service_connections_total counter"
            );
            for (id, (service, frontend)) in &self.frontends_by_id {
                if let Ok(n) = counters.read(*id) {
                    let _ = writeln!(
                        out,
                        "ebpf_proxy_service_connections_total{{service=\"{service}\",frontend=\"{frontend}\"}} {n}"
                    );
                }
            }
        }
        out
    }

    /// Takes the frontends after a sync; zeroes the counter of an id that
    /// now names another frontend than before (ids are reused).
    pub fn set_frontends(&mut self, ids: Vec<(u16, String, String)>) {
        let new: BTreeMap<u16, (String, String)> = ids.into_iter().map(|(id, s, f)| (id, (s, f))).collect();
        if let Some(counters) = self.counters.as_mut() {
            for (id, labels) in &new {
                if self.frontends_by_id.get(id) != Some(labels)
                    && let Err(err) = counters.reset(*id)
                {
                    tracing::warn!(id, %err, "cannot reset a connection counter");
                }
            }
        }
        self.id_of = new.iter().map(|(id, (_, f))| (f.clone(), *id)).collect();
        self.frontends_by_id = new;
    }

    /// Frontend `frontend` now has id `now` (`None`: it is gone), with
    /// `service` as its label; a counter that passes to a new frontend
    /// starts from zero.
    pub fn set_frontend(&mut self, frontend: String, now: Option<(u16, String)>) {
        if let Some((id, service)) = now {
            let labels = (service, frontend.clone());
            if self.frontends_by_id.get(&id) != Some(&labels) {
                if let Some(counters) = self.counters.as_mut()
                    && let Err(err) = counters.reset(id)
                {
                    tracing::warn!(id, %err, "cannot reset a connection counter");
                }
                self.forget_frontend(&labels.1);
                if let Some((_, previous)) = self.frontends_by_id.insert(id, labels) {
                    self.id_of.remove(&previous);
                }
                self.id_of.insert(frontend, id);
            }
        } else {
            self.forget_frontend(&frontend);
        }
    }

    fn forget_frontend(&mut self, frontend: &str) {
        if let Some(id) = self.id_of.remove(frontend) {
            self.frontends_by_id.remove(&id);
        }
    }
}

/// A count as a metric value (counts here stay far below 2^52).
#[expect(clippy::cast_precision_loss, reason = "map entry counts stay far below 2^52")]
fn count(n: usize) -> f64 {
    n as f64
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
}

fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (bound, count) in h.cumulative() {
        let le = if bound.is_infinite() { "+Inf".to_owned() } else { bound.to_string() };
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {count}");
    }
    let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", h.sum, h.count);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_pending_changes() {
        let mut t = Telemetry::new(10, 10);
        let now = Instant::now();
        let timeout = Duration::from_mins(1);
        assert!(t.healthy(now, timeout), "nothing pending");
        t.queued(now);
        assert!(t.healthy(now + Duration::from_secs(59), timeout));
        assert!(!t.healthy(now + Duration::from_secs(61), timeout), "a change waited too long");
        t.pending_since = None; // applied
        assert!(t.healthy(now + Duration::from_mins(2), timeout));
    }

    #[test]
    fn exposition_has_kube_proxy_names_and_values() {
        let mut t = Telemetry::new(100, 50);
        t.frontends = 3;
        t.service_entries = 25;
        t.sync_duration.observe(0.003);
        let text = t.prometheus();
        assert!(text.contains("ebpf_proxy_frontends 3\n"), "{text}");
        assert!(text.contains("ebpf_proxy_map_fill_ratio{map=\"SERVICES\"} 0.25\n"), "{text}");
        assert!(text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.004\"} 1\n"), "{text}");
        assert!(text.contains("kubeproxy_sync_proxy_rules_duration_seconds_count 1\n"), "{text}");
        assert!(text.contains("# TYPE kubeproxy_network_programming_duration_seconds histogram\n"), "{text}");
    }
}
