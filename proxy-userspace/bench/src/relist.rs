//! The agent through API server restarts (part of the control-plane
//! bench): a restart the watches resume from, and one after an etcd
//! compaction, where every watch position has expired (410 Gone) and the
//! agent lists everything again.
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use proxy_testkit::{AgentProcess, TestApiServer, field, message};
use serde_json::Value;

use super::{control::rss, spec};

/// How long the API server stays down (a restart of a real one).
const DOWN: Duration = Duration::from_secs(3);
/// How long a sync or a relist may take at most before the bench gives up.
const PATIENCE: Duration = Duration::from_mins(3);
/// How long the agent settles after a relist before its memory is read
/// (it returns a whole-table sync's free memory right after the sync).
const SETTLE: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, Default)]
pub struct Restarts {
    /// From the API server serving again to the first sync applied (the
    /// watches resumed, a change made while it was down).
    pub resync_after_restart_seconds: f64,
    /// From the API server serving again after a compaction to the sync
    /// after both full relists.
    pub relist_seconds: f64,
    /// Peak resident memory during that (`VmRSS` every 10 ms), MiB.
    pub relist_peak_rss_mib: f64,
    /// Resident memory a moment after the relist, MiB.
    pub rss_after_relist_mib: f64,
}

/// Runs both restarts against the agent following `server`, which holds
/// `n` services of the bench's spec.
pub fn run(server: &mut TestApiServer, agent: &AgentProcess, n: u32) -> anyhow::Result<Restarts> {
    let changed = n / 2;
    // A restart: watches break, a slice changes meanwhile, the watches
    // resume from where they were.
    let mark = agent.mark();
    server.stop();
    std::thread::sleep(DOWN);
    server.put_by(spec::SLICE_MANAGER, spec::slice_object(changed, Some(0)));
    server.start_again();
    let back = Instant::now();
    agent
        .wait_for(mark, PATIENCE, crate::control::is_applied)
        .map_err(anyhow::Error::msg)
        .context("no sync after the restart")?;
    let resync_after_restart_seconds = back.elapsed().as_secs_f64();

    // A restart after a compaction: the change is put back while down and
    // the history forgotten, so the positions the watches hold are too old.
    let mark = agent.mark();
    server.stop();
    std::thread::sleep(DOWN);
    server.put_by(spec::SLICE_MANAGER, spec::slice_object(changed, None));
    server.compact();
    let sampler = PeakRss::start(agent.pid());
    server.start_again();
    let back = Instant::now();
    let mut after = mark;
    for kind in ["Service", "EndpointSlice"] {
        let relisted = move |r: &Value| {
            message(r) == Some(&format!("{kind} list complete"))
                && field(r, "relist").and_then(Value::as_bool) == Some(true)
        };
        // Its position, not a copy of the log: copying tens of thousands
        // of records took seconds of the time measured.
        let at = agent
            .wait_for_position(mark, PATIENCE, relisted)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("the agent did not relist its {kind}s after the watch positions expired"))?;
        after = after.max(at + 1);
    }
    agent
        .wait_for(after, PATIENCE, crate::control::is_applied)
        .map_err(anyhow::Error::msg)
        .context("no sync after the relists")?;
    let relist_seconds = back.elapsed().as_secs_f64();
    let relist_peak_rss_mib = sampler.stop();
    std::thread::sleep(SETTLE);
    Ok(Restarts {
        resync_after_restart_seconds,
        relist_seconds,
        relist_peak_rss_mib,
        rss_after_relist_mib: rss(agent.pid()).1,
    })
}

/// The highest `VmRSS` of a process, sampled every 10 ms on a thread
/// (its `VmHWM` is already at the cold start's peak).
pub struct PeakRss {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<f64>,
}

impl PeakRss {
    pub fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0.0_f64;
            while !stopped.load(Ordering::Relaxed) {
                peak = peak.max(rss(pid).1);
                std::thread::sleep(Duration::from_millis(10));
            }
            peak.max(rss(pid).1)
        });
        Self { stop, thread }
    }

    pub fn stop(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0.0)
    }
}
