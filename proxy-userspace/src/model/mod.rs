//! The pure model: Kubernetes Services and EndpointSlices in, the desired
//! service table out. No I/O, no aya, no kube client: every Kubernetes rule
//! of the proxy lives here and is tested without a kernel.
mod endpoints;
mod frontends;
mod problem;
mod table;

use std::{collections::BTreeMap, fmt, net::IpAddr};

pub use problem::{ObjectRef, Problem, Severity};
pub use table::{NodeContext, Translation, ZONE_LABEL, translate};

/// The loopback address NodePorts are also served on (as kube-proxy's
/// iptables mode does), for processes on the node.
pub const NODE_PORT_LOOPBACK: std::net::Ipv4Addr = std::net::Ipv4Addr::LOCALHOST;

/// Transport protocol of a frontend or backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// The IP protocol number.
    #[must_use]
    pub const fn number(self) -> u8 {
        match self {
            Self::Tcp => proxy_common::proto::TCP,
            Self::Udp => proxy_common::proto::UDP,
        }
    }

    #[must_use]
    pub const fn from_number(n: u8) -> Option<Self> {
        match n {
            proxy_common::proto::TCP => Some(Self::Tcp),
            proxy_common::proto::UDP => Some(Self::Udp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
        })
    }
}

/// What clients connect to: a service address, port and protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey {
    pub addr: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

impl fmt::Display for FrontendKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}/{}", self.port, self.protocol),
            IpAddr::V6(a) => write!(f, "[{a}]:{}/{}", self.port, self.protocol),
        }
    }
}

/// Whether a backend is a ready endpoint or a serving-and-terminating one
/// used because the service has no ready endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendState {
    Active,
    Terminating,
}

/// One endpoint address and port a frontend sends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    pub addr: IpAddr,
    pub port: u16,
    pub state: BackendState,
}

/// How clients reach a frontend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrontendKind {
    /// The service's ClusterIP.
    #[default]
    ClusterIp,
    /// A node address (or 127.0.0.1) and the port's nodePort.
    NodePort,
    /// A `status.loadBalancer.ingress[].ip`.
    LoadBalancer,
    /// One of `spec.externalIPs` that is this node's address.
    ExternalIp,
}

impl FrontendKind {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ClusterIp => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::LoadBalancer => "LoadBalancer",
            Self::ExternalIp => "ExternalIP",
        }
    }
}

/// A frontend with the backends it spreads new connections over, in slot
/// order (active first, then by address and port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend {
    /// `namespace/name:port-name` of the service port it comes from.
    pub service_port: String,
    pub backends: Vec<Backend>,
    /// `sessionAffinity: ClientIP`: how long (seconds) a client keeps its
    /// backend after its last connection.
    pub affinity_timeout: Option<u32>,
    pub kind: FrontendKind,
}

/// The desired service table: every frontend the node must translate.
pub type ServiceTable = BTreeMap<FrontendKey, Frontend>;

/// The table as text, one frontend a line (`ADDR:PORT/PROTO -> B1 B2 ...`,
/// terminating backends marked `~`), for logs and golden-file tests.
#[must_use]
pub fn render(table: &ServiceTable) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (key, frontend) in table {
        let _ = write!(out, "{key} {}", frontend.service_port);
        if frontend.kind != FrontendKind::ClusterIp {
            let _ = write!(out, " {}", frontend.kind.as_str());
        }
        if let Some(t) = frontend.affinity_timeout {
            let _ = write!(out, " affinity={t}s");
        }
        out.push_str(" ->");
        if frontend.backends.is_empty() {
            out.push_str(" (none)");
        }
        for b in &frontend.backends {
            let mark = if b.state == BackendState::Terminating { "~" } else { "" };
            let _ = match b.addr {
                IpAddr::V4(a) => write!(out, " {mark}{a}:{}", b.port),
                IpAddr::V6(a) => write!(out, " {mark}[{a}]:{}", b.port),
            };
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
