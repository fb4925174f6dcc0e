//! The sync pipeline, one step at a time: a source says something changed
//! → the model translates what changed into the desired table → the
//! reconciler writes the difference into the maps (and owns retries) → the
//! caller hands the report to the observers (telemetry, session purge,
//! socket destroy, health checks). See docs/design.md.
//!
//! Generic over the source and the maps: the agent runs it with a
//! Kubernetes or file source and the kernel maps, the tests with a test
//! source and in-memory maps, the same code.
use std::{
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tracing::{debug, error, info, warn};

use crate::{
    model::{self, Delta, NodeContext, ServiceInput, Severity, TableState},
    node::nodeport_addresses::{self, NodePortAddresses},
    reconcile::{
        ChangeKind, Reconciler, Report, ServiceMaps,
        audit::{self, Audit, Drift},
    },
    source::{ChangeSource, Delivery, Snapshot},
};

/// What the pipeline knows of this node besides its Node object.
#[derive(Debug, Clone, Default)]
pub struct NodeSettings {
    /// This node's name.
    pub node_name: String,
    /// This node's addresses; empty: those of its Node object.
    pub node_ips: Vec<IpAddr>,
    /// kube-proxy's nodePortAddresses: which addresses serve NodePorts.
    pub node_port_addresses: NodePortAddresses,
    /// The node's local addresses (every device's; see
    /// `crate::node::local_addrs`), for `node_port_addresses`.
    pub local_addrs: Vec<IpAddr>,
    /// `--external-ips-local-only` (`NodeContext::external_ips_local_only`).
    pub external_ips_local_only: bool,
    /// `--lb-algorithm` (`NodeContext::lb_algorithm`).
    pub lb_algorithm: crate::model::LbAlgorithm,
}

/// Counters since start.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Objects rejected by the source.
    pub objects_rejected: u64,
    /// Problems the model found.
    pub problems: u64,
    pub(crate) map_write_failures: u64,
}

/// How often the drift audit runs unless configured (`--audit-interval`,
/// syncPeriod).
pub(crate) const DEFAULT_AUDIT_INTERVAL: Duration = Duration::from_mins(5);

/// Why the pipeline woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The source has something new.
    Changed,
    /// Failed writes are due to be tried again.
    Retry,
    /// The drift audit is due (`--audit-interval`, kube-proxy's syncPeriod,
    /// or SIGHUP): the maps are read back and the whole table compared with
    /// them.
    Resync,
    /// The node's local addresses changed so that other addresses serve
    /// NodePorts (`Pipeline::set_local_addresses`): every service is
    /// translated again, as for a Node address change.
    NodeAddresses,
}

/// One sync's outcome, for the observers.
#[derive(Debug)]
pub struct Synced {
    /// What the reconciler wrote.
    pub report: Report,
    /// The whole table was compared (first sync, relist, new node context,
    /// after a failure), not only what changed.
    pub(crate) whole_table: bool,
    /// From the change reaching the agent to its maps written.
    pub(crate) latency: Duration,
    /// Time spent writing the maps.
    pub(crate) took: Duration,
    /// Syncs so far (the first is 1).
    pub(crate) generation: u64,
    /// For each EndpointSlice change this sync wrote (when it wrote all it
    /// tried): seconds from its last-change-trigger-time to now.
    pub(crate) programming_seconds: Vec<f64>,
    /// A drift audit ran: how the maps differed from the desired table
    /// (empty: not at all).
    pub(crate) drift: Option<Drift>,
}

/// The sync pipeline: a source's deliveries through the model into the maps, one step at a time.
pub struct Pipeline {
    settings: NodeSettings,
    /// The desired table, kept service by service.
    model: TableState,
    /// The node the model was translated for (`None`: nothing read yet).
    node: Option<NodeContext>,
    /// This node's Node object says it should get traffic (true while
    /// there is none: the file source may have no Node).
    node_eligible: bool,
    reconciler: Reconciler,
    stats: Stats,
    generation: u64,
    /// When the last sync ended.
    last_sync: Option<Instant>,
    retry_at: Option<Instant>,
    /// The drift audit's interval (kube-proxy's syncPeriod): the maps are
    /// read back and the whole table compared with them this often
    /// (`None`: never).
    audit_interval: Option<Duration>,
    resync_at: Option<Instant>,
}

impl Pipeline {
    /// A pipeline writing through `reconciler` (recovered from the maps).
    #[must_use]
    pub fn new(settings: NodeSettings, reconciler: Reconciler) -> Self {
        Self {
            settings,
            model: TableState::default(),
            node: None,
            node_eligible: true,
            reconciler,
            stats: Stats::default(),
            generation: 0,
            last_sync: None,
            retry_at: None,
            audit_interval: None,
            resync_at: None,
        }
    }

    /// Every `period`, the drift audit reads the maps back from the kernel
    /// and compares the whole table with them, so an entry anyone else
    /// changed is put right (kube-proxy's syncPeriod).
    #[must_use]
    pub(crate) fn with_audit_interval(mut self, period: Option<Duration>) -> Self {
        self.audit_interval = period;
        self.resync_at = period.map(|p| Instant::now() + p);
        self
    }

    /// The reconciler, and what it applied.
    #[must_use]
    pub const fn reconciler(&self) -> &Reconciler {
        &self.reconciler
    }

    #[must_use]
    pub(crate) const fn model(&self) -> &TableState {
        &self.model
    }

    /// Counters since start.
    #[must_use]
    pub const fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The node context of the last translation (`None`: nothing read yet).
    #[must_use]
    pub(crate) const fn node(&self) -> Option<&NodeContext> {
        self.node.as_ref()
    }

    /// Whether this node is eligible for traffic from load balancers (see
    /// `model::node_eligible`).
    #[must_use]
    pub(crate) const fn node_eligible(&self) -> bool {
        self.node_eligible
    }

    /// Resolves when the source has something new, or when failed writes
    /// are due to be tried again.
    pub(crate) async fn wait(&self, source: &mut impl ChangeSource) -> Wake {
        tokio::select! {
            () = source.changed() => Wake::Changed,
            () = sleep_until(self.retry_at) => Wake::Retry,
            () = sleep_until(self.resync_at) => Wake::Resync,
        }
    }

    /// Reads what woke it, translates it and writes the difference: `None`
    /// when there is nothing to write (nothing readable yet). The same as
    /// `translate` then `write`.
    pub async fn step(
        &mut self,
        wake: Wake,
        source: &mut impl ChangeSource,
        maps: &mut impl ServiceMaps,
    ) -> Option<Synced> {
        let translated = self.translate(wake, source, maps).await?;
        Some(self.write(translated, maps))
    }

    /// Reads what woke it and translates it into the model (`model()`),
    /// writing nothing yet: `None` when there is nothing to write. Between
    /// this and `write`, the agent may move to maps sized for the model's
    /// table (see `crate::agent::resize::before_first_write`).
    pub async fn translate(
        &mut self,
        wake: Wake,
        source: &mut impl ChangeSource,
        maps: &mut impl ServiceMaps,
    ) -> Option<Translated> {
        // When the change reached the agent: the latency counts from here.
        let noticed = Instant::now();
        let mut triggers = Vec::new();
        let mut changed = None;
        let mut audit = None;
        if wake == Wake::Resync {
            self.resync_at = self.audit_interval.map(|p| Instant::now() + p);
            if self.node.is_some() {
                audit = self.start_audit(maps);
            }
        }
        if wake == Wake::Changed {
            source.gather(self.last_sync).await;
            let delivery = source.snapshot()?;
            let update = self.take(delivery, source, &mut triggers)?;
            if !update.full {
                changed = Some(update.delta.keys);
            }
        }
        if wake == Wake::NodeAddresses && self.node.is_some() {
            let everything = source.everything()?;
            self.take(everything, source, &mut triggers)?;
        }
        self.node.as_ref()?;
        Some(Translated { noticed, triggers, changed, audit })
    }

    /// Writes the difference between the translated table and the maps.
    pub fn write(&mut self, translated: Translated, maps: &mut impl ServiceMaps) -> Synced {
        let Translated { noticed, triggers, changed, audit } = translated;
        let started = Instant::now();
        let report = self.reconciler.sync(maps, self.model.table(), changed.as_ref());
        let took = started.elapsed();
        let latency = noticed.elapsed();
        let drift = audit.and_then(|a| finish_audit(a, maps));
        self.written(&report, started.duration_since(noticed), took, drift.is_some());
        let programming_seconds = if report.failures.is_empty() { since(&triggers) } else { Vec::new() };
        self.generation += 1;
        self.last_sync = Some(Instant::now());
        Synced {
            report,
            whole_table: changed.is_none(),
            latency,
            took,
            generation: self.generation,
            programming_seconds,
            drift,
        }
    }

    /// Makes room in the reconciler for `backends` distinct backends (a
    /// whole table about to be written: `reconcile::sizing::Demand`).
    pub fn reserve_backends(&mut self, backends: usize) {
        self.reconciler.reserve_backends(backends);
    }

    /// Writes through other maps from now on, without writing yet:
    /// `reconciler` was recovered from them (a set sized for the table
    /// before its first write). The next `write` must compare the whole
    /// table, as one after `translate` of a list does.
    pub fn write_through(&mut self, reconciler: Reconciler) {
        self.reconciler = reconciler;
    }

    /// Moves to other maps (a set of other sizes, see `reconcile::sizing`):
    /// `reconciler` was recovered from them, and the whole table is
    /// written there now. The caller swaps the programs over afterwards,
    /// with the reconciler of the old maps returned here: it names the ids
    /// the flows in the old `CT` hold (`reconcile::remap`).
    pub(crate) fn move_to(&mut self, reconciler: Reconciler, maps: &mut impl ServiceMaps) -> (Report, Reconciler) {
        let old = std::mem::replace(&mut self.reconciler, reconciler);
        let started = Instant::now();
        let report = self.reconciler.sync(maps, self.model.table(), None);
        self.written(&report, Duration::ZERO, started.elapsed(), false);
        (report, old)
    }

    /// After every write of the maps: logs the report, counts its failures
    /// and schedules their retry.
    fn written(&mut self, report: &Report, read: Duration, took: Duration, audit: bool) {
        log_report(report, &self.reconciler, (read, took), audit);
        self.stats.map_write_failures += report.failures.len() as u64;
        self.retry_at = self.reconciler.retry_delay().map(|d| Instant::now() + d);
    }

    /// Starts a drift audit: the maps are read back into a fresh
    /// reconciler, as on start, so the sync that follows (which compares
    /// the whole table) rewrites whatever differs there, in the
    /// reconciler's safe order. A map that cannot be read keeps the
    /// reconciler as it is.
    fn start_audit(&mut self, maps: &mut impl ServiceMaps) -> Option<Audit> {
        match Audit::start(maps) {
            Ok((audit, reconciler, recovery)) => {
                self.reconciler = reconciler;
                debug!(
                    frontends = recovery.frontends,
                    backends = recovery.backends,
                    stale_entries_removed = recovery.stale_entries_removed,
                    "drift audit: read the maps back; the whole table is compared with them"
                );
                Some(audit)
            }
            Err(err) => {
                warn!(%err, "drift audit: cannot read the maps back; compared with what was written");
                None
            }
        }
    }

    /// Translates a delivery into the model, logging (and counting) each
    /// problem when it appears and when it goes away. A change of this
    /// node's context (addresses, zone) translates every service again.
    fn take(
        &mut self,
        delivery: Delivery,
        source: &mut impl ChangeSource,
        triggers: &mut Vec<SystemTime>,
    ) -> Option<Update> {
        self.stats.objects_rejected += delivery.rejected;
        triggers.extend(delivery.triggers);
        let update = match delivery.snapshot {
            Snapshot::Full { services, slices, nodes } => {
                let node = self.node_context(&nodes);
                let delta =
                    self.model.replace_all(services.iter().map(|s| &**s), slices.iter().map(|s| &s.spec), &node);
                self.node = Some(node);
                Update { delta, full: true }
            }
            Snapshot::Changed { services, nodes } => {
                let current = self.node.clone()?;
                let node = match nodes {
                    Some(nodes) => self.node_context(&nodes),
                    None => current.clone(),
                };
                if node != current {
                    let everything = source.everything()?;
                    return self.take(everything, source, triggers);
                }
                let inputs = services.iter().map(|c| {
                    let input = ServiceInput {
                        service: c.service.as_deref(),
                        slices: c.slices.iter().map(|s| &s.spec).collect(),
                    };
                    (c.id.clone(), input)
                });
                Update { delta: self.model.update(inputs, &node), full: false }
            }
        };
        log_problems(&update.delta, &mut self.stats);
        Some(update)
    }

    /// Takes the node's local addresses (they changed): whether other
    /// addresses serve NodePorts now, so every service must be translated
    /// again (`Wake::NodeAddresses`).
    pub fn set_local_addresses(&mut self, addrs: Vec<IpAddr>) -> bool {
        self.settings.local_addrs = addrs;
        self.node.as_ref().is_some_and(|node| {
            let now = nodeport_addresses::serving(
                &self.settings.node_port_addresses,
                &self.settings.local_addrs,
                &node.node_ips,
            );
            (now.addrs.as_slice(), now.loopback) != (node.node_port_ips.as_slice(), node.node_port_loopback)
        })
    }

    /// This node's context for a translation: zone and addresses from its
    /// Node object, addresses from the settings when given, the addresses
    /// serving NodePorts from those and the local ones; changes are
    /// logged.
    fn node_context(&mut self, nodes: &[Arc<k8s_openapi::api::core::v1::Node>]) -> NodeContext {
        self.follow_eligibility(nodes);
        let settings = &self.settings;
        let mut node = NodeContext::from_nodes(&settings.node_name, nodes.iter().map(|n| &**n));
        if !settings.node_ips.is_empty() {
            node = node.with_ips(settings.node_ips.clone());
        }
        let serving = nodeport_addresses::serving(&settings.node_port_addresses, &settings.local_addrs, &node.node_ips);
        (node.node_port_ips, node.node_port_loopback) = (serving.addrs, serving.loopback);
        node.external_ips_local_only = settings.external_ips_local_only;
        node.lb_algorithm = settings.lb_algorithm;
        let before = self.node.as_ref();
        if before.map(|b| &b.node_ips) != Some(&node.node_ips) {
            info!(node = %settings.node_name, addresses = ?node.node_ips, "node addresses (externalIPs, devices)");
        }
        if before.map(|b| (&b.node_port_ips, b.node_port_loopback))
            != Some((&node.node_port_ips, node.node_port_loopback))
        {
            log_node_port_addresses(&node, &settings.node_port_addresses);
        }
        if before.map(|b| &b.zone) != Some(&node.zone) {
            info!(node = %settings.node_name, zone = ?node.zone, "node zone (for topology hints)");
        }
        node
    }
}

impl Pipeline {
    /// Takes this node's eligibility for traffic from its Node object,
    /// logging a change.
    fn follow_eligibility(&mut self, nodes: &[Arc<k8s_openapi::api::core::v1::Node>]) {
        let name = self.settings.node_name.as_str();
        let this_node = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(name));
        let eligible = this_node.is_none_or(|n| model::node_eligible(n));
        if eligible != self.node_eligible {
            if eligible {
                info!(node = name, "node eligible for traffic again: /healthz follows the proxy's health");
            } else {
                warn!(
                    node = name,
                    "node is being deleted or tainted ToBeDeletedByClusterAutoscaler: /healthz answers 503 so load balancers drain it"
                );
            }
            self.node_eligible = eligible;
        }
    }
}

/// A change translated into the model and not written yet (see
/// `Pipeline::translate`).
#[derive(Debug)]
pub struct Translated {
    /// When the change reached the agent.
    noticed: Instant,
    /// Trigger times of the EndpointSlice changes it holds.
    triggers: Vec<SystemTime>,
    /// The frontends it changed (`None`: the whole table is compared).
    changed: Option<std::collections::BTreeSet<model::FrontendKey>>,
    /// A drift audit under way: the maps as read back before the write.
    audit: Option<Audit>,
}

impl Translated {
    /// Every service was translated (a first read, a relist, a new node
    /// context, a retry or periodic sync): the write compares the whole
    /// table with the maps.
    #[must_use]
    pub const fn whole_table(&self) -> bool {
        self.changed.is_none()
    }
}

/// What reading a delivery into the model changed.
struct Update {
    delta: Delta,
    /// Every service was translated (the first read, a relist, a new node
    /// context): the whole table is compared with the maps.
    full: bool,
}

/// Ends a drift audit: logs one line naming what differed (at warn: the
/// maps were changed by something else), or at debug that nothing did.
fn finish_audit(audit: Audit, maps: &impl ServiceMaps) -> Option<Drift> {
    match audit.finish(maps) {
        Ok(drift) if drift.is_empty() => {
            debug!("drift audit: the maps hold the desired table");
            Some(drift)
        }
        Ok(drift) => {
            warn!(entries = drift.total(), maps = %drift, "{}", audit::DRIFT_REPAIRED);
            Some(drift)
        }
        Err(err) => {
            warn!(%err, "drift audit: cannot read the maps after the repair; the difference is not counted");
            None
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The one line saying which addresses serve NodePorts (logged when they
/// change).
fn log_node_port_addresses(node: &NodeContext, setting: &NodePortAddresses) {
    let mut addresses: Vec<String> = node.node_port_ips.iter().map(ToString::to_string).collect();
    if node.node_port_loopback {
        addresses.push(model::NODE_PORT_LOOPBACK.to_string());
    }
    info!(node = %node.node_name, addresses = %addresses.join(","), node_port_addresses = %setting, "addresses serving NodePorts");
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
    log_skipped(&delta.skipped);
}

/// One line per service skipped for a new reason (`Delta::skipped`: not
/// again on later syncs). A sync that skips more than
/// `LOG_EACH_CHANGE_UP_TO` (a first start on a big cluster) logs one
/// summary by reason at info, and each service at debug.
fn log_skipped(skipped: &[(model::ObjectRef, model::SkipReason)]) {
    if skipped.len() <= LOG_EACH_CHANGE_UP_TO {
        for (object, reason) in skipped {
            info!(%object, reason = reason.as_str(), "service not proxied");
        }
        return;
    }
    let mut by_reason: Vec<(&str, usize)> = Vec::new();
    for (object, reason) in skipped {
        debug!(%object, reason = reason.as_str(), "service not proxied");
        match by_reason.iter_mut().find(|(r, _)| *r == reason.as_str()) {
            Some((_, n)) => *n += 1,
            None => by_reason.push((reason.as_str(), 1)),
        }
    }
    let by_reason: Vec<String> = by_reason.iter().map(|(r, n)| format!("{n} {r}")).collect();
    info!(services = skipped.len(), by_reason = %by_reason.join(", "), "services not proxied (each at debug)");
}

/// Seconds from each trigger time to now.
fn since(triggers: &[SystemTime]) -> Vec<f64> {
    let now = SystemTime::now();
    triggers.iter().map(|t| now.duration_since(*t).unwrap_or_default().as_secs_f64()).collect()
}

/// The message of the one line a sync with failed writes logs (fields:
/// `failures`, `per_map`, `full`, `first`, `error`): an interface tests and
/// operators wait for by this constant.
pub const MAP_WRITES_FAILED: &str =
    "map writes failed; retrying with backoff, the services not written keep their previous state (or none)";

/// A sync that changes more frontends than this (a first start, a relist)
/// logs a summary at info and each change at debug.
const LOG_EACH_CHANGE_UP_TO: usize = crate::reconcile::LIST_NEW_FRONTENDS_UP_TO;

/// Logs what a sync changed (`reconciler`: what it wrote); `read` is the
/// time spent reading and translating, `took` the time spent writing the
/// maps. The changes of a drift audit's repair go to debug (its one line
/// names them).
fn log_report(report: &Report, reconciler: &Reconciler, (read, took): (Duration, Duration), audit: bool) {
    // A sync that added more than that many frontends lists them by key
    // (some may have failed): a summary, whatever the count.
    let each_at_info = !audit && report.added_unlisted.is_empty() && report.changes.len() <= LOG_EACH_CHANGE_UP_TO;
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
    // New frontends of a large sync (a start) are reported by key.
    if tracing::enabled!(tracing::Level::DEBUG) {
        for key in &report.added_unlisted {
            if let Some((service, backends)) = reconciler.describe(key) {
                debug!(%service, frontend = %key, backends, "service frontend added");
            }
        }
    }
    if !each_at_info && !audit {
        info!(
            added = report.count(ChangeKind::Added),
            updated = report.count(ChangeKind::Updated),
            removed = report.count(ChangeKind::Removed),
            "service frontends changed (each change is logged at debug level; `ebpf-proxy service list` shows the table)"
        );
    }
    if let Some(first) = report.failures.first() {
        // One line per sync, however many writes failed.
        let summary = crate::reconcile::failures::summarise(&report.failures);
        warn!(
            failures = report.failures.len(),
            per_map = ?summary.per_map,
            full = ?summary.full,
            first = ?summary.first,
            error = %first.error,
            "{MAP_WRITES_FAILED}"
        );
    }
    debug!(writes = report.writes, read_us = read.as_micros(), write_us = took.as_micros(), "sync done");
}
