//! The agent: wiring only. It loads (or takes over) the datapath, then
//! runs the pipeline (`crate::pipeline`: source → model → reconciler) and
//! hands each sync's report to the observers (telemetry, session purge,
//! socket destroy, health checks, the TC devices). See docs/design.md.
use std::{
    collections::HashSet,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::{
    agent::pin_rollback::PinRollback,
    datapath::{
        active::ActiveSeries,
        loader::{Datapath, LoadOptions},
        sock_destroy::{Removed, SocketDestroyer},
    },
    model::Protocol,
    node::devices::{self, DeviceSelection},
    observe::{
        explain_socket,
        healthcheck::HealthCheckServers,
        metrics::Metrics,
        serve,
        telemetry::{Shared, Telemetry},
    },
    pipeline::{NodeSettings, Pipeline, Synced, Wake},
    reconcile::{ChangeKind, Reconciler, Report},
    source::{ChangeSource, file_source::FileSource, kube::KubeSource, reachability::Reachability},
};

/// Where the Services and EndpointSlices come from.
#[derive(Debug, Clone)]
pub(crate) enum SourceConfig {
    /// A services file, re-read when it changes.
    File(PathBuf),
    /// The Kubernetes API.
    Kube(crate::source::kube::ClientOptions),
}

/// Syncs start at most this often unless configured (`AgentConfig::
/// min_sync_period`).
pub(crate) mod pin_rollback;
pub mod resize;

pub(crate) use crate::source::kube::DEFAULT_MIN_SYNC_PERIOD;

#[derive(Debug, Clone)]
pub(crate) struct AgentConfig {
    pub(crate) source: SourceConfig,
    pub(crate) node_name: String,
    pub(crate) load: LoadOptions,
    /// Network namespaces (files, or directories of them) whose sockets of
    /// removed backends are destroyed, besides the agent's own.
    pub(crate) socket_netns: Vec<PathBuf>,
    /// This node's addresses; empty: those of its Node object.
    pub(crate) node_ips: Vec<std::net::IpAddr>,
    /// kube-proxy's nodePortAddresses: which of the node's local
    /// addresses serve NodePorts (followed as they change).
    pub(crate) node_port_addresses: crate::node::nodeport_addresses::NodePortAddresses,
    /// Where to serve /healthz and /livez (None: not served).
    pub(crate) health_bind: Option<std::net::SocketAddr>,
    /// Where to serve /metrics and /proxyMode (None: not served).
    pub(crate) metrics_bind: Option<std::net::SocketAddr>,
    /// Health turns 503 when a change waits longer than this unapplied.
    pub(crate) health_timeout: Duration,
    /// Devices the TC programs attach to (traffic from outside).
    pub(crate) devices: DeviceSelection,
    /// Devices the per-packet programs attach to (the pods' own traffic).
    pub(crate) pod_devices: crate::node::pod_devices::PodDeviceSelection,
    /// Frontends whose connection counter is exported as its own series,
    /// at most (0: none).
    pub(crate) max_service_series: usize,
    /// Syncs start at most this often (kube-proxy's minSyncPeriod).
    pub(crate) min_sync_period: Duration,
    /// The drift audit's interval: every this often (and on SIGHUP), the
    /// maps are read back from the kernel and the whole table compared with
    /// them, so an entry changed by anyone else is put right and counted
    /// (kube-proxy's syncPeriod); `None`: only on SIGHUP.
    pub(crate) audit_interval: Option<Duration>,
    /// Clients on the node reach only this node's externalIPs through the
    /// service (`--external-ips-local-only`).
    pub(crate) external_ips_local_only: bool,
    /// Take over from kube-proxy's rules (`crate::takeover`): `Some`, with
    /// when the handover of traffic from outside ends (`None`: at the next
    /// start).
    #[allow(
        clippy::option_option,
        reason = "no takeover, or one whose handover ends at the next start or after a time"
    )]
    pub(crate) take_over_from_kube_proxy: Option<Option<Duration>>,
    /// Where `ebpf-proxy explain` asks for the reasons (`None`: not served).
    pub(crate) explain_socket: Option<PathBuf>,
    /// How services without the lb-algorithm annotation balance
    /// (`--lb-algorithm`).
    pub(crate) lb_algorithm: crate::model::LbAlgorithm,
    /// The NodePort range added to `ip_local_reserved_ports` at start when
    /// it overlaps the ephemeral ports (`None`: the sysctl is left alone).
    pub(crate) node_port_range: Option<crate::node::reserved_ports::PortRange>,
}

/// What the agent has applied: bumped after each sync that ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    /// Number of syncs so far (the first is 1).
    pub(crate) generation: u64,
    pub(crate) frontends: usize,
    pub(crate) backends: usize,
    /// Writes that failed in the last sync (they are retried).
    pub(crate) failures: usize,
}

/// Runs until `shutdown` resolves. The datapath stays in place afterwards
/// (pinned links and maps), translating with the last table applied.
pub(crate) async fn run(
    config: AgentConfig,
    applied: watch::Sender<Applied>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let telemetry: Shared =
        Arc::new(Mutex::new(Telemetry::new(config.load.services_map_size, config.load.backends_map_size)));
    let metrics = Arc::new(Metrics::new(telemetry.clone(), config.max_service_series));
    // The first sync is a pending change until it is applied.
    telemetry.lock().expect("telemetry lock").health.queued(Instant::now());
    let _servers = start_servers(&config, &telemetry, &metrics);
    crate::node::fs::ensure_bpffs_dir(&config.load.pin_dir)?;
    crate::node::fs::check_cgroup2(&config.load.cgroup)?;
    if let Some(range) = config.node_port_range {
        reserve_node_ports(range, &config.load.pin_dir);
    }
    let telemetries = Telemetries { telemetry, metrics };
    match &config.source {
        SourceConfig::File(path) => {
            let metrics = telemetries.metrics.clone();
            let source = FileSource::new(path.clone())
                .with_rejections(Arc::new(move |rejection| metrics.file_rejected(rejection.as_str())));
            run_with(source, &config, &telemetries, applied, shutdown).await
        }
        SourceConfig::Kube(options) => {
            let reachability = Arc::new(Reachability::default());
            let requests =
                vec![reachability.observer(), crate::observe::rest_metrics::observer(telemetries.metrics.clone())];
            let (client, endpoint) = crate::source::kube::client(options, requests).await?;
            let kube = KubeSource::start(&client, endpoint, &config.node_name, reachability, options.content_type)
                .with_min_sync_period(config.min_sync_period);
            telemetries.telemetry.lock().expect("telemetry lock").watch = Some(kube.counters.clone());
            run_with(kube, &config, &telemetries, applied, shutdown).await
        }
    }
}

/// Keeps the NodePort range out of the ephemeral ports (`--node-port-range`;
/// `crate::node::port_reservation`): a failure is a warning, the agent
/// serves anyway (the programs still pass the replies to the node's own
/// connections they see to its sockets).
fn reserve_node_ports(range: crate::node::reserved_ports::PortRange, pin_dir: &std::path::Path) {
    use crate::node::port_reservation::{Reserved, reserve};
    match reserve(range, pin_dir) {
        Ok(Reserved::Changed { old, new }) => info!(
            node_ports = %range,
            old = %old,
            new = %new,
            "reserved the NodePort range in net.ipv4.ip_local_reserved_ports (it overlaps the ephemeral ports); `ebpf-proxy cleanup` takes it out again"
        ),
        Ok(Reserved::Unchanged { ephemeral, reserved }) => tracing::debug!(
            node_ports = %range,
            %ephemeral,
            reserved = %reserved,
            "net.ipv4.ip_local_reserved_ports left as it is: the NodePort range is reserved already or outside the ephemeral ports"
        ),
        Err(err) => warn!(
            node_ports = %range,
            %err,
            code = "ReservedPortsNotWritten",
            fix = "give the agent CAP_NET_ADMIN and a writable /proc/sys (or reserve the range yourself, or narrow net.ipv4.ip_local_port_range); --node-port-range none stops the attempt",
            "cannot reserve the NodePort range in net.ipv4.ip_local_reserved_ports: a connection the node opens may take a NodePort as its local port"
        ),
    }
}

/// Where the health and metrics endpoints read from.
struct Telemetries {
    telemetry: Shared,
    metrics: Arc<Metrics>,
}

/// The health and metrics servers, bound in the background: a taken port
/// is retried, never fatal.
fn start_servers(config: &AgentConfig, telemetry: &Shared, metrics: &Arc<Metrics>) -> serve::Servers {
    let health =
        config.health_bind.map(|addr| serve::health(addr, telemetry.clone(), metrics.clone(), config.health_timeout));
    let metrics = config.metrics_bind.map(|addr| serve::metrics(addr, metrics.clone()));
    serve::Servers([health, metrics].into_iter().flatten().collect())
}

/// The sync loop over `source`.
async fn run_with(
    mut source: impl ChangeSource,
    config: &AgentConfig,
    telemetries: &Telemetries,
    applied: watch::Sender<Applied>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    // A signal during the load and the read of the pinned maps (seconds
    // at 100,000 services) ends the run once they are done:
    // `cmd::run::shutdown_signal` installs its handlers when it is made.
    tokio::pin!(shutdown);
    let Telemetries { telemetry, metrics } = telemetries;
    // Decided before the load, which writes the programs' mode for traffic
    // from outside: a restart in the middle of a takeover never serves it
    // without kube-proxy's rules in between.
    let due = config.take_over_from_kube_proxy.and_then(|ends_after| takeover_due(ends_after, metrics));
    // Loaded (not attached, nothing written) and, after a restart, the
    // pinned maps read back while the lists arrive (the watches run on the
    // runtime's workers): on a big cluster the read-back takes about as
    // long as the lists.
    // Until the programs are attached (after the first write, which is when
    // they are verified on a fresh start), what this start pins is removed
    // when the run ends, by a failure or a stop: nothing uses it yet.
    let (mut datapath, mut pins) = load_datapath(config, due.is_some(), telemetry)?;
    let reconciler = read_back(&mut datapath.maps)?;
    tokio::select! {
        () = &mut shutdown => return Ok(()),
        ready = source.ready() => ready?,
    }
    settle_memory();
    // Subscribed before the first read, so no change in between is missed.
    let mut local_addrs = crate::node::local_addrs::Watch::start();
    let mut pod_links = crate::node::pod_devices::Watch::start();
    let settings = node_settings(config, &local_addrs);
    let mut pipeline = Pipeline::new(settings, reconciler).with_audit_interval(config.audit_interval);
    // SIGHUP: a drift audit now (installed once the maps are read, so an
    // early SIGHUP still ends the process, as its default).
    let mut takeover =
        due.map(|(takeover, ends_after)| crate::takeover::pending::Pending::start(takeover, ends_after, metrics));
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let (_explain_server, mut explain_requests) = explain_socket::start(config.explain_socket.as_deref());
    let mut observers = Observers::new(config, telemetry);
    let (mut sweep, mut ct_fill) = flow_sweep();
    // Whether the last sync wrote everything (for a takeover attempt when
    // the TC programs attach after it).
    let mut last_complete = false;
    loop {
        let wake = tokio::select! {
            () = &mut shutdown => break,
            // The TC programs' load, after the first sync wrote the maps and
            // the socket programs took over (`Observers::observe`).
            // (`serve_devices` joins the load thread, which has signalled.)
            () = datapath.programs_done(), if observers.devices_pending => {
                observers.serve_devices(config, &mut datapath, &pipeline).await?;
                take_over(&mut takeover, Some(last_complete), &pipeline, &mut datapath, metrics)?;
                continue;
            }
            // Only flows tracked per packet need it: none without a device.
            _ = sweep.tick(), if observers.tracks_flows() => {
                if let Some(full) = sweep_ended_flows(&datapath, &mut ct_fill, metrics) {
                    grow_ct_or_warn(full, (&mut datapath, &mut observers), &pipeline, config, telemetries);
                }
                continue;
            }
            wake = pipeline.wait(&mut source) => wake,
            () = sleep_until(takeover.as_ref().and_then(crate::takeover::pending::Pending::retry_at)) => {
                take_over(&mut takeover, None, &pipeline, &mut datapath, metrics)?;
                continue;
            }
            _ = hangup.recv() => {
                info!("SIGHUP received: auditing the maps for drift");
                Wake::Resync
            }
            asked = explain_requests.next() => {
                explain_socket::reply(asked, &source, pipeline.node());
                continue;
            }
            () = pod_links.changed() => {
                observers.links_changed(config, &mut datapath, &pipeline, telemetry);
                continue;
            }
            addrs = local_addrs.changed() => {
                if !pipeline.set_local_addresses(crate::node::local_addrs::ips(&addrs)) {
                    continue;
                }
                Wake::NodeAddresses
            }
        };
        note_queued(&source, telemetries);
        let Some(translated) = pipeline.translate(wake, &mut source, &mut datapath.maps).await else { continue };
        if !observers.attached {
            prepare_first_write(&mut datapath, &mut pipeline, config, telemetry)?;
        }
        let mut synced = pipeline.write(translated, &mut datapath.maps);
        resize(&mut datapath, &mut pipeline, &mut synced, &mut observers, config, telemetry)?;
        observers.observe(&synced, &pipeline, &mut datapath, config, &source).await?;
        if observers.attached {
            pins.keep();
        }
        publish_sync(telemetries, &applied, source.name(), (&pipeline, &synced), &observers, &datapath);
        // Traffic from outside is handed over from kube-proxy's rules only
        // to TC programs that are attached.
        last_complete = synced.report.failures.is_empty();
        let complete = last_complete && !observers.devices_pending;
        take_over(&mut takeover, Some(complete), &pipeline, &mut datapath, metrics)?;
        free_aside(synced);
    }
    info!(
        pin_dir = %config.load.pin_dir.display(),
        "stopping; the datapath stays in place (pinned links and maps) and the next start takes it over; `ebpf-proxy cleanup` removes it"
    );
    Ok(())
}

/// Hands back what the lists' churn freed (see `memory::JEMALLOC_CONF`).
fn settle_memory() {
    if let Err(error) = crate::observe::memory::settle() {
        warn!(%error, "freed memory stays resident a moment before it is returned");
    }
}

/// What the pipeline knows of this node: `config`'s settings and the
/// addresses `local_addrs` holds now.
fn node_settings(config: &AgentConfig, local_addrs: &crate::node::local_addrs::Watch) -> NodeSettings {
    NodeSettings {
        node_name: config.node_name.clone(),
        node_ips: config.node_ips.clone(),
        node_port_addresses: config.node_port_addresses.clone(),
        local_addrs: crate::node::local_addrs::ips(local_addrs.current()),
        external_ips_local_only: config.external_ips_local_only,
        lb_algorithm: config.lb_algorithm,
    }
}

/// The sweep of ended flows' interval, and the conntrack fill it counts.
fn flow_sweep() -> (tokio::time::Interval, crate::observe::ct_fill::CtFill) {
    let mut sweep = tokio::time::interval(crate::datapath::active::SWEEP_INTERVAL);
    // The CPUs the kernel's LRU keeps free entries for (1 when unreadable:
    // the mark is then at its highest).
    let cpus = crate::datapath::counters::possible_cpus().map_or(1, u64::from);
    let ct_fill = crate::observe::ct_fill::CtFill::new(cpus);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    (sweep, ct_fill)
}

/// Records that a sync was asked for, and the changes `source` holds.
fn note_queued(source: &impl ChangeSource, Telemetries { telemetry, metrics }: &Telemetries) {
    telemetry.lock().expect("telemetry lock").health.queued(Instant::now());
    metrics.last_queued.set(unix_seconds(SystemTime::now()));
    let (services, slices) = source.pending();
    metrics.service_changes_pending.set(i64::try_from(services).unwrap_or(i64::MAX));
    metrics.endpoint_changes_pending.set(i64::try_from(slices).unwrap_or(i64::MAX));
}

/// Before the first write: sizes the maps for the table and starts
/// loading the programs beside the write (attached after it).
fn prepare_first_write(
    datapath: &mut Datapath,
    pipeline: &mut Pipeline,
    config: &AgentConfig,
    telemetry: &Shared,
) -> anyhow::Result<()> {
    // Every write before the first attach is planned here, which
    // `resize::after_sync` counts on (it does not measure again).
    if crate::agent::resize::before_first_write(datapath, pipeline, &config.load)? {
        take_counters(datapath, telemetry);
    }
    datapath.start_loading_programs()?;
    Ok(())
}

/// Publishes what a sync did: the telemetry and metrics, the map sizes and
/// devices, and the snapshot `applied` hands the tests.
fn publish_sync(
    telemetries: &Telemetries,
    applied: &watch::Sender<Applied>,
    source_name: &str,
    (pipeline, synced): (&Pipeline, &Synced),
    observers: &Observers,
    datapath: &Datapath,
) {
    let snapshot = applied_snapshot(source_name, pipeline, synced);
    let devices = observers.devices.as_ref();
    publish(telemetries, pipeline, synced, observers.health_checks.len(), devices);
    let sizes = datapath.sizes();
    let mut t = telemetries.telemetry.lock().expect("telemetry lock");
    (t.services_map_size, t.backends_map_size) = (sizes.services, sizes.backends);
    t.pod_devices = observers.pod_devices.as_ref().map_or(0, Vec::len);
    drop(t);
    applied.send_replace(snapshot);
}

/// The reconciler of the maps the load found (read back after a restart);
/// what the read-back freed goes back to the kernel before the lists'
/// peak (`memory::purge`).
fn read_back(maps: &mut crate::datapath::maps::KernelMaps) -> anyhow::Result<Reconciler> {
    let (reconciler, recovery) = Reconciler::recover(maps)?;
    if let Err(error) = crate::observe::memory::purge() {
        warn!(%error, "freed memory stays resident a moment before it is returned");
    }
    info!(
        frontends = recovery.frontends,
        backends = recovery.backends,
        stale_entries_removed = recovery.stale_entries_removed,
        "read the pinned maps"
    );
    Ok(reconciler)
}

/// Takes back the active connections of flows from outside that ended
/// unseen (docs/design.md, "Balancing by load"); a failure is logged and
/// the next sweep tries again.
///
/// The sweep reads all of `CT`, so it also counts its entries
/// (`crate::observe::ct_fill`): exported, and the count when it just
/// passed the mark (`grow_ct_or_warn`).
fn sweep_ended_flows(
    datapath: &Datapath,
    fill: &mut crate::observe::ct_fill::CtFill,
    metrics: &Metrics,
) -> Option<NearlyFull> {
    let sweep = match datapath.sweep_ended_flows() {
        Ok(sweep) => sweep,
        Err(err) => {
            warn!(%err, "cannot take back the active connections of ended flows from outside");
            return None;
        }
    };
    if sweep.taken > 0 {
        tracing::debug!(taken = sweep.taken, "active connections of ended flows taken back");
    }
    let entries = u64::try_from(sweep.ct_entries).unwrap_or(u64::MAX);
    metrics.ct_entries.set(i64::try_from(entries).unwrap_or(i64::MAX));
    let capacity = match datapath.ct_capacity() {
        Ok(capacity) => capacity,
        Err(err) => {
            warn!(%err, "cannot read the size of the connection-tracking map");
            return None;
        }
    };
    metrics.ct_capacity.set(i64::from(capacity));
    match fill.observe(entries, u64::from(capacity)) {
        Some(crate::observe::ct_fill::Change::NearlyFull { percent, mark }) => {
            Some(NearlyFull { entries, capacity, percent, mark })
        }
        Some(crate::observe::ct_fill::Change::Relieved { percent }) => {
            info!(entries, capacity, percent, "the connection-tracking map (CT) is no longer nearly full");
            None
        }
        None => None,
    }
}

/// A count of `CT` that just passed its mark.
#[derive(Debug, Clone, Copy)]
struct NearlyFull {
    entries: u64,
    capacity: u32,
    percent: u64,
    mark: u64,
}

/// `CT` passed its mark: moved to one twice as big when it was sized from
/// the node's memory and may grow (`node::memory::grown`; docs/design.md,
/// "Growing `CT`"), the TC programs' links swapped in before the last
/// carry of flows; otherwise (or when the move fails, which leaves the
/// current maps running) the warning that says what to do.
fn grow_ct_or_warn(
    full: NearlyFull,
    (datapath, observers): (&mut Datapath, &mut Observers),
    pipeline: &Pipeline,
    config: &AgentConfig,
    Telemetries { telemetry, metrics }: &Telemetries,
) {
    let Some(to) = crate::node::memory::grown(full.capacity, config.load.ct_map_grows) else {
        let fix = if config.load.ct_map_grows { FIX_AT_MOST } else { FIX_EXPLICIT };
        warn_ct_nearly_full(full, fix, None);
        return;
    };
    let node_ips = pipeline.node().map(|n| n.node_ips.clone()).unwrap_or_default();
    let grown = crate::agent::resize::grow_ct(datapath, &config.load, to, |moved| {
        observers.attach_again(config, moved, &node_ips);
    });
    match grown {
        Ok(()) => {
            metrics.ct_growths.inc();
            metrics.ct_capacity.set(i64::from(to));
            take_counters(datapath, telemetry);
            info!(
                from = full.capacity,
                to,
                entries = full.entries,
                mark = full.mark,
                reason = "past the mark, where the kernel's LRU may evict a live flow's entry for a new one",
                "{CT_GROWN}"
            );
        }
        Err(err) => warn_ct_nearly_full(full, FIX_NOT_GROWN, Some(&err)),
    }
}

/// The message logged once, when `/healthz` may first say healthy: traffic
/// from outside is served on the devices there are (the TC programs
/// attached after a fresh start's first sync, or a previous agent's
/// serving after a restart; `crate::observe::health`). Worded for the
/// node without devices too, where it comes after "not served: no
/// devices".
pub const OUTSIDE_SERVED: &str = "the TC programs are attached: /healthz can report healthy";

/// The message logged when `CT` was moved to one twice as big (fields:
/// `from`, `to`, `entries`, `mark`, `reason`).
pub const CT_GROWN: &str = "conntrack map (CT) grown: its flows carried into one twice as big";

/// What to do about a nearly full `CT` of the size `--ct-map-size` set.
const FIX_EXPLICIT: &str = "raise --ct-map-size (config ctMapSize), or leave it unset to size the map from the node's memory and grow it; the agent moves the flows to the larger map at its next start";
/// ... sized from memory and grown as far as it grows on its own.
const FIX_AT_MOST: &str = "the map is at the most it grows to on its own: set a larger --ct-map-size (config ctMapSize); the agent moves the flows to the larger map at its next start";
/// ... whose move to one twice as big failed (`err`).
const FIX_NOT_GROWN: &str = "the move to a map twice as big failed and the agent goes on with this one (it tries again when the map fills up again): give the agent's cgroup the memory, or set --ct-map-size (config ctMapSize) and restart it";

/// The warning that `CT` is nearly full and stays as big, with `fix` (and
/// `err`, when a move to a bigger one failed).
fn warn_ct_nearly_full(
    NearlyFull { entries, capacity, percent, mark }: NearlyFull,
    fix: &str,
    err: Option<&crate::datapath::loader::LoadError>,
) {
    warn!(
        entries,
        capacity,
        percent,
        mark,
        err = err.map(tracing::field::display),
        code = "ConntrackNearlyFull",
        fix,
        "the connection-tracking map (CT) is nearly full: past the mark the kernel's LRU may evict the least recently used entry for each new flow, a live flow's too"
    );
}

/// Frees a sync's report; one of many changes (a relist that changed
/// every frontend, each listing backends, takes milliseconds to free) on
/// a thread of its own, so that the next change does not wait for it. (A
/// start's new frontends are one list of keys.)
fn free_aside(synced: Synced) {
    const LARGE: usize = 1024;
    if synced.report.changes.len() >= LARGE {
        // A thread that cannot start frees it here, as the closure drops.
        let _ = std::thread::Builder::new().name("free-report".into()).spawn(move || drop(synced));
    }
}

/// A takeover from kube-proxy is due when its rules are on the node: then
/// traffic from outside is left to them (`Defer`, written at the load)
/// until the maps hold the table. With no rule of kube-proxy's (a restart
/// after the takeover, or a node without it) nothing is deferred: the
/// programs serve traffic from outside from the start.
fn takeover_due(
    ends_after: Option<Duration>,
    metrics: &Metrics,
) -> Option<(crate::takeover::Takeover, Option<Duration>)> {
    let tools = crate::takeover::Tools::find();
    info!(iptables = ?tools.iptables.iter().map(|t| format!("{} {:?}", t.name, t.family)).collect::<Vec<_>>(), nft = tools.nft, "tools for reading kube-proxy's rules");
    let takeover = crate::takeover::Takeover::new(tools);
    match takeover.rules_present() {
        Ok(false) => {
            info!("--take-over-from-kube-proxy: no rule of kube-proxy's on this node, nothing to take over");
            metrics.takeover_differences.set(0);
            return None;
        }
        Ok(true) => {}
        // Unreadable now: taken as present (deferring costs nothing while
        // kube-proxy's rules serve); the attempts say what fails.
        Err(err) => warn!(%err, "cannot read kube-proxy's rules yet; deferring traffic from outside to them"),
    }
    Some((takeover, ends_after))
}

/// One takeover attempt when one is pending: after a sync (`complete`:
/// it wrote everything) or when the retry is due (`None`).
fn take_over(
    takeover: &mut Option<crate::takeover::pending::Pending>,
    complete: Option<bool>,
    pipeline: &Pipeline,
    datapath: &mut Datapath,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    if let Some(pending) = takeover.as_mut()
        && pending.attempt(complete, pipeline.model().table(), datapath, metrics)?
    {
        *takeover = None;
    }
    Ok(())
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Moves to maps of other sizes when the table needs it (see
/// `crate::agent::resize`): the sync's failures become those of writing the new
/// set, its frontends are all reported again (their ids are new), and the
/// new programs' counters and TC links take over.
fn resize(
    datapath: &mut Datapath,
    pipeline: &mut Pipeline,
    synced: &mut Synced,
    observers: &mut Observers,
    config: &AgentConfig,
    telemetry: &Shared,
) -> anyhow::Result<()> {
    let Some(written) = crate::agent::resize::after_sync(
        datapath,
        pipeline,
        &config.load,
        &synced.report,
        synced.whole_table,
        observers.attached,
    )?
    else {
        return Ok(());
    };
    synced.report.failures = written.failures;
    synced.report.writes += written.writes;
    synced.whole_table = true;
    // The new programs' TC links (the node's devices and the pod-facing
    // ones) are swapped in by `observe`.
    observers.devices = None;
    observers.pod_devices = None;
    take_counters(datapath, telemetry);
    Ok(())
}

/// Hands the counters of `datapath`'s programs to the metrics endpoint.
fn take_counters(datapath: &mut Datapath, telemetry: &Shared) {
    let mut t = telemetry.lock().expect("telemetry lock");
    t.counters = datapath.counters.take();
    t.external_stats = datapath.external_stats.take();
    let series = datapath.maps.backends_fd().and_then(|fd| ActiveSeries::new(datapath.active.clone(), fd));
    t.active = match series {
        Ok(series) => Some(series),
        Err(err) => {
            warn!(%err, "ebpf_proxy_backend_active_connections is not exported");
            None
        }
    };
}

/// What reacts to a sync, besides telemetry.
struct Observers {
    /// For /healthz: whether traffic from outside is served.
    telemetry: Shared,
    health_checks: HealthCheckServers,
    destroyer: SocketDestroyer,
    /// The devices the TC programs are attached to (`None`: not yet).
    devices: Option<Vec<String>>,
    /// The pod-facing devices the per-packet programs are attached to.
    pod_devices: Option<Vec<String>>,
    /// The programs took over (after the first sync).
    attached: bool,
    /// The first attach was onto a previous agent's maps (a restart): its
    /// TC programs serve traffic from outside until ours are attached.
    restarted: bool,
    /// The socket programs serve, and the TC programs are still being
    /// verified: the devices, pod-facing devices and health check servers
    /// follow when the load ends (`serve_devices`).
    devices_pending: bool,
}

impl Observers {
    /// Whether per-packet programs are attached anywhere (the node's
    /// devices or pod-facing ones), so `CT` holds flows.
    fn tracks_flows(&self) -> bool {
        let any = |d: &Option<Vec<String>>| d.as_ref().is_some_and(|d| !d.is_empty());
        any(&self.devices) || any(&self.pod_devices)
    }

    fn new(config: &AgentConfig, telemetry: &Shared) -> Self {
        Self {
            telemetry: telemetry.clone(),
            health_checks: HealthCheckServers::new({
                let (telemetry, timeout) = (telemetry.clone(), config.health_timeout);
                Arc::new(move || telemetry.lock().expect("telemetry lock").health.healthy(Instant::now(), timeout))
            }),
            destroyer: SocketDestroyer::new(config.socket_netns.clone()),
            devices: None,
            pod_devices: None,
            attached: false,
            restarted: false,
            devices_pending: false,
        }
    }

    async fn observe(
        &mut self,
        synced: &Synced,
        pipeline: &Pipeline,
        datapath: &mut Datapath,
        config: &AgentConfig,
        source: &impl ChangeSource,
    ) -> anyhow::Result<()> {
        forget_removed_backends(&synced.report, datapath, pipeline.reconciler(), &mut self.destroyer);
        let first = !self.attached;
        if first {
            self.restarted = datapath.previous_agents();
            // Only now that the maps hold the table do the programs (and so
            // a new layout's maps) take over. The socket programs only: the
            // TC programs may still be in the verifier (`devices_pending`).
            datapath.attach()?;
            self.attached = true;
            source.started(pipeline.reconciler().frontend_count());
        }
        // From the first attach until the load ends (a sync meanwhile does
        // not wait for it either): the TC programs found on the devices are
        // none (a fresh node) or a previous agent's on these same maps. A
        // later move to bigger maps swaps them at once, as its flows are
        // carried (`crate::agent::resize`).
        if (first || self.devices_pending) && !datapath.programs_finished() {
            if !self.devices_pending {
                info!(
                    "the socket programs serve; traffic from outside and the pods' per-packet path are served once the TC programs are verified and attached"
                );
            }
            if self.restarted {
                // A restart: the previous agent's TC programs serve traffic
                // from outside on these maps meanwhile, so a load
                // balancer's checks find their ports now, as before the
                // restart, not once the new programs are verified.
                self.health_checks.update(&pipeline.model().health_checks()).await;
                self.outside_served();
            }
            self.devices_pending = true;
            return Ok(());
        }
        self.serve_devices(config, datapath, pipeline).await
    }

    /// Attaches the TC programs to the node's devices and the pod-facing
    /// ones (when the choice changed) and serves the health check ports:
    /// at each sync once the programs are loaded, and when their load ends
    /// after the first sync.
    async fn serve_devices(
        &mut self,
        config: &AgentConfig,
        datapath: &mut Datapath,
        pipeline: &Pipeline,
    ) -> anyhow::Result<()> {
        self.devices_pending = false;
        // A load that failed ends the agent here, as at the first attach
        // (the XDP program with `--nodeport-acceleration=native`); TC
        // programs the kernel refuses are not a failure of the load.
        datapath.programs_loaded()?;
        // Before the devices' lines, which say that a node serves traffic
        // from outside: a load balancer's checks find their ports then.
        self.health_checks.update(&pipeline.model().health_checks()).await;
        let node_ips = pipeline.node().map(|n| n.node_ips.clone()).unwrap_or_default();
        attach_devices(&config.devices, datapath, &node_ips, &mut self.devices);
        self.outside_served();
        // Once here; then at each link or address change (`links_changed`),
        // not at every sync: a device dump costs a netlink round trip.
        if self.pod_devices.is_none() {
            self.attach_pod_devices(&config.pod_devices, datapath, &node_ips);
        }
        Ok(())
    }

    /// /healthz may say healthy from now on (`observe::health`).
    fn outside_served(&self) {
        let health = &mut self.telemetry.lock().expect("telemetry lock").health;
        if !std::mem::replace(&mut health.outside_served, true) {
            info!("{OUTSIDE_SERVED}");
        }
    }

    /// Attaches the TC programs of `datapath`, a set just moved to, to the
    /// devices they were on (swapping them into the pinned links).
    fn attach_again(&mut self, config: &AgentConfig, datapath: &mut Datapath, node_ips: &[std::net::IpAddr]) {
        self.devices = None;
        attach_devices(&config.devices, datapath, node_ips, &mut self.devices);
        if self.pod_devices.take().is_some() {
            self.attach_pod_devices(&config.pod_devices, datapath, node_ips);
        }
    }

    /// A link came, went or changed: the pod-facing devices are chosen
    /// again (once the programs are attached).
    fn links_changed(
        &mut self,
        config: &AgentConfig,
        datapath: &mut Datapath,
        pipeline: &Pipeline,
        telemetry: &Shared,
    ) {
        // While the TC programs load, `serve_devices` chooses when they end.
        if self.attached && !self.devices_pending {
            let node_ips = pipeline.node().map(|n| n.node_ips.clone()).unwrap_or_default();
            self.attach_pod_devices(&config.pod_devices, datapath, &node_ips);
            telemetry.lock().expect("telemetry lock").pod_devices = self.pod_devices.as_ref().map_or(0, Vec::len);
        }
    }

    /// Attaches the per-packet programs to the pod-facing devices when the
    /// choice changed (a pod came or went); a device that fails is logged,
    /// the others serve.
    fn attach_pod_devices(
        &mut self,
        selection: &crate::node::pod_devices::PodDeviceSelection,
        datapath: &mut Datapath,
        node_ips: &[std::net::IpAddr],
    ) {
        let links = match crate::node::pod_devices::links() {
            Ok(links) => links,
            Err(err) => {
                warn!(%err, "cannot list the node's devices; the pod-facing devices stay as they are");
                return;
            }
        };
        // Never a device the node's own traffic leaves by (its addresses,
        // the default route), even when --devices names none of them.
        let mut external = devices::resolve(&DeviceSelection::Auto, node_ips).chosen;
        external.extend(self.devices.iter().flatten().cloned());
        let chosen = crate::node::pod_devices::resolve(selection, &links, &external);
        if self.pod_devices.as_ref() == Some(&chosen) {
            return;
        }
        match datapath.attach_pod_devices(&chosen) {
            Ok(results) => {
                for r in &results {
                    if let Err(err) = &r.result {
                        error!(device = %r.device, %err, "cannot attach the per-packet programs: the pods' traffic passing there is translated only at their sockets");
                    }
                }
                let before = self.pod_devices.as_deref().unwrap_or_default();
                let added: Vec<&String> = chosen.iter().filter(|d| !before.contains(d)).collect();
                let removed: Vec<&String> = before.iter().filter(|d| !chosen.contains(d)).collect();
                info!(
                    devices = chosen.len(),
                    ?added,
                    ?removed,
                    "pod-facing devices: the pods' traffic to services is translated per packet there"
                );
                self.pod_devices = Some(chosen);
            }
            Err(err) => error!(%err, "cannot attach the per-packet programs to the pod-facing devices"),
        }
    }
}

/// The message of the one log record each sync ends with (fields:
/// `generation`, `frontends`, `backends`, `writes`, `failures`,
/// `latency_us`, and for a sync that wrote EndpointSlice changes
/// `triggers`, `programming_min_us` and `programming_max_us`: their count
/// and the shortest and longest time from a change's
/// last-change-trigger-time to its maps written): an interface, which
/// tests, the benchmark and operators' scripts wait for by this constant,
/// never by its text.
pub const APPLIED: &str = "service table applied";

/// What a sync applied, logged in one line with its latency, the time from
/// the change reaching the agent to its maps written.
fn applied_snapshot(source: &str, pipeline: &Pipeline, synced: &Synced) -> Applied {
    let reconciler = pipeline.reconciler();
    let snapshot = Applied {
        generation: synced.generation,
        frontends: reconciler.frontend_count(),
        backends: reconciler.backend_count(),
        failures: synced.report.failures.len(),
    };
    info!(
        source,
        generation = snapshot.generation,
        frontends = snapshot.frontends,
        backends = snapshot.backends,
        writes = synced.report.writes,
        failures = snapshot.failures,
        objects_rejected = pipeline.stats().objects_rejected,
        latency_us = u64::try_from(synced.latency.as_micros()).unwrap_or(u64::MAX),
        triggers = (!synced.programming_seconds.is_empty()).then_some(synced.programming_seconds.len()),
        programming_min_us = micros(synced.programming_seconds.iter().copied().reduce(f64::min)),
        programming_max_us = micros(synced.programming_seconds.iter().copied().reduce(f64::max)),
        "{APPLIED}"
    );
    snapshot
}

/// Seconds as whole microseconds.
fn micros(seconds: Option<f64>) -> Option<u64> {
    seconds.map(|s| u64::try_from(std::time::Duration::from_secs_f64(s.max(0.0)).as_micros()).unwrap_or(u64::MAX))
}

/// Attaches the TC programs to the devices traffic from outside arrives
/// on, when they are not yet attached or the choice changed (the node's
/// addresses moved); a device that fails is logged, the others serve.
fn attach_devices(
    selection: &DeviceSelection,
    datapath: &mut Datapath,
    node_ips: &[std::net::IpAddr],
    attached: &mut Option<Vec<String>>,
) {
    let resolved = devices::resolve(selection, node_ips);
    if attached.as_ref() == Some(&resolved.chosen) {
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
    // Each device's kind: where XDP is worth it (a veth's is not).
    let links = crate::node::pod_devices::links().unwrap_or_default();
    let kind = |device: &str| links.iter().find(|l| l.name == device).map(|l| l.kind.clone()).unwrap_or_default();
    match datapath.attach_devices(&resolved.chosen, kind) {
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
                    let accelerated: Vec<&str> = results.iter().filter(|r| r.xdp).map(|r| r.device.as_str()).collect();
                    info!(devices = ?resolved.chosen, xdp = ?accelerated, "serving traffic from outside (NodePorts, LoadBalancer IPs, externalIPs) on these devices");
                }
                mark_netfilter_flows_when_deferring(datapath);
            }
            *attached = Some(resolved.chosen);
        }
        Err(err) => error!(%err, "cannot attach the TC programs: traffic from outside is not served"),
    }
}

/// Deferring to netfilter (`--outside-handover defer`), with the TC
/// programs attached: marks the flows conntrack already translated, so
/// those silent while deferring stay netfilter's after the handover.
fn mark_netfilter_flows_when_deferring(datapath: &mut Datapath) {
    use crate::datapath::handover::OutsideHandover;
    if !matches!(datapath.outside_handover(), Ok(Some(OutsideHandover::Defer))) {
        return;
    }
    datapath.mark_netfilter_flows_or_warn("a flow silent while deferring may be taken over by the handover");
}

/// Loads the datapath and hands its counters to the metrics endpoint.
/// `defer`: a takeover is due, traffic from outside starts deferred to
/// kube-proxy's rules.
fn load_datapath(config: &AgentConfig, defer: bool, telemetry: &Shared) -> anyhow::Result<(Datapath, PinRollback)> {
    // A load that fails (a map the kernel refuses) takes back what it
    // pinned; so does a start that ends before its programs are attached
    // (`PinRollback`, kept once they are).
    let rollback = PinRollback::take(&config.load.pin_dir);
    let mut load = config.load.clone();
    if defer {
        load.outside_handover = crate::datapath::handover::OutsideHandover::Defer;
    }
    let mut datapath = Datapath::load(&load)?;
    let mut t = telemetry.lock().expect("telemetry lock");
    (t.services_map_size, t.backends_map_size) = (datapath.sizes().services, datapath.sizes().backends);
    drop(t);
    take_counters(&mut datapath, telemetry);
    Ok((datapath, rollback))
}

/// Hands the sync's results to the health and metrics endpoints.
fn publish(
    telemetries: &Telemetries,
    pipeline: &Pipeline,
    synced: &Synced,
    health_check_ports: usize,
    devices: Option<&Vec<String>>,
) {
    let (report, reconciler, metrics) = (&synced.report, pipeline.reconciler(), &telemetries.metrics);
    let seconds = synced.took.as_secs_f64();
    metrics.sync_duration.observe(seconds);
    if synced.whole_table {
        metrics.sync_full_duration.observe(seconds);
    } else {
        metrics.sync_partial_duration.observe(seconds);
    }
    if let Some(drift) = &synced.drift {
        metrics.drift_repaired(drift);
    }
    for seconds in &synced.programming_seconds {
        metrics.network_programming.observe(*seconds);
    }
    let now = SystemTime::now();
    if report.failures.is_empty() {
        // As kube-proxy's, set only by a sync that wrote everything.
        metrics.last_sync.set(unix_seconds(now));
    }
    metrics.service_changes_pending.set(0);
    metrics.endpoint_changes_pending.set(0);
    let no_local = pipeline.model().no_local_endpoints();
    metrics.set_no_local_endpoints(no_local.internal, no_local.external);
    metrics.service_changes.inc_by((report.count(ChangeKind::Added) + report.count(ChangeKind::Removed)) as u64);
    metrics.endpoint_changes.inc_by(report.count(ChangeKind::Updated) as u64);
    let mut t = telemetries.telemetry.lock().expect("telemetry lock");
    t.stats = pipeline.stats().clone();
    t.health_check_ports = health_check_ports;
    t.devices = devices.map_or(0, Vec::len);
    // Writes that failed (a map at its bound) leave the change pending:
    // they are retried, counted and logged in one line, and health turns
    // 503 once the failure is older than the health timeout, as
    // kube-proxy's does when its syncs fail.
    if report.failures.is_empty() {
        t.health.updated(now);
    } else {
        t.health.failed();
    }
    let summary = crate::reconcile::failures::summarise(&report.failures);
    for (map, n) in summary.full {
        *t.map_full.entry(map).or_default() += n as u64;
    }
    t.health.node_eligible = pipeline.node_eligible();
    t.frontends = reconciler.frontend_count();
    t.backends = reconciler.backend_count();
    t.service_entries = reconciler.service_entries();
    t.maglev_tables = reconciler.maglev_tables();
    // New frontends not listed (a large sync) are in the reconciler.
    if synced.whole_table || !report.added_unlisted.is_empty() {
        t.set_frontends(reconciler.frontend_ids());
    } else {
        for c in &report.changes {
            let now = (c.kind != ChangeKind::Removed).then_some(&c.service_port);
            t.set_frontend(c.frontend, c.rev_nat, now);
        }
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
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
