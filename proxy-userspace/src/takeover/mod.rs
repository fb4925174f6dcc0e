//! Taking a node over from a running kube-proxy (`ebpf-proxy run
//! --take-over-from-kube-proxy`): read kube-proxy's rules from the kernel
//! as they are (`iptables.rs`: iptables-save of both backends and
//! families; `nftables.rs`: `nft -j list table`), compare what they serve
//! with the desired table frontend by frontend (`compare.rs`), and only
//! when nothing differs remove them as `kube-proxy --cleanup` does, one
//! transaction per table (`remove.rs`). `read.rs` runs the tools,
//! `step.rs` is one attempt, `pending.rs` the agent's side of it (with the
//! handover of traffic from outside to the programs). See docs/design.md.
mod compare;
pub mod iptables;
pub(crate) mod nftables;
pub(crate) mod pending;
mod read;
mod remove;
mod step;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, SocketAddr},
};

pub use compare::{Difference, compare};
pub(crate) use read::{Tools, read_rules};
pub use remove::{KEEPER, Removed, keep_conntrack, keeper, remove_rules};
pub(crate) use step::{Outcome, RETRY, Takeover, log as log_outcome};

use crate::model::Protocol;

/// An IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    #[must_use]
    pub(crate) const fn of(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }
}

/// Where a frontend of kube-proxy's rules is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Place {
    /// One address: a ClusterIP, an externalIP, a LoadBalancer IP.
    Address(IpAddr),
    /// A nodePort: on the node's addresses of this family (kube-proxy's
    /// rules match "a local address" or its nodePortAddresses, not one
    /// address).
    NodePort(Family),
}

/// A frontend of kube-proxy's rules: where, port and protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleKey {
    pub(crate) place: Place,
    pub(crate) port: u16,
    pub(crate) protocol: Protocol,
}

impl fmt::Display for RuleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.place {
            Place::Address(IpAddr::V4(a)) => write!(f, "{a}:{}/{}", self.port, self.protocol),
            Place::Address(IpAddr::V6(a)) => write!(f, "[{a}]:{}/{}", self.port, self.protocol),
            Place::NodePort(Family::V4) => write!(f, "nodePort {}/{} (IPv4)", self.port, self.protocol),
            Place::NodePort(Family::V6) => write!(f, "nodePort {}/{} (IPv6)", self.port, self.protocol),
        }
    }
}

/// What kind of frontend a rule serves, as far as the rules tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RuleKind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
    /// An externalIP or a LoadBalancer IP (nftables mode does not tell them
    /// apart).
    External,
    /// Only a reject rule ("has no endpoints"): which kind is not written.
    NoEndpoints,
}

/// One frontend of kube-proxy's rules and every backend (DNAT destination)
/// its rules can send a new connection to, whichever client it comes
/// from: for `externalTrafficPolicy: Local`, the cluster chain (pods and
/// the node itself) and the local one together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleFrontend {
    pub(crate) kind: RuleKind,
    /// `namespace/name:port` when a comment or a chain name says it.
    pub(crate) service: Option<String>,
    /// The backends kube-proxy's rules send to.
    pub backends: BTreeSet<SocketAddr>,
}

/// Everything kube-proxy's rules serve.
pub type RuleTable = BTreeMap<RuleKey, RuleFrontend>;

/// Adds `frontend` at `key`, merging the backends of one found twice (the
/// same frontend in two rule sets).
fn insert(table: &mut RuleTable, key: RuleKey, frontend: RuleFrontend) {
    match table.get_mut(&key) {
        Some(old) => {
            old.backends.extend(frontend.backends);
            if old.service.is_none() {
                old.service = frontend.service;
            }
        }
        None => {
            table.insert(key, frontend);
        }
    }
}

/// A transport protocol as the rules write it (`tcp`, `udp`, `sctp`):
/// `None` for one ebpf-proxy does not serve (none today: SCTP is served
/// per packet), `Err` for anything else.
fn protocol(text: &str) -> Result<Option<Protocol>, String> {
    match text.to_ascii_lowercase().as_str() {
        "tcp" | "6" => Ok(Some(Protocol::Tcp)),
        "udp" | "17" => Ok(Some(Protocol::Udp)),
        "sctp" | "132" => Ok(Some(Protocol::Sctp)),
        other => Err(format!("unknown protocol {other:?}")),
    }
}

/// Error reading or removing kube-proxy's rules.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs, reason = "each field is named in its variant's #[error] message")]
pub enum Error {
    /// A command cannot be started.
    #[error("running {command}: {source}; is it installed in the agent's image and on its PATH?")]
    Spawn { command: String, source: std::io::Error },
    /// A command failed.
    #[error("{command} failed ({status}): {stderr}")]
    Failed { command: String, status: std::process::ExitStatus, stderr: String },
    /// A command's output cannot be read.
    #[error("reading the output of {command}: {reason}")]
    Parse { command: String, reason: String },
    /// Rules are still there after their removal.
    #[error("kube-proxy's rules still present after removing them: {left}")]
    Left { left: String },
}
