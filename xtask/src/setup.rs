//! `cargo xtask setup`: installs what is missing, says nothing when nothing is.
//!
//! - Debian packages: LLVM 22 development files (bpf-linker links against
//!   them), bpftool, the clients and tools the tests and demo use (kubectl
//!   from kubernetes-client when none is on PATH), and iptables and
//!   nftables for the benchmark;
//! - the nightly toolchain's rust-src (the eBPF crate builds `core` with
//!   `-Z build-std`) and clippy (to lint the eBPF crate for its target);
//! - bpf-linker 0.13 built against Debian's LLVM 22.
use std::{
    env,
    ffi::OsString,
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "libxml2-dev",
    "bpftool",
    "iproute2",
    "curl",
    "socat",
    "python3",
    "util-linux",
    // The benchmark's kube-proxy-shaped rule sets.
    "iptables",
    "nftables",
];
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const BPF_LINKER_VERSION: &str = "0.13";
pub const NIGHTLY: &str = "nightly";

pub fn run() -> anyhow::Result<()> {
    apt_packages()?;
    rust_src()?;
    bpf_linker()?;
    Ok(())
}

/// `PATH` with cargo's bin directory in front (where bpf-linker goes).
pub fn path_with_tools() -> OsString {
    let mut dirs = vec![cargo_home().join("bin")];
    if let Some(path) = env::var_os("PATH") {
        dirs.extend(env::split_paths(&path));
    }
    env::join_paths(dirs).expect("PATH entries have no ':'")
}

fn cargo_home() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
}

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).env("PATH", path_with_tools()).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run_loud(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("running `{}`", crate::describe(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", crate::describe(cmd));
    }
    Ok(())
}

fn apt_packages() -> anyhow::Result<()> {
    let mut missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|pkg| {
            output("dpkg-query", &["-W", "-f=${Status}", pkg]).is_none_or(|s| !s.contains("install ok installed"))
        })
        .collect();
    // kubectl (for `kubectl kustomize deploy/` in the tests): any on PATH
    // will do, else Debian's.
    if output("kubectl", &["version", "--client"]).is_none() {
        missing.push("kubernetes-client");
    }
    if missing.is_empty() {
        return Ok(());
    }
    println!("setup: installing Debian packages: {}", missing.join(" "));
    run_loud(Command::new("apt-get").args(["update", "-qq"]))?;
    run_loud(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn rust_src() -> anyhow::Result<()> {
    let toolchains = output("rustup", &["toolchain", "list"]).context("rustup is needed to build the eBPF crate")?;
    if !toolchains.lines().any(|l| l.starts_with(NIGHTLY)) {
        println!("setup: installing the {NIGHTLY} toolchain");
        run_loud(Command::new("rustup").args(["toolchain", "install", NIGHTLY, "--profile", "minimal"]))?;
    }
    let installed = output("rustup", &["component", "list", "--toolchain", NIGHTLY, "--installed"]).unwrap_or_default();
    // rust-src to build `core` for the bpf target; clippy to lint the eBPF
    // crate for it (`cargo xtask test`).
    for component in ["rust-src", "clippy"] {
        if !installed.lines().any(|l| l.starts_with(component)) {
            println!("setup: adding {component} to the {NIGHTLY} toolchain");
            run_loud(Command::new("rustup").args(["component", "add", component, "--toolchain", NIGHTLY]))?;
        }
    }
    Ok(())
}

fn bpf_linker() -> anyhow::Result<()> {
    let present = output("bpf-linker", &["--version"]).is_some_and(|v| v.contains(&format!(" {BPF_LINKER_VERSION}.")));
    if present {
        return Ok(());
    }
    println!("setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (a few minutes, once)");
    let mut path = OsString::from(format!("{LLVM_PREFIX}/bin:"));
    path.push(path_with_tools());
    run_loud(
        Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["install", "bpf-linker", "--version", &format!("^{BPF_LINKER_VERSION}"), "--force"])
            .args(["--no-default-features", "--features", "llvm-22"])
            .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
            .env("PATH", path),
    )
}
