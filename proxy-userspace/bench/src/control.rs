//! The control plane: the agent against an API server holding `n`
//! services of ten endpoints (the repo's list/watch test server, with
//! objects as large as a real server's): time from start to every map
//! written, the time each single-endpoint change takes, the agent's memory,
//! and the API server's restarts (`relist`).
use std::time::{Duration, Instant};

use anyhow::Context as _;
use proxy_testkit::{BpfFs, TestApiServer, TestCgroup, field, kubeconfig_yaml, message, unique_name};
use serde::Serialize;

use super::{Settings, spec, stopping};

#[derive(Clone, Debug, Default, Serialize)]
pub struct Control {
    pub services: u32,
    pub endpoints: u32,
    /// From starting the agent to every map written (initial lists, BPF
    /// load and verification, and the first sync).
    pub cold_start_seconds: f64,
    /// Of that, the first sync: from the lists complete to maps written.
    pub first_sync_seconds: f64,
    /// From starting the agent to /healthz healthy: the TC programs
    /// (traffic from outside, the pods' per-packet path) verified and
    /// attached, which a fresh start does after the socket programs serve
    /// (`None`: not within two minutes, say on a kernel that refuses them).
    pub healthy_seconds: Option<f64>,
    pub changes: usize,
    /// From a change reaching the agent to its maps written (the agent's
    /// own `latency_us`), milliseconds.
    pub change_p50_ms: f64,
    pub change_p99_ms: f64,
    /// From writing the change to the API server to its maps written.
    pub change_end_to_end_p50_ms: f64,
    pub change_end_to_end_p99_ms: f64,
    /// Peak resident memory of the agent (the cold start's), and after
    /// the changes (before the restarts).
    pub peak_rss_mib: f64,
    pub rss_mib: f64,
    /// From the API server serving again (the watches resume) to the first
    /// sync applied.
    pub resync_after_restart_seconds: f64,
    /// From the API server serving again after an etcd compaction (every
    /// watch position expired: 410 Gone) to the sync after the full
    /// relists of Services and EndpointSlices.
    pub relist_seconds: f64,
    /// Peak resident memory during that relist (sampled every 10 ms).
    pub relist_peak_rss_mib: f64,
    /// Resident memory a moment after the relist.
    pub rss_after_relist_mib: f64,
    /// The agent stopped (its maps stay pinned) and started again: from
    /// the start to every map written, the maps read back and compared
    /// with the table the lists give.
    pub agent_restart_seconds: f64,
    /// Of that, the first sync: from the lists complete (and the maps
    /// read back) to maps written.
    pub agent_restart_first_sync_seconds: f64,
    /// Map writes of that first sync (none when the maps were kept whole).
    pub agent_restart_writes: u64,
    /// Peak resident memory of the restarted agent (at its first sync).
    pub agent_restart_peak_rss_mib: f64,
    /// Bytes of the Service and EndpointSlice lists the cold start read
    /// (protobuf, from the watch cache).
    pub start_list_bytes: u64,
    /// A cold start asking for JSON (`--kube-api-content-type
    /// application/json`, on maps of its own): start to every map written,
    /// its peak RSS, and the bytes of its lists.
    pub json_cold_start_seconds: f64,
    pub json_peak_rss_mib: f64,
    pub json_start_list_bytes: u64,
    /// EndpointSlice churn at each rate (`churn`).
    pub churn: Vec<crate::churn::Churn>,
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    crate::percentile::index(values.len(), p).map_or(0.0, |i| values[i])
}

/// `VmHWM` and `VmRSS` of process `pid`, MiB.
pub fn rss(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmHWM:") / 1024.0, kib("VmRSS:") / 1024.0)
}

pub fn run(settings: &Settings, n: u32) -> anyhow::Result<Control> {
    eprintln!("bench: control plane: {n} services on the test API server");
    let mut server = TestApiServer::start();
    for s in 0..n {
        server.put(spec::service_object(s));
        server.put_by(spec::SLICE_MANAGER, spec::slice_object(s, None));
    }
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_yaml(&server.url()))?;
    let cgroup = TestCgroup::create(&unique_name("ebpf-proxy-bench-cp"))?;
    let bpffs = BpfFs::mount_temp(&unique_name("ebpf-proxy-bench-cp"))?;
    let kubeconfig = kubeconfig.display().to_string();
    let start_on = |cgroup: &TestCgroup,
                    bpffs: &BpfFs,
                    flags: &[&str]|
     -> anyhow::Result<(proxy_testkit::AgentProcess, serde_json::Value, f64)> {
        let started = Instant::now();
        let source: Vec<&str> = ["--kubeconfig", &kubeconfig].into_iter().chain(flags.iter().copied()).collect();
        let agent = settings.start_agent_with(&source, cgroup.path(), bpffs.path(), FILTER)?;
        let first = first_applied(&agent, "the agent")?;
        Ok((agent, first, started.elapsed().as_secs_f64()))
    };
    let start = || start_on(&cgroup, &bpffs, &[]);
    let (mut agent, first, cold_start_seconds) = start()?;
    let first_sync_seconds = latency_ms(&first) / 1000.0;
    let healthy_seconds = healthy_after(&mut agent, &first).map(|after| cold_start_seconds + after);
    let start_list_bytes = list_bytes(&agent, "protobuf")?;

    let mut at_agent = Vec::new();
    let mut end_to_end = Vec::new();
    for k in 0..settings.changes {
        if stopping() {
            anyhow::bail!("interrupted");
        }
        // Apart from the last sync by more than the agent's batching
        // interval: each change is applied on its own, at once.
        std::thread::sleep(Duration::from_millis(30));
        let s = u32::try_from(k).unwrap_or(0).wrapping_mul(7919) % n;
        let moved = u8::try_from(k % usize::from(spec::ENDPOINTS)).unwrap_or(0);
        let mark = agent.mark();
        let written = Instant::now();
        server.put_by(spec::SLICE_MANAGER, spec::slice_object(s, Some(moved)));
        let record = agent.wait_for(mark, Duration::from_secs(30), is_applied).map_err(anyhow::Error::msg)?;
        end_to_end.push(written.elapsed().as_secs_f64() * 1000.0);
        at_agent.push(latency_ms(&record));
        // Put it back, outside the measurement.
        let mark = agent.mark();
        server.put_by(spec::SLICE_MANAGER, spec::slice_object(s, None));
        agent.wait_for(mark, Duration::from_secs(30), is_applied).map_err(anyhow::Error::msg)?;
    }
    let (peak_rss_mib, rss_mib) = rss(agent.pid());
    let mut churn = Vec::new();
    for rate in &settings.churn_rates {
        churn.push(crate::churn::run(&server, &agent, n, *rate, settings.churn_seconds)?);
    }
    let restarts = crate::relist::run(&mut server, &agent, n)?;
    drop(agent);
    // A restart of the agent (an upgrade, a crash): the maps stay pinned,
    // the new process reads them back and writes what differs.
    let (agent, first, agent_restart_seconds) = start()?;
    let agent_restart_first_sync_seconds = latency_ms(&first) / 1000.0;
    let agent_restart_writes = field(&first, "writes")
        .and_then(serde_json::Value::as_u64)
        .with_context(|| format!("an applied record without its writes: {first}"))?;
    let agent_restart_peak_rss_mib = rss(agent.pid()).0;
    drop(agent);
    // The same start in JSON, on a cgroup and pins of its own (a cold
    // start, not a restart).
    let json_cgroup = TestCgroup::create(&unique_name("ebpf-proxy-bench-json"))?;
    let json_bpffs = BpfFs::mount_temp(&unique_name("ebpf-proxy-bench-json"))?;
    let (agent, _, json_cold_start_seconds) =
        start_on(&json_cgroup, &json_bpffs, &["--kube-api-content-type", "application/json"])?;
    let json_start_list_bytes = list_bytes(&agent, "json")?;
    let json_peak_rss_mib = rss(agent.pid()).0;
    drop(agent);
    Ok(Control {
        services: n,
        endpoints: n * u32::from(spec::ENDPOINTS),
        cold_start_seconds,
        first_sync_seconds,
        healthy_seconds,
        changes: settings.changes,
        change_p50_ms: percentile(&mut at_agent, 0.5),
        change_p99_ms: percentile(&mut at_agent, 0.99),
        change_end_to_end_p50_ms: percentile(&mut end_to_end, 0.5),
        change_end_to_end_p99_ms: percentile(&mut end_to_end, 0.99),
        peak_rss_mib,
        rss_mib,
        resync_after_restart_seconds: restarts.resync_after_restart_seconds,
        relist_seconds: restarts.relist_seconds,
        relist_peak_rss_mib: restarts.relist_peak_rss_mib,
        rss_after_relist_mib: restarts.rss_after_relist_mib,
        agent_restart_seconds,
        agent_restart_first_sync_seconds,
        agent_restart_writes,
        agent_restart_peak_rss_mib,
        start_list_bytes,
        json_cold_start_seconds,
        json_peak_rss_mib,
        json_start_list_bytes,
        churn,
    })
}

/// What the bench's agents log: their syncs and lists, and where they
/// serve their metrics.
const FILTER: &str = "warn,ebpf_proxy::agent=info,ebpf_proxy::source=info,ebpf_proxy::observe::serve=info";

/// Bytes of the Service and EndpointSlice lists `agent` has read in
/// `encoding` (its `ebpf_proxy_api_received_bytes_total`).
fn list_bytes(agent: &proxy_testkit::AgentProcess, encoding: &str) -> anyhow::Result<u64> {
    let series = format!("ebpf_proxy_api_received_bytes_total{{request=\"list\",encoding=\"{encoding}\"}}");
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a byte count")]
    Ok(metric(agent, &series)? as u64)
}

/// The value of `series` (a metric's name and labels) in `agent`'s
/// /metrics.
pub fn metric(agent: &proxy_testkit::AgentProcess, series: &str) -> anyhow::Result<f64> {
    use std::io::{Read as _, Write as _};
    let served = agent
        .wait_for(0, Duration::from_secs(10), |r| message(r) == Some("serving metrics"))
        .map_err(anyhow::Error::msg)?;
    let address = field(&served, "address").and_then(serde_json::Value::as_str).context("no metrics address")?;
    let mut conn = std::net::TcpStream::connect(address)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .with_context(|| format!("no {series} in the agent's metrics"))
}

/// Seconds from `first` (the agent's first sync) to its TC programs
/// attached (`/healthz` healthy), by the two records' timestamps; `None`
/// when that is not logged within two minutes (a kernel that refuses the
/// programs), the agent ended or the bench is stopping.
fn healthy_after(agent: &mut proxy_testkit::AgentProcess, first: &serde_json::Value) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_mins(2);
    let at = |r: &serde_json::Value| r.get("timestamp")?.as_str()?.parse::<k8s_openapi::jiff::Timestamp>().ok();
    while Instant::now() < deadline && !stopping() && agent.is_running() {
        let served = |r: &serde_json::Value| message(r) == Some(ebpf_proxy::agent::OUTSIDE_SERVED);
        if let Ok(record) = agent.wait_for(0, Duration::from_secs(1), served) {
            #[expect(clippy::cast_precision_loss, reason = "microseconds far below 2^52")]
            let us = (at(&record)?.as_microsecond() - at(first)?.as_microsecond()).max(0) as f64;
            return Some(us / 1e6);
        }
    }
    None
}

/// The `latency_us` of an "applied" record, in milliseconds.
fn latency_ms(record: &serde_json::Value) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "microseconds far below 2^52")]
    let us = field(record, "latency_us").and_then(serde_json::Value::as_u64).unwrap_or(0) as f64;
    us / 1000.0
}

/// Whether `record` is the line each of the agent's syncs ends with.
pub fn is_applied(record: &serde_json::Value) -> bool {
    message(record) == Some(ebpf_proxy::agent::APPLIED)
}

/// The agent's first sync (waited for up to five minutes), which must
/// have written everything (`ensure_applied`); `who` names the agent in
/// the error.
pub fn first_applied(agent: &proxy_testkit::AgentProcess, who: &str) -> anyhow::Result<serde_json::Value> {
    let first = agent
        .wait_for(0, Duration::from_mins(5), is_applied)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{who} did not apply the services"))?;
    ensure_applied(&first)?;
    Ok(first)
}

/// Fails unless an "applied" record says every write succeeded (a map too
/// small for the services, say).
pub fn ensure_applied(record: &serde_json::Value) -> anyhow::Result<()> {
    let failures = field(record, "failures").and_then(serde_json::Value::as_u64).unwrap_or(0);
    anyhow::ensure!(failures == 0, "ebpf-proxy failed {failures} map writes (see its log): {record}");
    Ok(())
}
