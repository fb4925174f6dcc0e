//! The inspection commands as a shell pipeline uses them: a reader that
//! stops early (`| head -1`) closes the pipe, and the command exits quietly
//! (no panic, no error), as Unix tools do.
mod common;

use std::{os::fd::OwnedFd, process::Stdio};

use common::{Env, web};

/// A pipe whose reading end is already closed: every write to it fails
/// with EPIPE (the agent's binary ignores SIGPIPE, as every Rust program).
fn closed_pipe() -> OwnedFd {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    write
}

#[test]
fn every_subcommand_exits_quietly_when_the_reader_is_gone() {
    common::require_root!();
    let mut env = Env::new(1);
    env.write_services(&web(&[1]));
    env.start_agent();
    let pins = env.pin_dir().display().to_string();
    for args in [
        vec!["service", "list", "-o", "json", "--bpffs-dir", &pins],
        vec!["service", "list", "--bpffs-dir", &pins],
        vec!["service", "get", "10.96.0.10:80", "-o", "json", "--bpffs-dir", &pins],
        vec!["status", "--bpffs-dir", &pins],
        vec!["status", "-o", "json", "--bpffs-dir", &pins],
        vec!["completion", "bash"],
    ] {
        let out = std::process::Command::new(common::AGENT)
            .args(&args)
            .stdout(Stdio::from(closed_pipe()))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?}: {stderr}", out.status);
        assert!(stderr.is_empty(), "{args:?} was not quiet: {stderr}");
    }
}
