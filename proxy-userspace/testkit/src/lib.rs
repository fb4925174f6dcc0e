//! Test support for the kernel tests and the benchmark (a dev-only crate:
//! the shipped `ebpf-proxy` does not link it): the agent binary as a child
//! process whose JSON log is read, an API server that speaks the list/watch
//! protocol, UDP backends; and, re-exported from `ebpf_proxy::sandbox` (the
//! demo needs them too), the guards that create a network namespace, a
//! cgroup v2 child and a private bpffs and remove them on drop, HTTP
//! backends and clients that run inside the namespace and cgroup; veths
//! made to behave like NICs for XDP (`veth_xdp`).
//!
//! Safety rule: nothing here sends traffic from the machine's own network
//! namespace. Servers are bound inside a test namespace; clients are
//! started inside it.
mod agent;
pub mod apiserver;
mod udp;
pub mod veth_xdp;

pub use agent::{AgentProcess, field, message};
pub use apiserver::{TestApiServer, kubeconfig_yaml};
pub use ebpf_proxy::sandbox::{BpfFs, ClientCommand, HttpBackend, NetNs, TestCgroup, sh, spawn_in};
pub use udp::UdpBackend;

/// A name unique to this process and call, for namespaces and cgroups.
#[must_use]
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}
