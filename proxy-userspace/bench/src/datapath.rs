//! The datapath comparison for one service count: every variant serves the
//! same services to the same workload, the variants interleaved round by
//! round so drift hits them all alike.
use std::{
    collections::BTreeMap,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use proxy_testkit::{BpfFs, NetNs, TestCgroup, spawn_in, unique_name};
use serde::Serialize;

use super::{
    Settings,
    load::{LoadResult, Mode},
    net::{BenchNet, Variant},
    rules,
    server::Servers,
    spec::{self, BACKEND_PORT, ENDPOINTS, SERVICE_PORT},
    stopping,
};

/// One variant's numbers for one service count and mode.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub services: u32,
    pub mode: &'static str,
    pub variant: &'static str,
    pub ops_per_second: f64,
    /// Over the direct variant's rate.
    pub ratio: f64,
    /// Median over rounds of each round's percentile, microseconds.
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
}

/// How long loading a rule set took.
#[derive(Clone, Debug, Serialize)]
pub struct RuleLoad {
    pub services: u32,
    pub tool: &'static str,
    pub seconds: f64,
}

/// What the comparison at one service count measured.
pub struct Run {
    pub rows: Vec<Row>,
    pub loads: Vec<RuleLoad>,
    /// Variants left out because their rule set took longer to load than
    /// the limit, each with why.
    pub too_slow: Vec<String>,
}

/// Runs the comparison for `n` services. A kube-proxy variant whose rule
/// set does not load within `settings.rule_load_limit` is left out.
pub fn run(settings: &Settings, n: u32) -> anyhow::Result<Run> {
    let mut variants = settings.variants.clone();
    let net = BenchNet::new(&variants).context("making the bench namespaces")?;
    let _servers = Servers::start(&net.backends).context("starting the backends")?;
    let dir = tempfile::tempdir()?;
    let direct = dir.path().join("direct.txt");
    let vips = dir.path().join("vips.txt");
    write_targets(
        &direct,
        (0..n).flat_map(|s| (0..ENDPOINTS).map(move |i| format!("{}:{BACKEND_PORT}", spec::endpoint(s, i)))),
    )?;
    write_targets(&vips, (0..n).map(|s| format!("{}:{SERVICE_PORT}", spec::vip(s))))?;

    let mut loads = Vec::new();
    let mut too_slow = Vec::new();
    let iptables = dir.path().join("iptables.rules");
    std::fs::write(&iptables, rules::iptables(n))?;
    let nft = dir.path().join("nftables.rules");
    std::fs::write(&nft, rules::nftables(n))?;
    for (variant, tool, args, file) in [
        (Variant::IptablesNft, "iptables-nft-restore", &[][..], &iptables),
        (Variant::IptablesLegacy, "iptables-legacy-restore", &[], &iptables),
        (Variant::Nftables, "nft", &["-f", "-"], &nft),
    ] {
        if !variants.contains(&variant) {
            continue;
        }
        eprintln!("bench: {n} services: loading {tool}");
        match load_within_limit(settings, net.client(variant), [tool, variant.name()], args, file, n)? {
            Ok(seconds) => loads.push(RuleLoad { services: n, tool, seconds }),
            Err(note) => {
                too_slow.push(note);
                variants.retain(|v| *v != variant);
            }
        }
    }
    let variants = variants.as_slice();

    eprintln!("bench: {n} services: starting ebpf-proxy");
    let cgroup = TestCgroup::create(&unique_name("ebpf-proxy-bench"))?;
    let bpffs = BpfFs::mount_temp(&unique_name("ebpf-proxy-bench"))?;
    let services = dir.path().join("services.yaml");
    std::fs::write(&services, spec::services_yaml(n))?;
    let started = Instant::now();
    let agent = settings.start_agent(
        ["--services-file", &services.display().to_string()],
        cgroup.path(),
        bpffs.path(),
        "warn,ebpf_proxy::agent=info",
    )?;
    super::control::first_applied(&agent, "ebpf-proxy")?;
    loads.push(RuleLoad { services: n, tool: "ebpf-proxy (services file)", seconds: started.elapsed().as_secs_f64() });

    // Warm up every path once (ARP, caches), then measure.
    let runner = Runner { settings, net: &net, cgroup: &cgroup, direct: &direct, vips: &vips };
    for variant in variants {
        runner.run(*variant, Mode::Short, settings.seconds.min(0.5))?;
    }
    let results = interleave(n, settings, variants, &[Mode::Short, Mode::Keep], Variant::name, |v, mode, seconds| {
        runner.run(v, mode, seconds)
    })?;
    drop(agent);
    Ok(Run { rows: rows(n, &results, Variant::Direct, Variant::name), loads, too_slow })
}

/// Measures every variant in each of `modes`, `settings.rounds` rounds of
/// `settings.seconds` each, the variants interleaved (each round starts
/// one later) so drift hits them all alike; `run` does one load run.
pub fn interleave<V: Copy + Ord>(
    n: u32,
    settings: &Settings,
    variants: &[V],
    modes: &[Mode],
    name: impl Fn(V) -> &'static str,
    run: impl Fn(V, Mode, f64) -> anyhow::Result<LoadResult>,
) -> anyhow::Result<BTreeMap<(Mode, V), Vec<LoadResult>>> {
    let mut results: BTreeMap<(Mode, V), Vec<LoadResult>> = BTreeMap::new();
    for round in 0..settings.rounds {
        for mode in modes.iter().copied() {
            for k in 0..variants.len() {
                let variant = variants[(k + round) % variants.len()];
                if stopping() {
                    bail!("interrupted");
                }
                let r = run(variant, mode, settings.seconds)?;
                eprintln!(
                    "bench: {n} services, round {}, {}, {}: {:.0}/s p50 {:.0} us p99 {:.0} us, {} errors",
                    round + 1,
                    mode.name(),
                    name(variant),
                    ops_rate(&r),
                    r.p50_us,
                    r.p99_us,
                    r.errors
                );
                results.entry((mode, variant)).or_default().push(r);
            }
        }
    }
    Ok(results)
}

pub fn write_targets(path: &Path, lines: impl Iterator<Item = String>) -> std::io::Result<()> {
    let text: String = lines.map(|l| l + "\n").collect();
    std::fs::write(path, text)
}

/// A lane's variant of the outside or pods' path (`outside.rs`, `pods.rs`).
pub trait LaneVariant: Copy + PartialEq {
    fn name(self) -> &'static str;
    /// A kube-proxy variant's rule loader: tool (`nft` takes the nftables
    /// rules, the others the iptables ones), arguments, and its name in the
    /// load table.
    fn loader(self) -> Option<(&'static str, &'static [&'static str], &'static str)>;
}

/// Writes kube-proxy's rules for `n` services of the bench part `part`
/// (`rules`: iptables-restore and nft input) into `dir` and loads them for
/// each kube-proxy variant of `variants`, in its namespace (`ns`);
/// variants whose rules do not load within the limit are taken out of
/// `variants`. The load times, and why each left-out variant is.
pub fn load_kube_proxy_rules<'a, V: LaneVariant>(
    settings: &Settings,
    (n, part): (u32, &str),
    dir: &Path,
    rules: [String; 2],
    variants: &mut Vec<V>,
    ns: impl Fn(V) -> &'a NetNs,
) -> anyhow::Result<(Vec<RuleLoad>, Vec<String>)> {
    let [iptables_rules, nft_rules] = rules;
    let (iptables, nft) = (dir.join("iptables.rules"), dir.join("nftables.rules"));
    std::fs::write(&iptables, iptables_rules)?;
    std::fs::write(&nft, nft_rules)?;
    let (mut loads, mut left_out) = (Vec::new(), Vec::new());
    for variant in variants.clone() {
        let Some((tool, args, label)) = variant.loader() else { continue };
        let file = if tool == "nft" { &nft } else { &iptables };
        eprintln!("bench: {part}, {n} services: loading {tool}");
        let what = [tool, &format!("{} ({part})", variant.name())];
        match load_within_limit(settings, ns(variant), what, args, file, n)? {
            Ok(seconds) => loads.push(RuleLoad { services: n, tool: label, seconds }),
            Err(note) => {
                left_out.push(note);
                variants.retain(|v| *v != variant);
            }
        }
    }
    Ok((loads, left_out))
}

/// Loads `file` with `tool` (`what[0]`) for variant `what[1]` within
/// `settings.rule_load_limit`: the seconds it took, or (`Err`) why the
/// variant is left out at `n` services.
pub fn load_within_limit(
    settings: &Settings,
    ns: &NetNs,
    what: [&str; 2],
    args: &[&str],
    file: &Path,
    n: u32,
) -> anyhow::Result<Result<f64, String>> {
    let [tool, variant] = what;
    let limit = Duration::from_secs_f64(settings.rule_load_limit);
    Ok(load_rules(ns, tool, args, file, limit)?.ok_or_else(|| {
        eprintln!("bench: {n} services: {tool} did not finish within {limit:?}; {variant} left out");
        format!(
            "{variant} at {n} services: left out, its rules did not load within {} s ({tool})",
            settings.rule_load_limit
        )
    }))
}

/// Loads `file` with `tool ARGS` inside `ns`; returns the seconds it took
/// (`None`: it took longer than `limit`, and was stopped).
fn load_rules(ns: &NetNs, tool: &str, args: &[&str], file: &Path, limit: Duration) -> anyhow::Result<Option<f64>> {
    let started = Instant::now();
    let mut child = spawn_in(ns, None, tool)?
        .args(args)
        .stdin(std::fs::File::open(file)?)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {tool} (apt package iptables or nftables)"))?;
    while child.try_wait()?.is_none() {
        if started.elapsed() > limit || stopping() {
            // The tool this function started, by its own handle.
            child.kill()?;
            child.wait()?;
            if stopping() {
                bail!("interrupted");
            }
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let seconds = started.elapsed().as_secs_f64();
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "{tool} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(Some(seconds))
}

struct Runner<'a> {
    settings: &'a Settings,
    net: &'a BenchNet,
    cgroup: &'a TestCgroup,
    direct: &'a Path,
    vips: &'a Path,
}

impl Runner<'_> {
    /// One load run of `seconds` through `variant`.
    fn run(&self, variant: Variant, mode: Mode, seconds: f64) -> anyhow::Result<LoadResult> {
        let (targets, cgroup) = match variant {
            Variant::Direct => (self.direct, None),
            Variant::Ebpf => (self.vips, Some(self.cgroup)),
            _ => (self.vips, None),
        };
        load_in(self.net.client(variant), cgroup, targets, mode, seconds, self.settings.threads)
            .with_context(|| format!("the load client in {}", variant.name()))
    }
}

/// One load run of `seconds` against `targets`, by a client process in
/// `ns` (and `cgroup`).
pub fn load_in(
    ns: &NetNs,
    cgroup: Option<&TestCgroup>,
    targets: &Path,
    mode: Mode,
    seconds: f64,
    threads: usize,
) -> anyhow::Result<LoadResult> {
    let exe = std::env::current_exe()?;
    let out = spawn_in(ns, cgroup, &exe.to_string_lossy())?
        .args(["load", "--targets"])
        .arg(targets)
        .args(["--mode", mode.name(), "--seconds", &seconds.to_string()])
        .args(["--threads", &threads.to_string()])
        .stderr(Stdio::inherit())
        .output()?;
    ensure!(out.status.success(), "the load client failed");
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
fn ops_rate(r: &LoadResult) -> f64 {
    if r.seconds > 0.0 { r.ops as f64 / r.seconds } else { 0.0 }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// The rows of `results` (by mode and variant), each with its ratio to
/// `direct`'s rate in the same mode.
pub fn rows<V: Copy + Ord>(
    n: u32,
    results: &BTreeMap<(Mode, V), Vec<LoadResult>>,
    direct: V,
    name: impl Fn(V) -> &'static str,
) -> Vec<Row> {
    let rate = |runs: &[LoadResult]| {
        let seconds: f64 = runs.iter().map(|r| r.seconds).sum();
        #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        let ops = runs.iter().map(|r| r.ops).sum::<u64>() as f64;
        if seconds > 0.0 { ops / seconds } else { 0.0 }
    };
    let mut out = Vec::new();
    for ((mode, variant), runs) in results {
        let direct = results.get(&(*mode, direct)).map_or(0.0, |r| rate(r));
        let ops = rate(runs);
        out.push(Row {
            services: n,
            mode: mode.name(),
            variant: name(*variant),
            ops_per_second: ops,
            ratio: if direct > 0.0 { ops / direct } else { 0.0 },
            p50_us: median(runs.iter().map(|r| r.p50_us).collect()),
            p99_us: median(runs.iter().map(|r| r.p99_us).collect()),
            errors: runs.iter().map(|r| r.errors).sum(),
        });
    }
    // By mode name; within a mode, in the variants' order (the map's, kept
    // by the stable sort).
    out.sort_by_key(|r| r.mode);
    out
}
