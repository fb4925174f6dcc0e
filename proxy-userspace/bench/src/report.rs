//! The results as JSON and as a markdown table, with the machine they
//! were measured on.
use std::fmt::Write as _;

use serde::Serialize;

use super::{
    control::Control,
    datapath::{Row, RuleLoad},
};

#[derive(Debug, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
    pub memory_gib: f64,
}

impl Machine {
    #[must_use]
    pub fn this() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map_or_else(|| "unknown".to_owned(), |c| c.trim().to_owned());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        Self {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            kernel: nix::sys::utsname::uname()
                .map_or_else(|_| "unknown".into(), |u| u.release().to_string_lossy().into_owned()),
            memory_gib: memory_kib / 1024.0 / 1024.0,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub quick: bool,
    pub seconds_per_run: f64,
    pub rounds: usize,
    pub client_threads: usize,
    pub datapath: Vec<Row>,
    /// The outside path (NodePort), `outside.rs`.
    pub outside: Vec<Row>,
    /// The pods' path (ClusterIP from a pod's namespace), `pods.rs`.
    pub pods: Vec<Row>,
    pub rule_loads: Vec<RuleLoad>,
    /// The control plane, one per service count measured.
    pub control: Vec<Control>,
    /// Balancing by load (`balance.rs`).
    pub balance: Vec<super::balance::BalanceRow>,
    /// Variants that could not run here, and why.
    pub unavailable: Vec<String>,
}

impl Report {
    #[must_use]
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        let _ = writeln!(
            out,
            "Measured on {} ({} cores, {:.0} GiB), kernel {}; {} round(s) of {} s per variant and mode, {} client threads, variants interleaved.\n",
            m.cpu, m.cores, m.memory_gib, m.kernel, self.rounds, self.seconds_per_run, self.client_threads
        );
        // A control-only run (`--control-only`) has no datapath tables.
        datapath_tables(&mut out, &self.datapath, "", "direct");
        // The outside path (NodePort), when measured.
        datapath_tables(
            &mut out,
            &self.outside,
            "The outside path (a client outside -> an entry node's NodePort -> backends on another node). ",
            "direct (routed through the entry node)",
        );
        datapath_tables(
            &mut out,
            &self.pods,
            "The pods' path (a client in a pod's namespace -> its node -> backends on another node; ebpf-proxy per packet with --socket-lb host-namespace, at the socket with all). ",
            "direct (routed through the node)",
        );
        super::balance::markdown(&mut out, &self.balance);
        if !self.rule_loads.is_empty() {
            let _ = writeln!(out, "Loading the service set (10 endpoints per service):\n");
            let _ = writeln!(out, "| services | tool | seconds |\n|---:|---|---:|");
            for l in &self.rule_loads {
                let _ = writeln!(out, "| {} | {} | {:.2} |", l.services, l.tool, l.seconds);
            }
        }
        for c in &self.control {
            control_table(&mut out, c);
        }
        if !self.unavailable.is_empty() {
            let _ = writeln!(out, "\nNot measured here: {}.", self.unavailable.join("; "));
        }
        out
    }
}

/// The new-connection and kept-connection tables of `rows` (none when
/// empty), titles starting with `intro`, ratios to `base`.
fn datapath_tables(out: &mut String, rows: &[Row], intro: &str, base: &str) {
    if rows.is_empty() {
        return;
    }
    for (mode, title) in [
        (
            "short",
            "New connections (connect, 32 bytes each way, close): connections/s, ratio to {base}, connect latency p50/p99",
        ),
        ("keep", "Requests on kept connections: requests/s, ratio to {base}, request latency p50/p99"),
        (
            "bulk",
            "Throughput on kept connections (64 KiB sent and echoed back, one connection per client thread): MiB/s each way, ratio to {base}, round trip of a chunk p50/p99",
        ),
    ] {
        if !rows.iter().any(|r| r.mode == mode) {
            continue;
        }
        let _ = writeln!(out, "{intro}{}:\n", title.replace("{base}", base));
        let mut variants: Vec<&str> = Vec::new();
        for r in rows.iter().filter(|r| r.mode == mode) {
            if !variants.contains(&r.variant) {
                variants.push(r.variant);
            }
        }
        let _ = writeln!(out, "| services | {} |", variants.join(" | "));
        let _ = writeln!(out, "|---:|{}", "---:|".repeat(variants.len()));
        let mut sizes: Vec<u32> = rows.iter().map(|r| r.services).collect();
        sizes.dedup();
        for n in sizes {
            let cells: Vec<String> = variants
                .iter()
                .map(|v| {
                    rows.iter().find(|r| r.services == n && r.mode == mode && r.variant == *v).map_or_else(
                        String::new,
                        |r| {
                            format!(
                                "{} ({:.2}x) {:.0}/{:.0} us{}",
                                rate(mode, r.ops_per_second),
                                r.ratio,
                                r.p50_us,
                                r.p99_us,
                                if r.errors > 0 { format!(", {} errors", r.errors) } else { String::new() }
                            )
                        },
                    )
                })
                .collect();
            let _ = writeln!(out, "| {n} | {} |", cells.join(" | "));
        }
        out.push('\n');
    }
}

/// A rate of `mode`'s operations: per second, or for bulk, MiB per second
/// (one operation moves `BULK_CHUNK` bytes each way).
fn rate(mode: &str, ops_per_second: f64) -> String {
    if mode == "bulk" {
        #[expect(clippy::cast_precision_loss, reason = "a small constant")]
        let chunk = super::load::BULK_CHUNK as f64;
        format!("{:.0} MiB/s", ops_per_second * chunk / f64::from(1 << 20))
    } else {
        format!("{ops_per_second:.0}/s")
    }
}

/// The control plane's table at one service count.
fn control_table(out: &mut String, c: &Control) {
    let _ = writeln!(
        out,
        "\nControl plane, {} services x 10 endpoints from the API server (the repo's list/watch test server):\n",
        c.services
    );
    let _ = writeln!(out, "| measure | value |\n|---|---:|");
    let _ = writeln!(out, "| start to every map written | {:.2} s |", c.cold_start_seconds);
    let _ = writeln!(out, "| of which the first sync | {:.2} s |", c.first_sync_seconds);
    let healthy = c.healthy_seconds.map_or_else(|| "not within 2 minutes".to_owned(), |s| format!("{s:.2} s"));
    let _ = writeln!(out, "| start to /healthz healthy (the TC programs verified and attached) | {healthy} |");
    let _ = writeln!(
        out,
        "| one endpoint change, at the agent, p50 / p99 ({} changes) | {:.2} / {:.2} ms |",
        c.changes, c.change_p50_ms, c.change_p99_ms
    );
    let _ = writeln!(
        out,
        "| one endpoint change, API write to maps written, p50 / p99 | {:.2} / {:.2} ms |",
        c.change_end_to_end_p50_ms, c.change_end_to_end_p99_ms
    );
    let _ = writeln!(out, "| agent peak RSS | {:.1} MiB |", c.peak_rss_mib);
    let _ = writeln!(out, "| agent RSS after the changes | {:.1} MiB |", c.rss_mib);
    let _ = writeln!(
        out,
        "| API server restart: serving again to first sync applied | {:.2} s |",
        c.resync_after_restart_seconds
    );
    let _ = writeln!(
        out,
        "| restart after a compaction (410 Gone): serving again to the sync after the relists | {:.2} s |",
        c.relist_seconds
    );
    let _ = writeln!(out, "| agent peak RSS during the relist | {:.1} MiB |", c.relist_peak_rss_mib);
    let _ = writeln!(out, "| agent RSS after the relist | {:.1} MiB |", c.rss_after_relist_mib);
    let _ = writeln!(
        out,
        "| agent restart (maps pinned): start to every map written | {:.2} s ({} writes) |",
        c.agent_restart_seconds, c.agent_restart_writes
    );
    let _ = writeln!(out, "| of which the first sync | {:.2} s |", c.agent_restart_first_sync_seconds);
    let _ = writeln!(out, "| agent peak RSS after its restart | {:.1} MiB |", c.agent_restart_peak_rss_mib);
    let mib = |bytes: u64| {
        #[expect(clippy::cast_precision_loss, reason = "bytes far below 2^52")]
        let bytes = bytes as f64;
        bytes / f64::from(1 << 20)
    };
    let _ = writeln!(out, "| bytes of the start's lists, protobuf | {:.1} MiB |", mib(c.start_list_bytes));
    let _ = writeln!(
        out,
        "| a start asking for JSON: to every map written, peak RSS, bytes of its lists | {:.2} s, {:.1} MiB, {:.1} MiB |",
        c.json_cold_start_seconds,
        c.json_peak_rss_mib,
        mib(c.json_start_list_bytes)
    );
    for churn in &c.churn {
        let _ = writeln!(
            out,
            "| churn at {}/s ({:.0}/s written, {} updates, {} syncs): API write to maps written p50 / p99 / max | {:.2} / {:.2} / {:.2} ms |",
            churn.rate, churn.achieved_rate, churn.updates, churn.syncs, churn.p50_ms, churn.p99_ms, churn.max_ms
        );
        let _ = writeln!(
            out,
            "| churn at {}/s: agent CPU, peak RSS, RSS after, watch errors, updates not applied | {:.2} cores, {:.1} MiB, {:.1} MiB, {}, {} |",
            churn.rate, churn.agent_cpu_cores, churn.peak_rss_mib, churn.rss_mib, churn.watch_errors, churn.unapplied
        );
    }
}
