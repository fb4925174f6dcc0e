//! Test support shared by the kernel tests, the demo and the benchmark:
//! guards that create a network namespace, a cgroup v2 child and a private
//! bpffs, and remove them on drop (also when a test fails); backends;
//! clients that run inside the namespace and cgroup; an API server that
//! speaks the list/watch protocol.
//!
//! Safety rule: nothing here sends traffic from the machine's own network
//! namespace. Servers are bound inside a test namespace; clients are
//! started inside it.
mod agent;
pub mod apiserver;
mod bpffs;
mod cgroup;
mod client;
mod http;
mod netns;
mod udp;

pub use agent::{AgentProcess, field, message};
pub use apiserver::{TestApiServer, kubeconfig_yaml};
pub use bpffs::BpfFs;
pub use cgroup::TestCgroup;
pub use client::{ClientCommand, spawn_in};
pub use http::HttpBackend;
pub use netns::NetNs;
pub use udp::UdpBackend;

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

/// A name unique to this process and call, for namespaces and cgroups.
#[must_use]
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}
