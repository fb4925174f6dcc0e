//! EndpointSlice churn (part of the control-plane bench): a rolling update
//! across many services, written to the API server at a steady rate of
//! slice updates per second, while the agent follows. Each update turns
//! one endpoint of a service not ready, then terminating, then removes it,
//! then adds it back at a new address (its pod replaced), and the next
//! endpoint after it; consecutive updates go to services far apart.
//!
//! Each write carries its wall-clock time as the slice's
//! last-change-trigger-time (as the EndpointSlice controller does), and
//! each of the agent's syncs logs how many such changes it wrote and the
//! shortest and longest time from trigger to maps written
//! (`ebpf_proxy::agent::APPLIED`). One watch delivers the updates in
//! order, so a sync wrote exactly those written after the previous sync's
//! newest and up to its own newest, which is its end (the record's
//! timestamp) less its shortest time: every update's time from API write
//! to maps written follows, without the agent logging each.
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use proxy_testkit::{AgentProcess, TestApiServer, field, message};
use serde::Serialize;
use serde_json::Value;

use super::{control::rss, relist::PeakRss, spec};

/// The annotation the EndpointSlice controller sets.
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// How long the agent may take, after the last write, to apply it.
const DRAIN: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, Default, Serialize)]
pub struct Churn {
    /// Slice updates per second asked for, and written.
    pub rate: u32,
    pub achieved_rate: f64,
    pub seconds: f64,
    pub updates: usize,
    /// From each update's API write to the agent's maps written.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Updates no sync wrote before the bench stopped waiting.
    pub unapplied: usize,
    /// Syncs that wrote the updates (the rest coalesced into them).
    pub syncs: usize,
    /// The agent's CPU time over the run's wall time, in cores.
    pub agent_cpu_cores: f64,
    pub peak_rss_mib: f64,
    pub rss_mib: f64,
    /// Watch failures during the run (the agent falling behind the watch
    /// would show here).
    pub watch_errors: f64,
}

/// One endpoint of service `s` along a rolling update, at its `round`th
/// update: not ready, terminating, removed, back at a new address.
fn rolling(s: u32, round: u32) -> Value {
    let endpoint = u8::try_from((round / 4) % u32::from(spec::ENDPOINTS)).unwrap_or(0);
    let index = usize::from(endpoint);
    let mut slice = spec::slice_object(s, None);
    match round % 4 {
        0 => {
            slice["endpoints"][index]["conditions"] =
                serde_json::json!({"ready": false, "serving": true, "terminating": false});
        }
        1 => {
            slice["endpoints"][index]["conditions"] =
                serde_json::json!({"ready": false, "serving": true, "terminating": true});
        }
        2 => {
            slice["endpoints"].as_array_mut().expect("endpoints").remove(index);
        }
        _ => slice = spec::slice_object(s, Some(endpoint)),
    }
    slice
}

/// `rate` slice updates a second for `seconds` across `n` services against
/// `agent`, following `server`.
pub fn run(server: &TestApiServer, agent: &AgentProcess, n: u32, rate: u32, seconds: f64) -> anyhow::Result<Churn> {
    eprintln!("bench: control plane: {rate} slice updates/s for {seconds} s across {n} services");
    let mark = agent.mark();
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a count of updates")]
    let total = (f64::from(rate) * seconds).round().max(0.0) as usize;
    let mut rounds = vec![0u32; usize::try_from(n).unwrap_or(0)];
    let mut written: Vec<i64> = Vec::with_capacity(total);
    let errors_before = crate::control::metric(agent, "ebpf_proxy_watch_errors_total")?;
    let cpu_before = cpu_seconds(agent.pid());
    let sampler = PeakRss::start(agent.pid());
    let started = Instant::now();
    for k in 0..total {
        if crate::stopping() {
            anyhow::bail!("interrupted");
        }
        let due =
            Duration::from_micros(u64::try_from(k).unwrap_or(u64::MAX).saturating_mul(1_000_000) / u64::from(rate));
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        // Services far apart, each along its own rolling update.
        let s = u32::try_from(k).unwrap_or(0).wrapping_mul(7919) % n;
        let round = &mut rounds[usize::try_from(s).unwrap_or(0)];
        let mut slice = rolling(s, *round);
        *round += 1;
        let now = Timestamp::now();
        slice["metadata"]["annotations"][TRIGGER_TIME] = Value::from(now.to_string());
        written.push(now.as_microsecond());
        server.put_by(spec::SLICE_MANAGER, slice);
    }
    let wrote_for = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(agent.pid()) - cpu_before;
    let last = written.last().copied().unwrap_or_default();
    // Until a sync has written the last update (or the bench gives up).
    let drained = agent.wait_for(mark, DRAIN, |r| sync_of(r).is_some_and(|s| s.newest_us >= last));
    let peak_rss_mib = sampler.stop();
    drained.map_err(anyhow::Error::msg).context("the agent did not apply the last update")?;
    let records = agent.records();
    let syncs: Vec<Sync> = records.iter().skip(mark).filter_map(sync_of).collect();
    let watch_errors = crate::control::metric(agent, "ebpf_proxy_watch_errors_total")? - errors_before;
    let (mut latencies, unapplied) = latencies(&written, &syncs);
    let percentile = |values: &mut [f64], p: f64| {
        values.sort_by(f64::total_cmp);
        crate::percentile::index(values.len(), p).map_or(0.0, |i| values[i])
    };
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let achieved_rate = written.len() as f64 / wrote_for;
    Ok(Churn {
        rate,
        achieved_rate,
        seconds: wrote_for,
        updates: written.len(),
        p50_ms: percentile(&mut latencies, 0.5),
        p99_ms: percentile(&mut latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        unapplied,
        syncs: syncs.len(),
        agent_cpu_cores: cpu / wrote_for,
        peak_rss_mib,
        rss_mib: rss(agent.pid()).1,
        watch_errors,
    })
}

/// A sync that wrote trigger-timed changes: when it ended, and the
/// trigger time of the newest change it wrote (µs since the epoch).
#[derive(Clone, Copy, Debug)]
struct Sync {
    end_us: i64,
    newest_us: i64,
}

fn sync_of(record: &Value) -> Option<Sync> {
    if message(record) != Some(ebpf_proxy::agent::APPLIED) {
        return None;
    }
    let min = field(record, "programming_min_us").and_then(Value::as_i64)?;
    let end_us = record.get("timestamp")?.as_str()?.parse::<Timestamp>().ok()?.as_microsecond();
    Some(Sync { end_us, newest_us: end_us - min })
}

/// Each write's time to the end of the sync that wrote it, ms; and how
/// many no sync wrote. `written` is in write order; a sync wrote those
/// after the previous sync's newest up to its own.
fn latencies(written: &[i64], syncs: &[Sync]) -> (Vec<f64>, usize) {
    let mut out = Vec::with_capacity(written.len());
    let mut at = 0;
    let mut unapplied = 0;
    for &w in written {
        // The log's timestamps are whole microseconds.
        while at < syncs.len() && syncs[at].newest_us + 1 < w {
            at += 1;
        }
        match syncs.get(at) {
            #[expect(clippy::cast_precision_loss, reason = "microseconds far below 2^52")]
            Some(sync) => out.push((sync.end_us - w) as f64 / 1000.0),
            None => unapplied += 1,
        }
    }
    (out, unapplied)
}

/// User and system CPU seconds of process `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's closing parenthesis: fields 3 on; utime and
    // stime are the 14th and 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[expect(clippy::cast_precision_loss, reason = "a small constant")]
    let hz = hz as f64;
    (ticks(11) + ticks(12)) / hz.max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_write_goes_to_the_first_sync_that_wrote_it() {
        let syncs = [Sync { end_us: 1_500, newest_us: 1_200 }, Sync { end_us: 3_000, newest_us: 2_600 }];
        let (ms, unapplied) = latencies(&[1_000, 1_200, 1_300, 2_600, 2_700], &syncs);
        assert_eq!(ms, [0.5, 0.3, 1.7, 0.4]);
        assert_eq!(unapplied, 1);
    }

    #[test]
    fn a_rolling_update_goes_not_ready_terminating_removed_replaced() {
        let conditions = |v: &Value| v["endpoints"][0]["conditions"].clone();
        assert_eq!(conditions(&rolling(3, 0))["ready"], false);
        assert_eq!(conditions(&rolling(3, 1))["terminating"], true);
        assert_eq!(rolling(3, 2)["endpoints"].as_array().unwrap().len(), usize::from(spec::ENDPOINTS) - 1);
        assert_ne!(rolling(3, 3)["endpoints"][0]["addresses"], rolling(3, 4)["endpoints"][0]["addresses"]);
        assert_eq!(conditions(&rolling(3, 4))["ready"], true, "the next endpoint's turn");
        assert_eq!(rolling(3, 4)["endpoints"][1]["conditions"]["ready"], false);
    }
}
