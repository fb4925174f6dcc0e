//! Builds the eBPF object (proxy-ebpf, for the bpf target, with the nightly
//! toolchain and bpf-linker) into OUT_DIR, where `datapath::loader` embeds it,
//! and names the commit the binary is built from (`EBPF_PROXY_COMMIT`, for
//! `--version`).
use std::{path::Path, process::Command};

use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    println!("cargo:rustc-env=EBPF_PROXY_COMMIT={}", commit());
    // aya-build passes every line the inner cargo prints on as a
    // `cargo:warning`, so its "Compiling ..." progress would show as dozens
    // of warnings on each fresh build. Quiet, it prints only what matters:
    // compiler diagnostics and errors still come through.
    // SAFETY: the build script is single-threaded here; nothing else reads
    // the environment concurrently.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../proxy-ebpf");
    let package = Package { name: "proxy-ebpf", root_dir, ..Default::default() };
    aya_build::build_ebpf([package], Toolchain::default())
}

/// `git describe --always --dirty` of the checkout, or "unknown" when this
/// is not built from one (a source tarball) or git is missing: never fails
/// the build. Reruns when HEAD moves or the branch it names gets a commit.
fn commit() -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let git = |args: &[&str]| {
        Command::new("git")
            // The checkout may belong to another user than the builder.
            .args(["-c", "safe.directory=*"])
            .arg("-C")
            .arg(&repo)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    // A tarball unpacked inside some other checkout is not that checkout.
    let top = git(&["rev-parse", "--show-toplevel"]).and_then(|t| Path::new(&t).canonicalize().ok());
    if top.is_none() || top != repo.canonicalize().ok() {
        return "unknown".to_owned();
    }
    // The git directory (a worktree's own, when built from one).
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let git_dir = Path::new(&git_dir);
        println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
        if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
            // The branch's file (absent when packed: then packed-refs).
            println!("cargo:rerun-if-changed={}", git_dir.join(&head_ref).display());
            println!("cargo:rerun-if-changed={}", git_dir.join("packed-refs").display());
        }
        // `--dirty` follows the working tree: the index changes with it.
        println!("cargo:rerun-if-changed={}", git_dir.join("index").display());
    }
    git(&["describe", "--always", "--dirty", "--abbrev=12"]).unwrap_or_else(|| "unknown".to_owned())
}
