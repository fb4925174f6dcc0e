//! Developer tasks: `cargo xtask setup | build | run | test | bench | docs`.
//!
//! Every task first runs `setup`, which installs what is missing (Debian
//! packages, the nightly's rust-src, bpf-linker) and is quiet when nothing is.
mod setup;

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need, if missing (idempotent).
    Setup,
    /// Build the agent (and the eBPF object it embeds).
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Build and run the agent. With no arguments: the local demo. With
    /// arguments: `ebpf-proxy run ARGS` (e.g. `--services-file FILE`).
    Run {
        #[arg(long)]
        release: bool,
        /// Arguments for `ebpf-proxy run`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run every test: unit and property tests, then the kernel tests (as
    /// root, one at a time), then the benchmark in its quick mode.
    Test {
        /// Only tests whose name contains this.
        filter: Option<String>,
    },
    /// Write docs/reference/ (the command line, the config file, the
    /// metrics) from the code; a unit test fails while they are stale.
    Docs,
    /// Benchmark ebpf-proxy side by side with kube-proxy's datapaths
    /// (release build, as root): results in target/bench/, see
    /// docs/performance.md.
    Bench {
        /// Small service counts and short runs (a few seconds).
        #[arg(long)]
        quick: bool,
        /// More arguments for ebpf-proxy-bench (see its --help).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    match cli.task {
        Task::Setup => setup::run(),
        Task::Build { release } => {
            setup::run()?;
            build(release, &["proxy-userspace"])
        }
        Task::Run { release, args } => {
            setup::run()?;
            require_root("run")?;
            build(release, &["proxy-userspace"])?;
            let bin = root.join("target").join(if release { "release" } else { "debug" }).join("ebpf-proxy");
            let mut cmd = Command::new(&bin);
            if args.is_empty() {
                cmd.arg("demo");
            } else {
                cmd.arg("run").args(&args);
            }
            exec(&mut cmd)
        }
        Task::Test { filter } => {
            setup::run()?;
            require_root("test")?;
            test(filter.as_deref())?;
            if filter.is_none() {
                quick_bench(&root)?;
            }
            Ok(())
        }
        Task::Docs => {
            setup::run()?;
            status(cargo().args(["run", "--quiet", "--package", "proxy-userspace", "--example", "reference_docs"]))
        }
        Task::Bench { quick, args } => {
            setup::run()?;
            require_root("bench")?;
            // The bench (its own crate) runs the agent binary beside it.
            build(true, &["proxy-userspace", "proxy-bench"])?;
            let bin = root.join("target/release/ebpf-proxy-bench");
            let mut cmd = Command::new(bin);
            // A quick run never overwrites the last full results.
            cmd.arg("--out").arg(root.join(if quick { "target/bench-quick" } else { "target/bench" }));
            if quick {
                cmd.arg("--quick");
            }
            status(cmd.args(&args))
        }
    }
}

/// The benchmark's quick mode on a debug build, so it never rots (its
/// numbers are not the point here). `cargo test` builds the agent (the
/// integration tests need it) but not the benchmark's binary, whose crate
/// has no integration tests: it is built here.
fn quick_bench(root: &Path) -> anyhow::Result<()> {
    println!("\nxtask: the benchmark, quick mode (debug build)");
    status(cargo().args(["build", "--package", "proxy-bench", "--package", "proxy-userspace", "--bins"]))?;
    status(
        Command::new(root.join("target/debug/ebpf-proxy-bench"))
            .arg("--quick")
            .arg("--out")
            .arg(root.join("target/bench-quick")),
    )
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_owned()
}

fn require_root(task: &str) -> anyhow::Result<()> {
    if nix_euid() != 0 {
        bail!("`cargo xtask {task}` loads eBPF programs and makes network namespaces: run it as root");
    }
    Ok(())
}

fn nix_euid() -> u32 {
    // /proc/self/status: "Uid: real effective saved fs".
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2)?.parse().ok()))
        .unwrap_or(u32::MAX)
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.env("PATH", setup::path_with_tools());
    cmd
}

/// Builds the binaries of `packages`.
fn build(release: bool, packages: &[&str]) -> anyhow::Result<()> {
    let mut cmd = cargo();
    cmd.arg("build");
    for p in packages {
        cmd.args(["--package", p]);
    }
    cmd.arg("--bins");
    if release {
        cmd.arg("--release");
    }
    status(&mut cmd)
}

fn test(filter: Option<&str>) -> anyhow::Result<()> {
    // Formatting and lints first: rustfmt and pedantic clippy are the
    // workspace's standard.
    if filter.is_none() {
        status(cargo().args(["fmt", "--all", "--check"]))?;
        status(cargo().args(["clippy", "--all-targets", "--quiet", "--", "-D", "warnings"]))?;
        clippy_ebpf()?;
        // The library's documentation builds without a warning (a broken
        // intra-doc link is one).
        status(cargo().args(["doc", "--no-deps", "--quiet"]).env("RUSTDOCFLAGS", "-D warnings"))?;
    }
    // The default members (the eBPF crate only builds for the bpf target).
    // --test-threads=1 keeps the kernel tests (namespaces, cgroups, attached
    // programs) one at a time, so their log expectations and counters stay
    // theirs.
    let mut cmd = cargo();
    cmd.args(["test", "--", "--test-threads=1"]);
    // Without root a kernel test skips itself (so `cargo test` passes for an
    // ordinary user); here it must run, so a skip fails the run instead
    // (proxy-userspace/tests/common/mod.rs).
    cmd.env("EBPF_PROXY_REQUIRE_KERNEL_TESTS", "1");
    if let Some(f) = filter {
        cmd.arg(f);
    }
    let mut child = cmd.stdout(Stdio::piped()).spawn().with_context(|| format!("running `{}`", describe(&cmd)))?;
    let mut totals = Totals::default();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        totals.add(&line);
    }
    let st = child.wait()?;
    // One closing line over every test binary (cargo's last lines are the
    // doc-test runs, which have no tests).
    println!("\nxtask: {} passed, {} failed, {} skipped", totals.passed, totals.failed, totals.ignored);
    if !st.success() {
        bail!("`{}` failed ({st})", describe(&cmd));
    }
    if totals.passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

/// Clippy on the eBPF crate, for the target it builds for (as aya lints
/// its own eBPF crates): the nightly toolchain, `core` built from source.
fn clippy_ebpf() -> anyhow::Result<()> {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", setup::NIGHTLY, "cargo", "clippy", "--package", "proxy-ebpf", "--quiet"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core", "--", "-D", "warnings"])
        .env("PATH", setup::path_with_tools());
    status(&mut cmd)
}

/// Sums of cargo's `test result: ok. N passed; M failed; K ignored; …` lines.
#[derive(Default)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Totals {
    fn add(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else { return };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else { continue };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// `program arg arg …`, for messages.
fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
}

fn status(cmd: &mut Command) -> anyhow::Result<()> {
    let st = cmd.status().with_context(|| format!("running `{}`", describe(cmd)))?;
    if !st.success() {
        bail!("`{}` failed ({st})", describe(cmd));
    }
    Ok(())
}

/// Runs `cmd` in place of this process (so Ctrl-C reaches it directly).
fn exec(cmd: &mut Command) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let err = cmd.exec();
    Err(err).with_context(|| format!("running `{}`", describe(cmd)))
}
