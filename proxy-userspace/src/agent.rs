//! The agent: load the datapath, then keep the maps equal to what the
//! source says, applying only the difference.
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::{
    datapath::{
        ChangeKind, Reconciler, Report,
        loader::{Datapath, LoadOptions},
    },
    model::{self, NodeContext, Severity},
    source::file,
};

/// How often the services file is checked for changes.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// A change is read once the file has stayed the same for this long, so a
/// file being written is not read half-way.
const SETTLE: Duration = Duration::from_millis(50);
/// Backoff between retries of failed map writes.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub services_file: PathBuf,
    pub node_name: String,
    pub load: LoadOptions,
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

/// Counters of bad input and failed writes since start.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    pub objects_rejected: u64,
    pub problems: u64,
    pub map_write_failures: u64,
}

/// Runs until `shutdown` resolves. The datapath stays in place afterwards
/// (pinned links and maps), translating with the last table applied.
pub async fn run(
    config: AgentConfig,
    applied: watch::Sender<Applied>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    crate::fs::ensure_bpffs_dir(&config.load.pin_dir)?;
    crate::fs::check_cgroup2(&config.load.cgroup)?;
    let mut datapath = Datapath::load(&config.load)?;
    let (mut reconciler, recovery) = Reconciler::recover(&mut datapath.maps)?;
    info!(
        frontends = recovery.frontends,
        backends = recovery.backends,
        stale_entries_removed = recovery.stale_entries_removed,
        "read the pinned maps"
    );
    let node = NodeContext::new(config.node_name.clone());
    let mut state = SyncState::default();
    tokio::pin!(shutdown);
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticker.tick() => {}
        }
        let stamp = file::stamp(&config.services_file);
        let changed = !state.read_once || stamp != state.applied_stamp;
        let retry_due = state.retry_at.is_some_and(|at| Instant::now() >= at);
        if !changed && !retry_due {
            continue;
        }
        if changed {
            tokio::time::sleep(SETTLE).await;
            if file::stamp(&config.services_file) != stamp {
                continue; // still being written
            }
            state.read_once = true;
            state.applied_stamp = stamp;
            let Some(table) = read_table(&config, &node, &mut state.counters) else {
                // Keep what is applied; read again when the file changes.
                continue;
            };
            state.table = Some(table);
        }
        let Some(table) = state.table.as_ref() else { continue };
        let started = Instant::now();
        let report = reconciler.apply(&mut datapath.maps, table);
        log_report(&report, started.elapsed());
        state.counters.map_write_failures += report.failures.len() as u64;
        state.schedule_retry(!report.failures.is_empty());
        state.generation += 1;
        let snapshot = Applied {
            generation: state.generation,
            frontends: reconciler.frontend_count(),
            backends: reconciler.backend_count(),
            failures: report.failures.len(),
        };
        info!(
            generation = snapshot.generation,
            frontends = snapshot.frontends,
            backends = snapshot.backends,
            writes = report.writes,
            failures = snapshot.failures,
            objects_rejected = state.counters.objects_rejected,
            "services file applied"
        );
        applied.send_replace(snapshot);
    }
    info!(
        pin_dir = %config.load.pin_dir.display(),
        "stopping; the datapath stays in place (pinned links and maps) and the next start takes it over; `ebpf-proxy cleanup` removes it"
    );
    drop(datapath);
    Ok(())
}

#[derive(Default)]
struct SyncState {
    read_once: bool,
    applied_stamp: Option<file::Stamp>,
    table: Option<model::ServiceTable>,
    generation: u64,
    retry_at: Option<Instant>,
    retry_delay: Option<Duration>,
    counters: Counters,
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

/// Reads and translates the services file, logging every problem once.
/// `None` when the file cannot be used at all.
fn read_table(config: &AgentConfig, node: &NodeContext, counters: &mut Counters) -> Option<model::ServiceTable> {
    let parsed = match file::load(&config.services_file) {
        Ok(parsed) => parsed,
        Err(err) => {
            error!(%err, "services file not applied");
            return None;
        }
    };
    for err in &parsed.errors {
        error!(document = err.document, object = %err.object, field = %err.field, "rejected object: {}", err.message);
    }
    counters.objects_rejected += parsed.errors.len() as u64;
    let translation = model::translate(&parsed.objects.services, &parsed.objects.slices, node);
    for p in &translation.problems {
        match p.severity {
            Severity::Error => error!(object = %p.object, field = %p.field, "{}", p.message),
            Severity::Warning => warn!(object = %p.object, field = %p.field, "{}", p.message),
        }
    }
    counters.problems += translation.problems.len() as u64;
    for (object, reason) in &translation.skipped {
        debug!(%object, reason = reason.as_str(), "service not proxied");
    }
    Some(translation.table)
}

fn log_report(report: &Report, took: Duration) {
    for c in &report.changes {
        let added: Vec<String> = c.added.iter().map(ToString::to_string).collect();
        let removed: Vec<String> = c.removed.iter().map(ToString::to_string).collect();
        let kind = match c.kind {
            ChangeKind::Added => "service frontend added",
            ChangeKind::Updated => "service frontend updated",
            ChangeKind::Removed => "service frontend removed",
        };
        info!(service = %c.service_port, frontend = %c.frontend, backends = c.backends, ?added, ?removed, "{kind}");
    }
    for f in &report.failures {
        error!(subject = %f.subject, error = %f.error, "map write failed; retrying with backoff, other services are unaffected");
    }
    debug!(writes = report.writes, took_us = took.as_micros(), "sync done");
}
