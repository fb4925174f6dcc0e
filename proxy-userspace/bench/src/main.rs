//! `ebpf-proxy-bench`: ebpf-proxy side by side with kube-proxy's
//! datapaths (iptables on iptables-nft and iptables-legacy, nftables; IPVS
//! where the kernel has it) and the direct path, in the bench's own network
//! namespaces; and the agent's control plane. Run by `cargo xtask bench`.
mod balance;
mod churn;
mod control;
mod datapath;
mod load;
mod net;
mod nodeport_rules;
mod outside;
mod percentile;
mod plot;
mod pods;
mod relist;
mod report;
mod rules;
mod server;
mod spec;

use std::{
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[expect(clippy::struct_excessive_bools, reason = "command-line flags, each its own switch")]
#[command(name = "ebpf-proxy-bench", about = "ebpf-proxy side by side with kube-proxy's datapaths")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// A few seconds: small service counts, short runs (run by `cargo
    /// xtask test`, so the bench never rots).
    #[arg(long)]
    quick: bool,
    /// Service counts to measure (10 endpoints each; default 1, 1000,
    /// 10000, 30000 and 100000).
    #[arg(long, value_delimiter = ',')]
    services: Option<Vec<u32>>,
    /// Seconds per run of one variant and mode.
    #[arg(long)]
    seconds: Option<f64>,
    /// Rounds over all variants.
    #[arg(long)]
    rounds: Option<usize>,
    /// Client threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Service counts of the control-plane measurement (default 10000 and
    /// 100000).
    #[arg(long, value_delimiter = ',')]
    control_services: Option<Vec<u32>>,
    /// Seconds a kube-proxy variant's rule set may take to load; a variant
    /// whose load takes longer is left out at that service count (the
    /// report says so).
    #[arg(long, default_value_t = 120.0)]
    rule_load_limit: f64,
    /// Only the control-plane measurement (no datapath runs).
    #[arg(long)]
    control_only: bool,
    /// Single-endpoint changes to time.
    #[arg(long)]
    changes: Option<usize>,
    /// EndpointSlice updates per second of the churn runs (each for
    /// --churn-seconds, at every control-plane count; default 1000 and
    /// 5000, 200 with --quick).
    #[arg(long, value_delimiter = ',')]
    churn_rates: Option<Vec<u32>>,
    /// Seconds of each churn run (default 30; 2 with --quick).
    #[arg(long)]
    churn_seconds: Option<f64>,
    /// Where to write results.json, results.md and the plots (*.svg).
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// The ebpf-proxy binary (default: next to this one).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Show the agent's log (on standard error).
    #[arg(long)]
    agent_log: bool,
    /// Only these datapath variants (direct, the base of the ratios, is
    /// always measured); default: all.
    #[arg(long, value_enum, value_delimiter = ',')]
    variants: Option<Vec<net::Variant>>,
    /// Service counts of the outside path, NodePort services (default 1,
    /// 1000 and 10000; 100 with --quick).
    #[arg(long, value_delimiter = ',')]
    outside_services: Option<Vec<u32>>,
    /// Only these outside-path variants (direct is always measured);
    /// default: all the agent has.
    #[arg(long, value_enum, value_delimiter = ',')]
    outside_variants: Option<Vec<outside::Variant>>,
    /// Only the outside path (no ClusterIP datapath, no control plane).
    #[arg(long)]
    outside_only: bool,
    /// Service counts of the pods' path, ClusterIP services reached from a
    /// pod's namespace through its node (default 1, 1000 and 10000; 100
    /// with --quick).
    #[arg(long, value_delimiter = ',')]
    pod_services: Option<Vec<u32>>,
    /// Only these pods'-path variants (direct is always measured);
    /// default: all.
    #[arg(long, value_enum, value_delimiter = ',')]
    pod_variants: Option<Vec<pods::Variant>>,
    /// Only the pods' path (per packet against the socket, kube-proxy and
    /// direct).
    #[arg(long)]
    pods_only: bool,
    /// Only balancing by load: a service of three backends, one ten times
    /// slower, through lb-algorithm random, least-connections and
    /// kube-proxy's iptables mode; and the cost of the choice with equal
    /// backends.
    #[arg(long)]
    balance_only: bool,
    /// Leave out balancing by load.
    #[arg(long)]
    no_balance: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Write the plots of a stored results.json (connections.svg,
    /// start.svg, rss.svg) into the directory that holds it.
    Plot { results: PathBuf },
    /// (Internal) the client workload, run inside a client namespace.
    #[command(hide = true)]
    Load {
        #[arg(long)]
        targets: PathBuf,
        #[arg(long, value_enum)]
        mode: load::Mode,
        #[arg(long)]
        seconds: f64,
        #[arg(long)]
        threads: usize,
    },
}

/// What a run measures.
pub struct Settings {
    pub agent: PathBuf,
    pub seconds: f64,
    pub rounds: usize,
    pub threads: usize,
    pub changes: usize,
    pub agent_log: bool,
    /// The datapath variants measured, direct first.
    pub variants: Vec<net::Variant>,
    /// Seconds a kube-proxy rule set may take to load.
    pub rule_load_limit: f64,
    /// EndpointSlice updates per second of the churn runs, and their
    /// length.
    pub churn_rates: Vec<u32>,
    pub churn_seconds: f64,
}

impl Settings {
    /// Starts the agent with `args`, logging at `filter`.
    /// Starts the agent on `source` (its `--services-file` or
    /// `--kubeconfig` flag), attached to `cgroup` with its pins in `bpffs`,
    /// no TC devices and its HTTP servers on free loopback ports.
    pub fn start_agent(
        &self,
        source: [&str; 2],
        cgroup: &std::path::Path,
        bpffs: &std::path::Path,
        filter: &str,
    ) -> std::io::Result<proxy_testkit::AgentProcess> {
        self.start_agent_with(&source, cgroup, bpffs, filter)
    }

    /// `start_agent` with `source` and further flags.
    pub fn start_agent_with(
        &self,
        source: &[&str],
        cgroup: &std::path::Path,
        bpffs: &std::path::Path,
        filter: &str,
    ) -> std::io::Result<proxy_testkit::AgentProcess> {
        let (cgroup, pins) = (cgroup.display().to_string(), bpffs.join("ebpf-proxy").display().to_string());
        let common = [
            "--cgroup",
            &cgroup,
            "--bpffs-dir",
            &pins,
            "--node-name",
            "bench",
            "--devices",
            "none",
            "--pod-devices",
            "none",
            "--healthz-bind-address",
            "127.0.0.1:0",
            "--metrics-bind-address",
            "127.0.0.1:0",
        ];
        let args: Vec<&str> = source.iter().chain(&common).copied().collect();
        if self.agent_log {
            proxy_testkit::AgentProcess::start_with_filter(&self.agent, args, filter)
        } else {
            proxy_testkit::AgentProcess::start_quiet(&self.agent, args, filter)
        }
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

/// Whether SIGINT or SIGTERM arrived: the bench stops and removes what it
/// made.
pub fn stopping() -> bool {
    STOP.load(Ordering::Relaxed)
}

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn catch_signals() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Command::Load { targets, mode, seconds, threads }) = cli.command {
        let result = load::run(&targets, mode, seconds, threads)?;
        println!("{}", serde_json::to_string(&result)?);
        return Ok(());
    }
    if let Some(Command::Plot { results }) = &cli.command {
        let text = std::fs::read_to_string(results).with_context(|| format!("reading {}", results.display()))?;
        let dir = results.parent().unwrap_or(std::path::Path::new("."));
        for (name, svg) in plot::plots(&serde_json::from_str(&text)?) {
            std::fs::write(dir.join(name), svg)?;
            eprintln!("bench: wrote {}", dir.join(name).display());
        }
        return Ok(());
    }
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "the bench makes network namespaces and loads eBPF: run it as root"
    );
    catch_signals();
    let agent = match cli.agent {
        Some(path) => path,
        None => std::env::current_exe()?.with_file_name("ebpf-proxy"),
    };
    anyhow::ensure!(agent.exists(), "no ebpf-proxy binary at {}; build it (cargo xtask bench does)", agent.display());
    let quick = cli.quick;
    let sizes =
        cli.services.unwrap_or_else(|| if quick { vec![1, 100] } else { vec![1, 1000, 10_000, 30_000, 100_000] });
    let control_sizes = cli.control_services.unwrap_or_else(|| if quick { vec![100] } else { vec![10_000, 100_000] });
    anyhow::ensure!(
        sizes.iter().chain(&control_sizes).all(|n| *n >= 1 && *n <= spec::MAX_SERVICES),
        "service counts are 1-{}",
        spec::MAX_SERVICES
    );
    let settings = Settings {
        agent,
        seconds: cli.seconds.unwrap_or(if quick { 0.5 } else { 3.0 }),
        rounds: cli.rounds.unwrap_or(if quick { 1 } else { 3 }),
        threads: cli.threads,
        changes: cli.changes.unwrap_or(if quick { 5 } else { 100 }),
        agent_log: cli.agent_log,
        variants: {
            let chosen = cli.variants.unwrap_or_else(|| net::Variant::ALL.to_vec());
            net::Variant::ALL.into_iter().filter(|v| *v == net::Variant::Direct || chosen.contains(v)).collect()
        },
        rule_load_limit: cli.rule_load_limit,
        churn_rates: cli.churn_rates.unwrap_or_else(|| if quick { vec![200] } else { vec![1000, 5000] }),
        churn_seconds: cli.churn_seconds.unwrap_or(if quick { 2.0 } else { 30.0 }),
    };
    let mut report = report::Report {
        machine: report::Machine::this(),
        quick,
        seconds_per_run: settings.seconds,
        rounds: settings.rounds,
        client_threads: settings.threads,
        datapath: Vec::new(),
        outside: Vec::new(),
        pods: Vec::new(),
        rule_loads: Vec::new(),
        control: Vec::new(),
        balance: Vec::new(),
        unavailable: vec![ipvs_missing()],
    };
    // --outside-only, --balance-only: neither the ClusterIP comparison
    // nor the control plane.
    let only = cli.outside_only || cli.balance_only || cli.pods_only;
    let (sizes, control_sizes) = if only { (Vec::new(), Vec::new()) } else { (sizes, control_sizes) };
    if !(cli.no_balance || cli.control_only || cli.outside_only || cli.pods_only) {
        report.balance = balance::run(&settings).context("the balancing bench")?;
    }
    for n in sizes.into_iter().filter(|_| !cli.control_only) {
        let run = datapath::run(&settings, n).with_context(|| format!("the datapath bench at {n} services"))?;
        report.datapath.extend(run.rows);
        report.rule_loads.extend(run.loads);
        report.unavailable.extend(run.too_slow);
    }
    if !(cli.control_only || cli.balance_only || cli.pods_only) {
        outside::run_all(&settings, cli.outside_services, cli.outside_variants.as_deref(), &mut report)?;
    }
    if !(cli.control_only || cli.balance_only || cli.outside_only) {
        pods::run_all(&settings, cli.pod_services, cli.pod_variants.as_deref(), &mut report)?;
    }
    for n in control_sizes {
        report.control.push(control::run(&settings, n).context("the control-plane bench")?);
    }
    std::fs::create_dir_all(&cli.out)?;
    let markdown = report.markdown();
    let results = serde_json::to_value(&report)?;
    std::fs::write(cli.out.join("results.json"), serde_json::to_string_pretty(&results)?)?;
    // docs/performance.md shows these.
    for (name, svg) in plot::plots(&results) {
        std::fs::write(cli.out.join(name), svg)?;
    }
    std::fs::write(cli.out.join("results.md"), &markdown)?;
    println!("{markdown}");
    eprintln!("bench: results in {}", cli.out.display());
    Ok(())
}

/// Why IPVS is not compared: this kernel has no IPVS (the bench looks).
fn ipvs_missing() -> String {
    let available = std::path::Path::new("/proc/net/ip_vs").exists()
        || std::fs::read_to_string("/proc/modules").is_ok_and(|m| m.lines().any(|l| l.starts_with("ip_vs ")));
    if available {
        "IPVS (kube-proxy's IPVS mode): not yet driven by the bench".to_owned()
    } else {
        "IPVS (kube-proxy's IPVS mode): this kernel has no IPVS".to_owned()
    }
}
