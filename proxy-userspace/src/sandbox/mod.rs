//! What `ebpf-proxy demo` runs in: guards that create a network namespace,
//! a cgroup v2 child and a private bpffs and remove them on drop (also on an
//! error), HTTP backends bound inside the namespace, and clients started
//! inside it. The kernel tests and the benchmark use the same guards through
//! the dev-only crate `proxy-testkit` (proxy-userspace/testkit), which adds
//! what only they need (the agent as a child process, the list/watch API
//! server, UDP backends).
//!
//! Safety rule: nothing here sends traffic from the machine's own network
//! namespace. Servers are bound inside a namespace made here; clients are
//! started inside it.
mod bpffs;
mod cgroup;
mod client;
mod http;
mod netns;

pub use bpffs::BpfFs;
pub use cgroup::TestCgroup;
pub use client::{ClientCommand, spawn_in};
pub use http::HttpBackend;
pub use netns::NetNs;

use std::process::Command;

/// Runs a command, failing with its output when it fails.
pub fn sh(program: &str, args: &[&str]) -> std::io::Result<String> {
    let out = Command::new(program).args(args).output()?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(std::io::Error::other(format!(
            "{program} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        )))
    }
}
