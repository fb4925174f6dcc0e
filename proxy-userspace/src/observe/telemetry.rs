//! What the health and metrics endpoints read: the agent writes it after
//! each sync; `Collector` turns it into ebpf-proxy's own metrics at each
//! scrape (kube-proxy's, updated as things happen, are in `metrics`).
use proxy_common::RevNatId;
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use proxy_common::map_names::{BACKENDS, MAGLEV, REVNAT, SERVICE_NAMES, SERVICES, SOURCE_RANGES};

use crate::{
    datapath::counters::{ConnCounters, ExternalStats},
    model::{FrontendKey, ServicePort},
    observe::health::ProxyHealth,
    pipeline::Stats,
    source::kube::WatchCounters,
};

/// What the agent knows after each sync, for the health and metrics endpoints.
#[derive(Debug)]
pub struct Telemetry {
    pub(crate) stats: Stats,
    /// What `/healthz` and `/livez` answer from.
    pub(crate) health: ProxyHealth,
    pub(crate) frontends: usize,
    pub(crate) backends: usize,
    pub(crate) service_entries: usize,
    /// Sizes of the maps in use (they grow with the table).
    pub(crate) services_map_size: u32,
    pub(crate) backends_map_size: u32,
    /// Writes a full map refused, per map name, since start.
    pub(crate) map_full: BTreeMap<&'static str, u64>,
    /// The kernel's per-frontend connection counters (once loaded).
    pub counters: Option<ConnCounters>,
    /// What the TC programs did with traffic from outside (once loaded).
    pub(crate) external_stats: Option<ExternalStats>,
    pub(crate) maglev_tables: usize,
    pub(crate) health_check_ports: usize,
    /// Devices the TC programs are attached to.
    pub(crate) devices: usize,
    /// Pod-facing devices the per-packet programs are attached to.
    pub(crate) pod_devices: usize,
    /// The counters' labels by rev-NAT id, written out at a scrape.
    pub(crate) labels: FrontendLabels,
    /// Active connections per backend (once loaded).
    pub(crate) active: Option<crate::datapath::active::ActiveSeries>,
    /// The Kubernetes watches' counters (kube mode only).
    pub(crate) watch: Option<Arc<WatchCounters>>,
}

pub(crate) type Shared = Arc<Mutex<Telemetry>>;

impl Telemetry {
    /// Empty telemetry for maps of these sizes.
    #[must_use]
    pub fn new(services_map_size: u32, backends_map_size: u32) -> Self {
        Self {
            stats: Stats::default(),
            health: ProxyHealth::default(),
            frontends: 0,
            backends: 0,
            service_entries: 0,
            services_map_size,
            backends_map_size,
            map_full: BTreeMap::new(),
            counters: None,
            external_stats: None,
            maglev_tables: 0,
            health_check_ports: 0,
            devices: 0,
            pod_devices: 0,
            labels: FrontendLabels::default(),
            active: None,
            watch: None,
        }
    }

    /// Takes the whole table's frontends after a sync (`(id, frontend,
    /// service port)`); zeroes the counter of an id that now names another
    /// frontend than before (ids are reused).
    pub fn set_frontends(&mut self, ids: impl IntoIterator<Item = (RevNatId, FrontendKey, ServicePort)>) {
        let mut labels = FrontendLabels::default();
        let mut reset = Vec::new();
        for (id, frontend, service) in ids {
            if self.labels.held(id, &frontend, &service).is_none() {
                reset.push(id);
            }
            labels.insert(id, service, frontend);
        }
        self.reset_counters(&reset);
        self.labels = labels;
    }

    /// Frontend `frontend`, of rev-NAT id `id` (0: none), now has `service`
    /// as its label (`None`: it is gone); a counter that passes to a new
    /// frontend starts from zero. A frontend keeps its id while it exists
    /// (`crate::reconcile`), so a gone one's id says where its labels are.
    pub fn set_frontend(&mut self, frontend: FrontendKey, id: RevNatId, service: Option<&ServicePort>) {
        if id == 0 {
            return;
        }
        let Some(service) = service else {
            self.labels.remove(id, &frontend);
            return;
        };
        if let Some(held) = self.labels.held(id, &frontend, service) {
            // The same labels: hold the model's strings, not a second
            // copy of them.
            held.adopt(service);
            return;
        }
        self.reset_counters(&[id]);
        self.labels.insert(id, service.clone(), frontend);
    }

    /// Zeroes the counters of `ids`, unless none was ever handed out since
    /// the counters were made (all zero already: a fresh start's 100,000).
    fn reset_counters(&mut self, ids: &[RevNatId]) {
        let Some(counters) = self.counters.as_mut() else { return };
        if counters.take_zeroed() || ids.is_empty() {
            return;
        }
        if let Err(err) = counters.reset_all(ids) {
            tracing::warn!(frontends = ids.len(), %err, "cannot reset the connection counters of new frontends");
        }
    }
}

/// The labels of the per-frontend counters, by rev-NAT id. Ids are handed
/// out lowest first (`datapath::ids`), so a `Vec` indexed by id is as long
/// as the most frontends held at once, and cheaper than a tree.
#[derive(Debug, Default)]
pub(crate) struct FrontendLabels {
    by_id: Vec<Option<(ServicePort, FrontendKey)>>,
    len: usize,
}

impl FrontendLabels {
    /// Frontends labelled.
    #[must_use]
    pub(crate) const fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    #[must_use]
    pub(crate) const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `(id, service port, frontend)`, lowest id first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (RevNatId, &ServicePort, &FrontendKey)> {
        self.by_id.iter().enumerate().filter_map(|(id, l)| {
            let (service, frontend) = l.as_ref()?;
            Some((RevNatId::try_from(id).expect("ids are rev-NAT ids"), service, frontend))
        })
    }

    /// The held service port of `id` when its labels are these.
    fn held(&mut self, id: RevNatId, frontend: &FrontendKey, service: &ServicePort) -> Option<&mut ServicePort> {
        let (s, f) = self.by_id.get_mut(usize::try_from(id).ok()?)?.as_mut()?;
        (f == frontend && s == service).then_some(s)
    }

    fn insert(&mut self, id: RevNatId, service: ServicePort, frontend: FrontendKey) {
        let at = usize::try_from(id).expect("rev-NAT ids fit in usize");
        if self.by_id.len() <= at {
            self.by_id.resize_with(at + 1, || None);
        }
        if self.by_id[at].replace((service, frontend)).is_none() {
            self.len += 1;
        }
    }

    /// Forgets `id` when it labels `frontend` (not when it passed to
    /// another since).
    fn remove(&mut self, id: RevNatId, frontend: &FrontendKey) {
        let Some(slot) = usize::try_from(id).ok().and_then(|at| self.by_id.get_mut(at)) else { return };
        if slot.as_ref().is_some_and(|(_, f)| f == frontend) {
            *slot = None;
            self.len -= 1;
        }
    }
}

/// The counters read from kernel maps, named here so the metrics reference
/// (`crate::reference`) lists them without a kernel: `(name, help)`.
pub(crate) const EXTERNAL_PACKETS: (&str, &str) = (
    "ebpf_proxy_external_packets",
    "Traffic from outside the node: new flows translated, packets dropped by reason, and packets left to the kernel (taking over from kube-proxy), counted in the kernel",
);
pub(crate) const POD_PACKETS: (&str, &str) = (
    "ebpf_proxy_pod_packets",
    "The pods' own traffic to services translated per packet on pod-facing devices (--socket-lb host-namespace, VMs, meshes): new flows translated, packets dropped by reason, counted in the kernel",
);
pub(crate) const SERVICE_SERIES_OMITTED: (&str, &str) = (
    "ebpf_proxy_service_series_omitted",
    "Frontends whose ebpf_proxy_service_connections_total is not exported (past --max-service-series)",
);
pub(crate) const SERVICE_CONNECTIONS: (&str, &str) = (
    "ebpf_proxy_service_connections",
    "New connections (and first datagrams of unconnected UDP sockets) per frontend, counted in the kernel",
);

/// Encodes `Telemetry` at each scrape.
#[derive(Debug)]
pub(crate) struct Collector {
    pub(crate) telemetry: Shared,
    /// Per-frontend connection series exported at most (0: none).
    pub(crate) max_service_series: usize,
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut out: DescriptorEncoder) -> std::fmt::Result {
        let t = self.telemetry.lock().expect("telemetry lock");
        gauge(&mut out, "ebpf_proxy_frontends", "Frontends in the maps", count(t.frontends))?;
        gauge(&mut out, "ebpf_proxy_backends", "Backends in the maps", count(t.backends))?;
        counter(
            &mut out,
            "ebpf_proxy_objects_rejected",
            "Objects of the source that could not be parsed",
            t.stats.objects_rejected,
        )?;
        counter(
            &mut out,
            "ebpf_proxy_model_problems",
            "Problems found in Services and EndpointSlices (each counted once)",
            t.stats.problems,
        )?;
        counter(
            &mut out,
            "ebpf_proxy_map_write_failures",
            "Map writes that failed (and were retried)",
            t.stats.map_write_failures,
        )?;
        t.map_fill(&mut out)?;
        t.map_sizes(&mut out)?;
        t.external_metrics(&mut out)?;
        if let Some(watch) = &t.watch {
            use std::sync::atomic::Ordering::Relaxed;
            counter(
                &mut out,
                "ebpf_proxy_watch_events",
                "Events received from the Kubernetes API",
                watch.events.load(Relaxed),
            )?;
            counter(
                &mut out,
                "ebpf_proxy_watch_errors",
                "Watch failures (each retried with backoff)",
                watch.errors.load(Relaxed),
            )?;
            counter(
                &mut out,
                "ebpf_proxy_watch_relists",
                "Full relists after a watch position expired (410 Gone)",
                watch.relists.load(Relaxed),
            )?;
            let bytes = &watch.bytes;
            let mut m = out.encode_descriptor(
                "ebpf_proxy_api_received_bytes",
                "Bytes of the API server's Service and EndpointSlice list and watch bodies, by request and encoding",
                None,
                MetricType::Counter,
            )?;
            for (request, encoding, n) in [
                ("list", "protobuf", &bytes.list_protobuf),
                ("list", "json", &bytes.list_json),
                ("watch", "protobuf", &bytes.watch_protobuf),
                ("watch", "json", &bytes.watch_json),
            ] {
                ConstCounter::new(n.load(Relaxed))
                    .encode(m.encode_family(&[("request", request), ("encoding", encoding)])?)?;
            }
        }
        t.connections(&mut out, self.max_service_series)?;
        t.active_connections(&mut out, self.max_service_series)
    }
}

impl Telemetry {
    /// How full the maps the agent writes are.
    fn map_fill(&self, out: &mut DescriptorEncoder) -> std::fmt::Result {
        let ratio = |used: usize, size: u32| if size == 0 { 0.0 } else { count(used) / f64::from(size) };
        let fill = [
            ("SERVICES", ratio(self.service_entries, self.services_map_size)),
            ("BACKENDS", ratio(self.backends, self.backends_map_size)),
            ("MAGLEV", ratio(self.maglev_tables, proxy_common::map_sizes::MAGLEV)),
        ];
        let mut m = out.encode_descriptor(
            "ebpf_proxy_map_fill_ratio",
            "Entries used over the map's size",
            None,
            MetricType::Gauge,
        )?;
        for (map, value) in fill {
            ConstGauge::new(value).encode(m.encode_family(&[("map", map)])?)?;
        }
        Ok(())
    }

    /// The sized maps' sizes, and the writes refused because a map was full
    /// (at its bound, the size flag: raise it).
    fn map_sizes(&self, out: &mut DescriptorEncoder) -> std::fmt::Result {
        let sizes = [(SERVICES, self.services_map_size), (BACKENDS, self.backends_map_size)];
        let mut m = out.encode_descriptor(
            "ebpf_proxy_map_size",
            "Entries the map can hold (grown with the table up to --services-map-size / --backends-map-size)",
            None,
            MetricType::Gauge,
        )?;
        for (map, size) in sizes {
            ConstGauge::new(f64::from(size)).encode(m.encode_family(&[("map", map)])?)?;
        }
        let mut m = out.encode_descriptor(
            "ebpf_proxy_map_full",
            "Map writes refused because the map was full (each retried; raise the map's size flag)",
            None,
            MetricType::Counter,
        )?;
        for map in [SERVICES, BACKENDS, REVNAT, MAGLEV, SOURCE_RANGES, SERVICE_NAMES] {
            let n = self.map_full.get(map).copied().unwrap_or(0);
            ConstCounter::new(n).encode(m.encode_family(&[("map", map)])?)?;
        }
        Ok(())
    }

    /// Metrics of traffic from outside the node (the TC programs).
    fn external_metrics(&self, out: &mut DescriptorEncoder) -> std::fmt::Result {
        gauge(out, "ebpf_proxy_maglev_tables", "Maglev tables in the kernel", count(self.maglev_tables))?;
        gauge(
            out,
            "ebpf_proxy_health_check_node_ports",
            "healthCheckNodePorts served (LoadBalancer services with externalTrafficPolicy: Local)",
            count(self.health_check_ports),
        )?;
        gauge(out, "ebpf_proxy_devices", "Devices the TC programs serve traffic from outside on", count(self.devices))?;
        gauge(
            out,
            "ebpf_proxy_pod_devices",
            "Pod-facing devices the per-packet programs serve the pods' own traffic on",
            count(self.pod_devices),
        )?;
        if let Some(Ok(stats)) = self.external_stats.as_ref().map(ExternalStats::read) {
            let (name, help) = EXTERNAL_PACKETS;
            let mut m = out.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (result, n) in stats {
                ConstCounter::new(n).encode(m.encode_family(&[("result", result)])?)?;
            }
        }
        if let Some(Ok(stats)) = self.external_stats.as_ref().map(ExternalStats::read_pods) {
            let (name, help) = POD_PACKETS;
            let mut m = out.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (result, n) in stats {
                ConstCounter::new(n).encode(m.encode_family(&[("result", result)])?)?;
            }
        }
        Ok(())
    }

    /// The kernel's per-frontend connection counters, for the first
    /// `max_series` frontends by id; how many were left out.
    fn connections(&self, out: &mut DescriptorEncoder, max_series: usize) -> std::fmt::Result {
        let Some(counters) = &self.counters else { return Ok(()) };
        let omitted = self.labels.len().saturating_sub(max_series);
        let (name, help) = SERVICE_SERIES_OMITTED;
        gauge(out, name, help, count(omitted))?;
        if max_series == 0 {
            return Ok(());
        }
        let (name, help) = SERVICE_CONNECTIONS;
        let mut m = out.encode_descriptor(name, help, None, MetricType::Counter)?;
        let shown: Vec<_> = self.labels.iter().take(max_series).collect();
        let ids: Vec<RevNatId> = shown.iter().map(|(id, _, _)| *id).collect();
        for ((_, service, frontend), n) in shown.iter().zip(counters.read_all(&ids)) {
            if let Some(n) = n {
                let (service, frontend) = (service.to_string(), frontend.to_string());
                let labels = [("service", service.as_str()), ("frontend", frontend.as_str())];
                ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

impl Telemetry {
    /// Active connections of the backends with the lowest ids, at most
    /// `max_series` (the bound of the per-frontend series); how many were
    /// left out.
    fn active_connections(&self, out: &mut DescriptorEncoder, max_series: usize) -> std::fmt::Result {
        let Some(active) = &self.active else { return Ok(()) };
        gauge(
            out,
            "ebpf_proxy_backend_series_omitted",
            "Backends whose ebpf_proxy_backend_active_connections is not exported (past --max-service-series)",
            count(self.backends.saturating_sub(max_series)),
        )?;
        if max_series == 0 {
            return Ok(());
        }
        let mut m = out.encode_descriptor(
            "ebpf_proxy_backend_active_connections",
            "Active connections per backend, counted in the kernel: sockets on this node translated to it and still open, and flows from outside it serves (docs/design.md, Balancing by load)",
            None,
            MetricType::Gauge,
        )?;
        for (backend, n) in active.series(max_series, self.backends) {
            let labels = [("backend", backend.as_str())];
            ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// A count as a metric value (counts here stay far below 2^52).
#[expect(clippy::cast_precision_loss, reason = "map entry counts stay far below 2^52")]
fn count(n: usize) -> f64 {
    n as f64
}

fn counter(out: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    let c = ConstCounter::new(value);
    c.encode(out.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(out: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> std::fmt::Result {
    let g = ConstGauge::new(value);
    g.encode(out.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::{FrontendKey, Protocol, ServicePort},
        observe::metrics::Metrics,
    };

    fn frontend(last: u8) -> FrontendKey {
        FrontendKey::new(std::net::IpAddr::from([10, 96, 0, last]), 80, Protocol::Tcp)
    }

    fn labelled(t: &Telemetry) -> Vec<(RevNatId, String, String)> {
        t.labels.iter().map(|(id, s, f)| (id, s.to_string(), f.to_string())).collect()
    }

    #[test]
    fn labels_follow_the_frontends_by_id() {
        let (web, dns) = (ServicePort::new("default", "web", "http"), ServicePort::new("kube-system", "dns", "dns"));
        let mut t = Telemetry::new(100, 50);
        t.set_frontends([(7, frontend(7), dns.clone()), (2, frontend(2), web.clone())]);
        let want = |ids: &[(RevNatId, &ServicePort, u8)]| -> Vec<(RevNatId, String, String)> {
            ids.iter().map(|(id, s, f)| (*id, s.to_string(), frontend(*f).to_string())).collect()
        };
        assert_eq!(labelled(&t), want(&[(2, &web, 2), (7, &dns, 7)]));
        assert_eq!(t.labels.len(), 2);
        // A gone frontend's labels go by its id...
        t.set_frontend(frontend(2), 2, None);
        assert_eq!(labelled(&t), want(&[(7, &dns, 7)]));
        // ...but not once its id names another frontend.
        t.set_frontend(frontend(9), 7, Some(&web));
        t.set_frontend(frontend(7), 7, None);
        assert_eq!(labelled(&t), want(&[(7, &web, 9)]));
        // A frontend with no id (its write failed) is not labelled.
        t.set_frontend(frontend(3), 0, Some(&web));
        assert_eq!(t.labels.len(), 1);
        // The whole table again: what it lacks goes.
        t.set_frontends([(1, frontend(1), dns.clone())]);
        assert_eq!(labelled(&t), want(&[(1, &dns, 1)]));
        assert_eq!(t.labels.len(), 1);
        t.set_frontends([]);
        assert!(t.labels.is_empty());
    }

    #[test]
    fn same_labels_hold_the_models_strings() {
        let mut t = Telemetry::new(100, 50);
        t.set_frontends([(1, frontend(1), ServicePort::new("default", "web", "http"))]);
        let model = ServicePort::new("default", "web", "http");
        t.set_frontend(frontend(1), 1, Some(&model));
        let (_, held, _) = t.labels.iter().next().unwrap();
        assert!(held.shares(&model));
    }

    #[test]
    fn own_metrics_from_the_snapshot() {
        let telemetry = Arc::new(Mutex::new(Telemetry::new(100, 50)));
        {
            let mut t = telemetry.lock().unwrap();
            t.frontends = 3;
            t.service_entries = 25;
        }
        let text = Metrics::new(telemetry, 10).encode();
        assert!(text.contains("ebpf_proxy_frontends 3.0\n"), "{text}");
        assert!(text.contains("ebpf_proxy_map_size{map=\"BACKENDS\"} 50.0\n"), "{text}");
        assert!(text.contains("ebpf_proxy_map_full_total{map=\"SERVICES\"} 0\n"), "{text}");
        assert!(text.contains("ebpf_proxy_map_fill_ratio{map=\"SERVICES\"} 0.25\n"), "{text}");
        assert!(
            text.contains("# TYPE ebpf_proxy_objects_rejected counter\nebpf_proxy_objects_rejected_total 0\n"),
            "{text}"
        );
    }
}
