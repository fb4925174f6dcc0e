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
    metrics::Histogram,
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
/// Syncs start at most this often unless configured (`AgentConfig::
/// min_sync_period`): a change after a quiet spell is applied at once, and
/// the changes of a burst are gathered into one sync per interval
/// (kube-proxy's minSyncPeriod, on the leading edge).
pub const DEFAULT_MIN_SYNC_PERIOD: Duration = Duration::from_millis(20);
/// Backoff between retries of failed map writes.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Where the Services and EndpointSlices come from.
#[derive(Debug, Clone)]
pub enum SourceConfig {
    /// A services file, re-read when it changes.
    File(PathBuf),
    /// The Kubernetes API.
    Kube(crate::source::kube::ClientOptions),
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
    /// Syncs start at most this often (kube-proxy's minSyncPeriod).
    pub min_sync_period: Duration,
    /// Every this often, the maps are read back from the kernel and the
    /// whole table compared with them, so an entry changed by anyone else
    /// is put right (kube-proxy's syncPeriod); `None`: never.
    pub sync_period: Option<Duration>,
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

/// Counters and measurements since start.
#[derive(Debug, Clone)]
pub struct Stats {
    pub objects_rejected: u64,
    pub problems: u64,
    pub map_write_failures: u64,
    /// From an EndpointSlice's last-change-trigger-time to its map write.
    pub network_programming: Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            objects_rejected: 0,
            problems: 0,
            map_write_failures: 0,
            network_programming: Histogram::network_programming(),
        }
    }
}

enum Source {
    File(FileSource),
    Kube(Box<KubeSource>, kube::Client, crate::source::kube::ApiEndpoint),
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
            Self::Kube(k, ..) => k.changed().await,
        }
    }

    /// Waits, if the last sync ended less than `min_sync_period` ago, for
    /// the rest of that interval, so a burst of events becomes one sync;
    /// then takes in every change so far.
    async fn gather(&mut self, last_sync: Option<Instant>, min_sync_period: Duration) {
        if let Self::Kube(k, ..) = self {
            if let Some(wait) = last_sync.and_then(|at| min_sync_period.checked_sub(at.elapsed())) {
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
            Self::Kube(k, ..) => Some(k.snapshot()),
        }
    }

    /// Everything the source holds (when the node changed, every service
    /// is translated again).
    fn everything(&mut self, stats: &mut Stats) -> Option<(Snapshot, Vec<SystemTime>)> {
        match self {
            Self::File(_) => self.snapshot(stats),
            Self::Kube(k, ..) => Some(k.everything()),
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
#[expect(clippy::too_many_lines, reason = "the wiring of source, model, reconciler and observers, in order")]
pub async fn run(
    config: AgentConfig,
    applied: watch::Sender<Applied>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let telemetry: Shared =
        Arc::new(Mutex::new(Telemetry::new(config.load.services_map_size, config.load.backends_map_size)));
    // The first sync is a pending change until it is applied.
    telemetry.lock().expect("telemetry lock").queued(Instant::now());
    if let Some(addr) = config.health_bind {
        serve::health(addr, telemetry.clone(), config.health_timeout).await?;
    }
    if let Some(addr) = config.metrics_bind {
        serve::metrics(addr, telemetry.clone()).await?;
    }
    crate::fs::ensure_bpffs_dir(&config.load.pin_dir)?;
    crate::fs::check_cgroup2(&config.load.cgroup)?;
    let mut source = start_source(&config, &telemetry).await?;
    // Loaded (not attached, nothing written) while the lists arrive.
    let mut datapath = load_datapath(&config, &telemetry)?;
    if let Source::Kube(kube, _, endpoint) = &source {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            ready = wait_for_lists(kube, endpoint) => ready?,
        }
    }
    let mut health_checks = HealthCheckServers::new({
        let (telemetry, timeout) = (telemetry.clone(), config.health_timeout);
        Arc::new(move || telemetry.lock().expect("telemetry lock").healthy(Instant::now(), timeout))
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
    let mut resync_at = config.sync_period.map(|p| Instant::now() + p);
    loop {
        let retry_at = state.retry_at;
        let (changed, periodic) = tokio::select! {
            () = &mut shutdown => break,
            () = source.changed() => (true, false),
            () = sleep_until(retry_at) => (false, false),
            () = sleep_until(resync_at) => (false, true),
        };
        if periodic {
            resync_at = config.sync_period.map(|p| Instant::now() + p);
            reconciler = resync(&mut datapath)?;
        }
        // When the change reached the agent: the latency of this sync
        // counts from here.
        let noticed = Instant::now();
        telemetry.lock().expect("telemetry lock").queued(noticed);
        if changed {
            source.gather(state.last_sync, config.min_sync_period).await;
        }
        let mut triggers = Vec::new();
        // The frontend keys that changed; `None`: compare the whole table.
        let mut changed_keys: Option<BTreeSet<FrontendKey>> = None;
        if changed {
            let Some((snapshot, new_triggers)) = source.snapshot(&mut state.stats) else { continue };
            triggers = new_triggers;
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
            record_latency(&mut state.stats, &triggers);
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
        publish(&telemetry, &state, &report, &reconciler, took, health_checks.len(), changed_keys.is_none());
        applied.send_replace(snapshot);
    }
    info!(
        pin_dir = %config.load.pin_dir.display(),
        "stopping; the datapath stays in place (pinned links and maps) and the next start takes it over; `ebpf-proxy cleanup` removes it"
    );
    Ok(())
}

/// Waits for the initial lists; when they are slow to come, says why the
/// API server does not answer (see `source::bootstrap`).
async fn wait_for_lists(kube: &KubeSource, endpoint: &crate::source::kube::ApiEndpoint) -> anyhow::Result<()> {
    info!("waiting for the initial lists of Services and EndpointSlices before the first write");
    crate::source::bootstrap::explain_while_waiting(kube.wait_ready(), endpoint, crate::source::bootstrap::PROBE_AFTER)
        .await
}

/// kube-proxy's periodic full sync: the maps are read back from the kernel
/// (as on start) into a fresh reconciler, so the next sync, which compares
/// the whole table, rewrites whatever differs there.
fn resync(datapath: &mut Datapath) -> anyhow::Result<Reconciler> {
    let (reconciler, recovery) = Reconciler::recover(&mut datapath.maps)?;
    info!(
        frontends = recovery.frontends,
        backends = recovery.backends,
        stale_entries_removed = recovery.stale_entries_removed,
        "periodic sync: read the maps back; the whole table is compared with them"
    );
    Ok(reconciler)
}

/// The source the configuration names; a Kubernetes source starts its
/// watches (the initial lists arrive in the background).
async fn start_source(config: &AgentConfig, telemetry: &Shared) -> anyhow::Result<Source> {
    Ok(match &config.source {
        SourceConfig::File(path) => Source::File(FileSource { path: path.clone(), read_once: false, stamp: None }),
        SourceConfig::Kube(options) => {
            let (client, endpoint) = crate::source::kube::client(options).await?;
            let kube = KubeSource::start(&client, &config.node_name);
            telemetry.lock().expect("telemetry lock").watch = Some(kube.counters.clone());
            Source::Kube(Box::new(kube), client, endpoint)
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
    if let Source::Kube(_, client, _) = source {
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

/// Hands the sync's results to the health and metrics endpoints.
fn publish(
    telemetry: &Shared,
    state: &SyncState,
    report: &Report,
    reconciler: &Reconciler,
    took: Duration,
    health_check_ports: usize,
    whole_table: bool,
) {
    let mut t = telemetry.lock().expect("telemetry lock");
    t.stats = state.stats.clone();
    t.health_check_ports = health_check_ports;
    t.devices = state.devices.as_ref().map_or(0, Vec::len);
    t.sync_duration.observe(took.as_secs_f64());
    t.last_sync_wall = Some(SystemTime::now());
    // Applied, also when some writes failed: those are retried, counted and
    // logged; restarting the agent would not fix a full map.
    t.pending_since = None;
    t.frontends = reconciler.frontend_count();
    t.backends = reconciler.backend_count();
    t.service_entries = reconciler.service_entries();
    t.maglev_tables = reconciler.maglev_tables();
    for c in &report.changes {
        match c.kind {
            ChangeKind::Added | ChangeKind::Removed => t.service_changes += 1,
            ChangeKind::Updated => t.endpoint_changes += 1,
        }
    }
    if whole_table {
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

#[derive(Default)]
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
fn record_latency(stats: &mut Stats, triggers: &[SystemTime]) {
    let now = SystemTime::now();
    for t in triggers {
        let seconds = now.duration_since(*t).unwrap_or_default().as_secs_f64();
        stats.network_programming.observe(seconds);
        debug!(seconds, "network programming latency");
    }
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
