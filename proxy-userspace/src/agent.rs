//! The agent: load (or take over) the datapath, then keep the maps equal to
//! what the source says, applying only the difference.
use std::{
    borrow::Cow,
    collections::{BTreeSet, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::{
    datapath::{
        ChangeKind, Reconciler, Report,
        loader::{Datapath, LoadOptions},
        sock_destroy::{Removed, SocketDestroyer},
    },
    devices::{self, DeviceSelection},
    healthcheck::HealthCheckServers,
    metrics::Metrics,
    model::{Delta, FrontendKey, NodeContext, Protocol, ServiceInput, Severity, TableState},
    serve,
    source::{Objects, Snapshot, file, kube::KubeSource, stored_slice::StoredSlice},
    telemetry::{Shared, Telemetry},
};

/// How often the services file is checked for changes.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// A file change is read once the file has stayed the same this long, so a
/// file being written is not read half-way.
const SETTLE: Duration = Duration::from_millis(50);
/// Syncs start at most this often: a change after a quiet spell is applied
/// at once, and the changes of a burst are gathered into one sync per
/// interval (kube-proxy's minSyncPeriod, on the leading edge).
const COALESCE: Duration = Duration::from_millis(20);
/// Backoff between retries of failed map writes.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Where the Services and EndpointSlices come from.
#[derive(Debug, Clone)]
pub enum SourceConfig {
    /// A services file, re-read when it changes.
    File(PathBuf),
    /// The Kubernetes API (`None`: the usual client configuration).
    Kube { kubeconfig: Option<PathBuf> },
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub source: SourceConfig,
    pub node_name: String,
    pub load: LoadOptions,
    /// Network namespaces (files, or directories of them) whose sockets of
    /// removed backends are destroyed, besides the agent's own.
    pub socket_netns: Vec<PathBuf>,
    /// This node's addresses; empty: those of its Node object.
    pub node_ips: Vec<std::net::IpAddr>,
    /// kube-proxy's nodePortAddresses: only node addresses in these ranges
    /// serve NodePorts (empty: all).
    pub node_port_cidrs: Vec<ipnet::IpNet>,
    /// Where to serve /healthz and /livez (None: not served).
    pub health_bind: Option<std::net::SocketAddr>,
    /// Where to serve /metrics and /proxyMode (None: not served).
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// Health turns 503 when a change waits longer than this unapplied.
    pub health_timeout: Duration,
    /// Devices the TC programs attach to (traffic from outside).
    pub devices: DeviceSelection,
    /// Frontends whose connection counter is exported as its own series,
    /// at most (0: none).
    pub max_service_series: usize,
}

/// What the agent has applied: bumped after each sync that ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Number of syncs so far (the first is 1).
    pub generation: u64,
    pub frontends: usize,
    pub backends: usize,
    /// Writes that failed in the last sync (they are retried).
    pub failures: usize,
}

/// Counters since start.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub objects_rejected: u64,
    pub problems: u64,
    pub map_write_failures: u64,
}

enum Source {
    File(FileSource),
    Kube(Box<KubeSource>, kube::Client),
}

impl Source {
    fn name(&self) -> &'static str {
        match self {
            Self::File(_) => "file",
            Self::Kube(..) => "kubernetes",
        }
    }

    /// Resolves when there is something new to read.
    async fn changed(&mut self) {
        match self {
            Self::File(f) => f.changed().await,
            Self::Kube(k, _) => k.changed().await,
        }
    }

    /// Waits, if the last sync ended less than `COALESCE` ago, for the rest
    /// of that interval, so a burst of events becomes one sync; then takes
    /// in every change so far.
    async fn gather(&mut self, last_sync: Option<Instant>) {
        if let Self::Kube(k, _) = self {
            if let Some(wait) = last_sync.and_then(|at| COALESCE.checked_sub(at.elapsed())) {
                tokio::time::sleep(wait).await;
            }
            k.absorb_pending();
        }
    }

    /// What changed, and trigger times of the changes it carries; `None`
    /// when nothing usable could be read (keep what is applied).
    fn snapshot(&mut self, stats: &mut Stats) -> Option<(Snapshot, Vec<SystemTime>)> {
        match self {
            Self::File(f) => f.read(stats).map(|o| (Snapshot::from(o), Vec::new())),
            Self::Kube(k, _) => Some(k.snapshot()),
        }
    }

    /// Everything the source holds (when the node changed, every service
    /// is translated again).
    fn everything(&mut self, stats: &mut Stats) -> Option<(Snapshot, Vec<SystemTime>)> {
        match self {
            Self::File(_) => self.snapshot(stats),
            Self::Kube(k, _) => Some(k.everything()),
        }
    }
}

struct FileSource {
    path: PathBuf,
    read_once: bool,
    stamp: Option<file::Stamp>,
}

impl FileSource {
    async fn changed(&mut self) {
        let mut ticker = tokio::time::interval(POLL_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            ticker.tick().await;
            let stamp = file::stamp(&self.path);
            if self.read_once && stamp == self.stamp {
                continue;
            }
            tokio::time::sleep(SETTLE).await;
            if file::stamp(&self.path) != stamp {
                continue; // still being written
            }
            self.read_once = true;
            self.stamp = stamp;
            return;
        }
    }

    fn read(&self, stats: &mut Stats) -> Option<Objects> {
        let parsed = match file::load(&self.path) {
            Ok(parsed) => parsed,
            Err(err) => {
                error!(%err, "services file not applied");
                return None;
            }
        };
        for err in &parsed.errors {
            error!(document = err.document, object = %err.object, field = %err.field, "rejected object: {}", err.message);
        }
        stats.objects_rejected += parsed.errors.len() as u64;
        Some(parsed.objects)
    }
}

/// Runs until `shutdown` resolves. The datapath stays in place afterwards
/// (pinned links and maps), translating with the last table applied.
pub async fn run(
    config: AgentConfig,
    applied: watch::Sender<Applied>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let telemetry: Shared =
        Arc::new(Mutex::new(Telemetry::new(config.load.services_map_size, config.load.backends_map_size)));
    let metrics = Arc::new(Metrics::new(telemetry.clone(), config.max_service_series));
    // The first sync is a pending change until it is applied.
    telemetry.lock().expect("telemetry lock").health.queued(Instant::now());
    let _servers = start_servers(&config, &telemetry, &metrics);
    crate::fs::ensure_bpffs_dir(&config.load.pin_dir)?;
    crate::fs::check_cgroup2(&config.load.cgroup)?;
    let mut source = start_source(&config, &telemetry, &metrics).await?;
    // Loaded (not attached, nothing written) while the lists arrive.
    let mut datapath = load_datapath(&config, &telemetry)?;
    if let Source::Kube(kube, _) = &source {
        info!("waiting for the initial lists of Services and EndpointSlices before the first write");
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            ready = kube.wait_ready() => ready?,
        }
    }
    let mut health_checks = HealthCheckServers::new({
        let (telemetry, timeout) = (telemetry.clone(), config.health_timeout);
        Arc::new(move || telemetry.lock().expect("telemetry lock").health.healthy(Instant::now(), timeout))
    });
    let (mut reconciler, recovery) = Reconciler::recover(&mut datapath.maps)?;
    info!(
        frontends = recovery.frontends,
        backends = recovery.backends,
        stale_entries_removed = recovery.stale_entries_removed,
        "read the pinned maps"
    );
    let mut state = SyncState::default();
    let mut attached = false;
    let mut destroyer = SocketDestroyer::new(config.socket_netns.clone());
    loop {
        let retry_at = state.retry_at;
        let changed = tokio::select! {
            () = &mut shutdown => break,
            () = source.changed() => true,
            () = sleep_until(retry_at) => false,
        };
        // When the change reached the agent: the latency of this sync
        // counts from here.
        let noticed = Instant::now();
        telemetry.lock().expect("telemetry lock").health.queued(noticed);
        metrics.last_queued.set(unix_seconds(SystemTime::now()));
        if changed {
            source.gather(state.last_sync).await;
        }
        let mut triggers = Vec::new();
        // The frontend keys that changed; `None`: compare the whole table.
        let mut changed_keys: Option<BTreeSet<FrontendKey>> = None;
        if changed {
            let Some((snapshot, new_triggers)) = source.snapshot(&mut state.stats) else { continue };
            triggers = new_triggers;
            set_pending(&metrics, &snapshot);
            let Some(update) = take_in(&config, &mut source, snapshot, &mut state, &mut triggers) else { continue };
            if !update.full && !state.must_compare_all {
                changed_keys = Some(update.delta.keys);
            }
        }
        let Some(_) = state.node.as_ref() else { continue };
        let started = Instant::now();
        let read = started.duration_since(noticed);
        let table = state.model.table();
        let report = match &changed_keys {
            Some(keys) => reconciler.apply_changes(&mut datapath.maps, table, keys),
            None => reconciler.apply(&mut datapath.maps, table),
        };
        let took = started.elapsed();
        // The change is in the maps: its latency ends here.
        let latency = noticed.elapsed();
        log_report(&report, read, took);
        state.stats.map_write_failures += report.failures.len() as u64;
        state.schedule_retry(!report.failures.is_empty());
        // After a failed write the next sync compares the whole table.
        state.must_compare_all = !report.failures.is_empty();
        if report.failures.is_empty() {
            record_latency(&metrics, &triggers);
        }
        forget_removed_backends(&report, &mut datapath, &reconciler, &mut destroyer);
        if !attached {
            // Only now that the maps hold the table do the programs (and so
            // a new layout's maps) take over.
            datapath.attach()?;
            attached = true;
            announce_start(&source, &config.node_name, reconciler.frontend_count());
        }
        attach_devices(&config.devices, &mut datapath, &mut state);
        health_checks.update(&state.model.health_checks()).await;
        state.generation += 1;
        state.last_sync = Some(Instant::now());
        if changed_keys.is_none() {
            // After a whole-table sync (start, relist): its transient
            // memory goes back to the kernel.
            crate::memory::release_free_memory();
        }
        let snapshot = applied_snapshot(&source, &state, &report, &reconciler, latency);
        let sync = Sync { took, whole_table: changed_keys.is_none(), health_check_ports: health_checks.len() };
        publish(&telemetry, &metrics, &state, &report, &reconciler, &sync);
        applied.send_replace(snapshot);
    }
    info!(
        pin_dir = %config.load.pin_dir.display(),
        "stopping; the datapath stays in place (pinned links and maps) and the next start takes it over; `ebpf-proxy cleanup` removes it"
    );
    Ok(())
}

/// The health and metrics servers, bound in the background: a taken port
/// is retried, never fatal.
fn start_servers(config: &AgentConfig, telemetry: &Shared, metrics: &Arc<Metrics>) -> serve::Servers {
    let health =
        config.health_bind.map(|addr| serve::health(addr, telemetry.clone(), metrics.clone(), config.health_timeout));
    let metrics = config.metrics_bind.map(|addr| serve::metrics(addr, metrics.clone()));
    serve::Servers([health, metrics].into_iter().flatten().collect())
}

/// The source the configuration names; a Kubernetes source starts its
/// watches (the initial lists arrive in the background).
async fn start_source(config: &AgentConfig, telemetry: &Shared, metrics: &Arc<Metrics>) -> anyhow::Result<Source> {
    Ok(match &config.source {
        SourceConfig::File(path) => Source::File(FileSource { path: path.clone(), read_once: false, stamp: None }),
        SourceConfig::Kube { kubeconfig } => {
            let client = crate::source::kube::client(kubeconfig.as_deref(), Some(metrics)).await?;
            let kube = KubeSource::start(&client, &config.node_name);
            telemetry.lock().expect("telemetry lock").watch = Some(kube.counters.clone());
            Source::Kube(Box::new(kube), client)
        }
    })
}

/// Attaches the TC programs to the devices traffic from outside arrives
/// on, when they are not yet attached or the choice changed (the node's
/// addresses moved); a device that fails is logged, the others serve.
fn attach_devices(selection: &DeviceSelection, datapath: &mut Datapath, state: &mut SyncState) {
    let resolved = devices::resolve(selection, &state.node_ips);
    if state.devices.as_ref() == Some(&resolved.chosen) {
        return;
    }
    for (device, reason) in &resolved.skipped {
        warn!(%device, reason, "device left out: traffic from outside arriving there is not served");
    }
    if selection == &DeviceSelection::Auto && resolved.chosen.is_empty() {
        warn!(
            "no device holds this node's addresses or a default route: traffic from outside is not served (set --devices)"
        );
    }
    match datapath.attach_devices(&resolved.chosen) {
        Ok(results) => {
            for r in &results {
                if let Err(err) = &r.result {
                    error!(device = %r.device, %err, "cannot attach the TC programs: traffic from outside arriving there is not served");
                }
            }
            if datapath.serves_external_traffic() {
                if resolved.chosen.is_empty() {
                    info!("traffic from outside (NodePorts, LoadBalancer IPs, externalIPs) is not served: no devices");
                } else {
                    info!(devices = ?resolved.chosen, "serving traffic from outside (NodePorts, LoadBalancer IPs, externalIPs) on these devices");
                }
            }
            state.devices = Some(resolved.chosen);
        }
        Err(err) => error!(%err, "cannot attach the TC programs: traffic from outside is not served"),
    }
}

/// Records on the Node (kube mode) that translation has started.
fn announce_start(source: &Source, node_name: &str, frontends: usize) {
    if let Source::Kube(_, client) = source {
        let note = format!("ebpf-proxy translates {frontends} service frontends on this node");
        crate::source::kube::announce(client, node_name, "Starting", note);
    }
}

/// What a sync applied, logged in one line with `latency`, the time from
/// the change reaching the agent to its maps written.
fn applied_snapshot(
    source: &Source,
    state: &SyncState,
    report: &Report,
    reconciler: &Reconciler,
    latency: Duration,
) -> Applied {
    let snapshot = Applied {
        generation: state.generation,
        frontends: reconciler.frontend_count(),
        backends: reconciler.backend_count(),
        failures: report.failures.len(),
    };
    info!(
        source = source.name(),
        generation = snapshot.generation,
        frontends = snapshot.frontends,
        backends = snapshot.backends,
        writes = report.writes,
        failures = snapshot.failures,
        objects_rejected = state.stats.objects_rejected,
        latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
        "service table applied"
    );
    snapshot
}

/// Loads the datapath and hands its counters to the metrics endpoint.
fn load_datapath(config: &AgentConfig, telemetry: &Shared) -> anyhow::Result<Datapath> {
    let mut datapath = Datapath::load(&config.load)?;
    let mut t = telemetry.lock().expect("telemetry lock");
    t.counters = datapath.counters.take();
    t.external_stats = datapath.external_stats.take();
    Ok(datapath)
}

/// What one sync took and did, besides its report.
struct Sync {
    took: Duration,
    /// The whole table was compared (not only what changed).
    whole_table: bool,
    health_check_ports: usize,
}

/// Hands the sync's results to the health and metrics endpoints.
fn publish(
    telemetry: &Shared,
    metrics: &Metrics,
    state: &SyncState,
    report: &Report,
    reconciler: &Reconciler,
    sync: &Sync,
) {
    let seconds = sync.took.as_secs_f64();
    metrics.sync_duration.observe(seconds);
    if sync.whole_table {
        metrics.sync_full_duration.observe(seconds);
    } else {
        metrics.sync_partial_duration.observe(seconds);
    }
    let now = SystemTime::now();
    metrics.last_sync.set(unix_seconds(now));
    metrics.service_changes_pending.set(0);
    metrics.endpoint_changes_pending.set(0);
    for c in &report.changes {
        match c.kind {
            ChangeKind::Added | ChangeKind::Removed => metrics.service_changes.inc(),
            ChangeKind::Updated => metrics.endpoint_changes.inc(),
        };
    }
    let mut t = telemetry.lock().expect("telemetry lock");
    t.stats = state.stats.clone();
    t.health_check_ports = sync.health_check_ports;
    t.devices = state.devices.as_ref().map_or(0, Vec::len);
    // Applied, also when some writes failed: those are retried, counted and
    // logged; restarting the agent would not fix a full map.
    t.health.updated(now);
    t.health.node_eligible = state.node_eligible;
    t.frontends = reconciler.frontend_count();
    t.backends = reconciler.backend_count();
    t.service_entries = reconciler.service_entries();
    t.maglev_tables = reconciler.maglev_tables();
    if sync.whole_table {
        let ids = reconciler.frontend_ids().into_iter().map(|(id, key, service)| (id, service, key.to_string()));
        t.set_frontends(ids.collect());
    } else {
        for c in &report.changes {
            let now = reconciler.frontend_id(&c.frontend).map(|id| (id, c.service_port.clone()));
            t.set_frontend(c.frontend.to_string(), now);
        }
    }
}

/// This node's context for a translation: zone and addresses from its Node
/// object, addresses from `--node-ip` when given; changes are logged.
fn node_context(
    config: &AgentConfig,
    nodes: &[Arc<k8s_openapi::api::core::v1::Node>],
    state: &mut SyncState,
) -> NodeContext {
    let mut node = NodeContext::from_nodes(&config.node_name, nodes.iter().map(|n| &**n));
    let this_node = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(config.node_name.as_str()));
    let eligible = this_node.is_none_or(|n| crate::health::node_eligible(n));
    if eligible != state.node_eligible {
        if eligible {
            info!(node = %config.node_name, "node eligible for traffic again: /healthz follows the proxy's health");
        } else {
            warn!(node = %config.node_name, "node is being deleted or tainted ToBeDeletedByClusterAutoscaler: /healthz answers 503 so load balancers drain it");
        }
        state.node_eligible = eligible;
    }
    if !config.node_ips.is_empty() {
        node = node.with_ips(config.node_ips.clone());
    }
    node.node_port_ips = crate::config::node_port_addresses(&node.node_ips, &config.node_port_cidrs);
    if node.node_ips != state.node_ips {
        info!(node = %config.node_name, addresses = ?node.node_ips, "node addresses (NodePorts, externalIPs)");
        state.node_ips.clone_from(&node.node_ips);
    }
    if node.zone != state.zone {
        info!(node = %config.node_name, zone = ?node.zone, "node zone (for topology hints)");
        state.zone.clone_from(&node.zone);
    }
    node
}

/// After a sync that removed backends: forget their sessions (affinity,
/// UDP socket memos) and destroy UDP sockets still connected to them.
fn forget_removed_backends(
    report: &Report,
    datapath: &mut Datapath,
    reconciler: &Reconciler,
    destroyer: &mut SocketDestroyer,
) {
    let removed: HashSet<Removed> = report
        .changes
        .iter()
        .flat_map(|c| c.removed.iter().map(|b| Removed { frontend: c.frontend, backend: (b.addr, b.port) }))
        .collect();
    if removed.is_empty() {
        return;
    }
    match datapath.sessions.purge(reconciler) {
        Ok(0) => {}
        Ok(n) => {
            info!(sessions = n, "forgot sessions (affinity, UDP sockets, UDP flows from outside) of removed backends");
        }
        Err(err) => warn!(%err, "cannot purge sessions of removed backends; they expire on their own"),
    }
    // Only UDP sockets are destroyed: a TCP backend leaving the endpoints
    // may still be draining its connections (a terminating pod), and
    // kube-proxy too clears only UDP state when an endpoint goes.
    let removed_udp: HashSet<Removed> = removed.into_iter().filter(|r| r.frontend.protocol == Protocol::Udp).collect();
    let sessions = &datapath.sessions;
    destroyer.destroy(&removed_udp, &|cookie, addr, port, proto| sessions.service_of(cookie, addr, port, proto));
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

struct SyncState {
    /// The desired table, kept service by service.
    model: TableState,
    /// The node the model was translated for (`None`: nothing read yet).
    node: Option<NodeContext>,
    /// The next sync compares the whole table, not only what changed.
    must_compare_all: bool,
    zone: Option<String>,
    node_ips: Vec<std::net::IpAddr>,
    /// The devices the TC programs are attached to (`None`: not yet).
    devices: Option<Vec<String>>,
    generation: u64,
    /// When the last sync ended.
    last_sync: Option<Instant>,
    retry_at: Option<Instant>,
    retry_delay: Option<Duration>,
    stats: Stats,
    /// This node's Node says it should get traffic (see `health`).
    node_eligible: bool,
}

impl Default for SyncState {
    fn default() -> Self {
        Self {
            model: TableState::default(),
            node: None,
            must_compare_all: false,
            zone: None,
            node_ips: Vec::new(),
            devices: None,
            generation: 0,
            last_sync: None,
            retry_at: None,
            retry_delay: None,
            stats: Stats::default(),
            node_eligible: true,
        }
    }
}

impl SyncState {
    fn schedule_retry(&mut self, failed: bool) {
        if failed {
            let delay = self.retry_delay.map_or(RETRY_MIN, |d| (d * 2).min(RETRY_MAX));
            self.retry_delay = Some(delay);
            self.retry_at = Some(Instant::now() + delay);
        } else {
            self.retry_delay = None;
            self.retry_at = None;
        }
    }
}

/// What reading a snapshot into the model changed.
struct Update {
    delta: Delta,
    /// Every service was translated (the first read, a relist, a new node
    /// context): the whole table is compared with the maps.
    full: bool,
}

/// Translates what changed into the model, logging (and counting) each
/// problem when it appears and when it goes away. A change of this node's
/// context (addresses, zone) translates every service again.
fn take_in(
    config: &AgentConfig,
    source: &mut Source,
    snapshot: Snapshot,
    state: &mut SyncState,
    triggers: &mut Vec<SystemTime>,
) -> Option<Update> {
    let update = match snapshot {
        Snapshot::Full { services, slices, nodes } => {
            let node = node_context(config, &nodes, state);
            // Each service's slices are expanded right before it is
            // translated, and dropped after.
            let slices = slices.iter().filter_map(|s| Some((s.owner()?.clone(), &**s)));
            let expand = |s: &StoredSlice| Cow::Owned(s.to_object());
            let delta = state.model.replace_all_with(services.iter().map(|s| &**s), slices, expand, &node);
            state.node = Some(node);
            Update { delta, full: true }
        }
        Snapshot::Changed { services, nodes } => {
            let current = state.node.clone()?;
            let node = match nodes {
                Some(nodes) => node_context(config, &nodes, state),
                None => current.clone(),
            };
            if node != current {
                let (everything, more) = source.everything(&mut state.stats)?;
                triggers.extend(more);
                return take_in(config, source, everything, state, triggers);
            }
            let inputs = services.iter().map(|c| {
                let input = ServiceInput {
                    service: c.service.as_deref(),
                    slices: c.slices.iter().map(|s| Cow::Owned(s.to_object())).collect(),
                };
                (c.id.clone(), input)
            });
            Update { delta: state.model.update(inputs, &node), full: false }
        }
    };
    log_problems(&update.delta, &mut state.stats);
    Some(update)
}

fn log_problems(delta: &Delta, stats: &mut Stats) {
    for p in &delta.appeared {
        stats.problems += 1;
        match p.severity {
            Severity::Error => error!(object = %p.object, field = %p.field, "{}", p.message),
            Severity::Warning => warn!(object = %p.object, field = %p.field, "{}", p.message),
        }
    }
    for p in &delta.resolved {
        info!(problem = %p, "resolved");
    }
    for (object, reason) in &delta.skipped {
        debug!(%object, reason = reason.as_str(), "service not proxied");
    }
}

/// Records, for each slice change just applied, the time from its trigger
/// to now.
fn record_latency(metrics: &Metrics, triggers: &[SystemTime]) {
    let now = SystemTime::now();
    for t in triggers {
        let seconds = now.duration_since(*t).unwrap_or_default().as_secs_f64();
        metrics.network_programming.observe(seconds);
        debug!(seconds, "network programming latency");
    }
}

/// Services and EndpointSlices read and not yet in the maps, until the
/// sync that writes them is published.
fn set_pending(metrics: &Metrics, snapshot: &Snapshot) {
    let (services, slices) = match snapshot {
        Snapshot::Full { services, slices, .. } => (services.len(), slices.len()),
        Snapshot::Changed { services, .. } => (services.len(), services.iter().map(|c| c.slices.len()).sum()),
    };
    metrics.service_changes_pending.set(i64::try_from(services).unwrap_or(i64::MAX));
    metrics.endpoint_changes_pending.set(i64::try_from(slices).unwrap_or(i64::MAX));
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// A sync that changes more frontends than this (a first start, a relist)
/// logs a summary at info and each change at debug.
const LOG_EACH_CHANGE_UP_TO: usize = 64;

/// Logs what a sync changed; `read` is the time spent reading and
/// translating, `took` the time spent writing the maps.
fn log_report(report: &Report, read: Duration, took: Duration) {
    let each_at_info = report.changes.len() <= LOG_EACH_CHANGE_UP_TO;
    for c in &report.changes {
        if !each_at_info && !tracing::enabled!(tracing::Level::DEBUG) {
            break;
        }
        let added: Vec<String> = c.added.iter().map(ToString::to_string).collect();
        let removed: Vec<String> = c.removed.iter().map(ToString::to_string).collect();
        let kind = match c.kind {
            ChangeKind::Added => "service frontend added",
            ChangeKind::Updated => "service frontend updated",
            ChangeKind::Removed => "service frontend removed",
        };
        if each_at_info {
            info!(service = %c.service_port, frontend = %c.frontend, backends = c.backends, ?added, ?removed, "{kind}");
        } else {
            debug!(service = %c.service_port, frontend = %c.frontend, backends = c.backends, ?added, ?removed, "{kind}");
        }
    }
    if !each_at_info {
        let count = |kind| report.changes.iter().filter(|c| c.kind == kind).count();
        info!(
            added = count(ChangeKind::Added),
            updated = count(ChangeKind::Updated),
            removed = count(ChangeKind::Removed),
            "service frontends changed (each change is logged at debug level; `ebpf-proxy service list` shows the table)"
        );
    }
    for f in &report.failures {
        error!(subject = %f.subject, error = %f.error, "map write failed; retrying with backoff, other services are unaffected");
    }
    debug!(writes = report.writes, read_us = read.as_micros(), write_us = took.as_micros(), "sync done");
}
