//! The pure model: Services and EndpointSlices in (in the model's own
//! compact form, `input`, which the source converts API objects into),
//! the desired service table out. No I/O, no aya, no kube client: every
//! Kubernetes rule of the proxy lives here and is tested without a kernel.
mod endpoints;
pub(crate) mod explain;
mod frontends;
mod input;
mod object_ids;
pub(crate) mod packed;
mod problem;
mod service;

#[cfg(test)]
pub(crate) use service::NoLocalEndpoints;
mod state;
mod table;

use std::{collections::BTreeMap, fmt, net::IpAddr};

pub(crate) use frontends::SkipReason;
pub use input::{
    Address, AddressType, Annotation, EndpointHints, EndpointSpec, IngressSpec, Placement, PlacementData,
    ServicePortSpec, ServiceSpec, ServiceType, SlicePortSpec, SliceSpec,
};
pub use problem::{DEFAULT_NAMESPACE, ObjectRef, Problem, Severity, UNNAMED};
pub use state::{Delta, ServiceId, ServiceInput, SliceId, TableState};
pub use table::{HealthCheck, NodeContext, TO_BE_DELETED_TAINT, Translation, ZONE_LABEL, node_eligible, translate};

/// The loopback address NodePorts are also served on (as kube-proxy's
/// iptables mode does), for processes on the node.
pub(crate) const NODE_PORT_LOOPBACK: std::net::Ipv4Addr = std::net::Ipv4Addr::LOCALHOST;

/// Transport protocol of a frontend or backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// Served per packet only (the TC programs; the kernel runs no
    /// socket-address hook of ours for SCTP sockets in a cgroup).
    Sctp,
}

impl Protocol {
    /// The IP protocol number.
    #[must_use]
    pub(crate) const fn number(self) -> u8 {
        match self {
            Self::Tcp => proxy_common::proto::TCP,
            Self::Udp => proxy_common::proto::UDP,
            Self::Sctp => proxy_common::proto::SCTP,
        }
    }

    #[must_use]
    pub(crate) const fn from_number(n: u8) -> Option<Self> {
        match n {
            proxy_common::proto::TCP => Some(Self::Tcp),
            proxy_common::proto::UDP => Some(Self::Udp),
            proxy_common::proto::SCTP => Some(Self::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        })
    }
}

/// Which clients use a frontend entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Every client, unless an `External` twin serves traffic from outside.
    #[default]
    All,
    /// Traffic from outside the node, where it differs from what clients on
    /// the node get (externalTrafficPolicy: Local).
    External,
}

/// What clients connect to: a service address, port and protocol, and the
/// scope of the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey {
    /// The service address.
    pub addr: IpAddr,
    /// The service port.
    pub port: u16,
    pub(crate) protocol: Protocol,
    pub(crate) scope: Scope,
}

impl FrontendKey {
    /// A scope `All` key.
    #[must_use]
    pub const fn new(addr: IpAddr, port: u16, protocol: Protocol) -> Self {
        Self { addr, port, protocol, scope: Scope::All }
    }

    /// The same address, port and protocol in scope `scope`.
    #[must_use]
    pub const fn with_scope(self, scope: Scope) -> Self {
        Self { scope, ..self }
    }
}

impl fmt::Display for FrontendKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}/{}", self.port, self.protocol)?,
            IpAddr::V6(a) => write!(f, "[{a}]:{}/{}", self.port, self.protocol)?,
        }
        if self.scope == Scope::External { f.write_str(" (external)") } else { Ok(()) }
    }
}

/// Whether a backend is a ready endpoint or a serving-and-terminating one
/// used because the service has no ready endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendState {
    /// A ready endpoint.
    Active,
    /// A serving and terminating endpoint.
    Terminating,
}

/// One endpoint address and port a frontend sends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    /// The endpoint's address.
    pub addr: IpAddr,
    /// The endpoint's port.
    pub port: u16,
    /// Ready, or terminating.
    pub state: BackendState,
    /// The endpoint runs on this node (its `nodeName`): traffic from
    /// outside reaches it without source NAT.
    pub local: bool,
}

/// How a frontend picks a backend for a new connection: the annotation
/// `ebpf-proxy.io/lb-algorithm` (`LB_ALGORITHM_ANNOTATION`), else the
/// node's `--lb-algorithm`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LbAlgorithm {
    /// A backend at random (traffic from outside: by the Maglev table, so
    /// that every node picks alike). What kube-proxy does.
    #[default]
    Random,
    /// The one of two backends picked at random with fewer active
    /// connections (counted in the kernel).
    LeastConnections,
    /// As `Random` (Cilium's name for how it balances traffic from
    /// outside, which is what this proxy does for it anyway).
    Maglev,
}

/// The annotation that chooses a service's `LbAlgorithm`.
pub(crate) const LB_ALGORITHM_ANNOTATION: &str = "ebpf-proxy.io/lb-algorithm";

impl LbAlgorithm {
    /// Every value, in the order the help lists them.
    pub(crate) const ALL: [Self; 3] = [Self::Random, Self::LeastConnections, Self::Maglev];

    /// The value as the annotation and `--lb-algorithm` write it.
    #[must_use]
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::LeastConnections => "least-connections",
            Self::Maglev => "maglev",
        }
    }

    /// The algorithm a value names (exactly as written).
    #[must_use]
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == value)
    }
}

impl fmt::Display for LbAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How traffic from outside reaches a frontend's backend on another node:
/// the annotation `ebpf-proxy.io/nodeport-mode`
/// (`NODEPORT_MODE_ANNOTATION`), else the node's `--nodeport-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Forwarding {
    /// Source NAT to the node's address: the replies come back through
    /// this node.
    Snat,
    /// Direct server return: the client's address kept, the replies
    /// straight from the backend's node (TCP and UDP alike).
    Dsr,
}

/// The annotation that chooses a service's `Forwarding`.
pub(crate) const NODEPORT_MODE_ANNOTATION: &str = "ebpf-proxy.io/nodeport-mode";

impl Forwarding {
    /// Every value, in the order messages list them.
    pub(crate) const ALL: [Self; 2] = [Self::Snat, Self::Dsr];

    /// The value as the annotation writes it.
    #[must_use]
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Snat => "snat",
            Self::Dsr => "dsr",
        }
    }

    /// The mode a value names (exactly as written).
    #[must_use]
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == value)
    }
}

impl fmt::Display for Forwarding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
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
    /// One of `spec.externalIPs`.
    ExternalIp,
}

impl FrontendKind {
    #[must_use]
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::ClusterIp => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::LoadBalancer => "LoadBalancer",
            Self::ExternalIp => "ExternalIP",
        }
    }
}

/// Where the clients of a frontend entry are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reach {
    /// Processes on the node (the socket programs) only: ClusterIPs,
    /// NodePorts on 127.0.0.1, and the entries that have an `External` twin.
    #[default]
    LocalClients,
    /// Processes on the node and traffic from outside (the TC programs).
    Both,
    /// Traffic from outside only: `External` twins, and externalIPs that are
    /// not this node's with `external_ips_local_only` (not taken over for
    /// local clients: CVE-2020-8554).
    Outside,
}

impl Reach {
    /// Whether traffic from outside the node uses the entry.
    #[must_use]
    #[allow(clippy::wrong_self_convention, reason = "a question (is it reached from outside?), not a conversion")]
    pub(crate) const fn from_outside(self) -> bool {
        matches!(self, Self::Both | Self::Outside)
    }
}

/// The service port a frontend comes from: its Service (namespace and
/// name, the id the store and the model share) and the port's name (empty
/// for an unnamed port). Shared, not copied: every frontend of a service
/// port (ClusterIP, NodePorts, external addresses), the table's and the
/// reconciler's and telemetry's, holds the same two pointers (at 100,000
/// services, allocations a frontend less for each holder).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePort {
    service: ServiceId,
    port: std::sync::Arc<str>,
}

impl ServicePort {
    /// The port `port` (its name; empty: unnamed) of Service `namespace/name`.
    #[must_use]
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>, port: impl AsRef<str>) -> Self {
        Self::of(ServiceId::new(namespace.as_ref(), name.as_ref()), port.as_ref())
    }

    /// Port `port` of `service` (its id shared).
    #[must_use]
    pub(crate) fn of(service: ServiceId, port: &str) -> Self {
        Self { service, port: port.into() }
    }

    #[must_use]
    pub(crate) fn namespace(&self) -> &str {
        self.service.namespace()
    }

    #[must_use]
    pub(crate) fn name(&self) -> &str {
        self.service.name()
    }

    /// The port's name (empty for an unnamed port).
    #[must_use]
    pub(crate) fn port(&self) -> &str {
        &self.port
    }

    /// Whether `other` holds the very same strings (not only equal ones).
    #[must_use]
    pub(crate) fn shares(&self, other: &Self) -> bool {
        self.service.shares(&other.service) && std::sync::Arc::ptr_eq(&self.port, &other.port)
    }

    /// Takes `other`'s shared strings (also when equal to the ones held,
    /// so that no second copy stays); whether the value differed.
    pub(crate) fn adopt(&mut self, other: &Self) -> bool {
        if self.shares(other) {
            return false;
        }
        let differed = self != other;
        other.clone_into(self);
        differed
    }
}

/// `namespace/name:port-name`.
impl fmt::Display for ServicePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.service, self.port)
    }
}

/// A frontend with the backends it spreads new connections over, in slot
/// order (active first, then by address and port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend {
    /// The service port it comes from.
    pub service_port: ServicePort,
    /// The backends, in slot order.
    pub backends: Vec<Backend>,
    /// `sessionAffinity: ClientIP`: how long (seconds) a client keeps its
    /// backend after its last connection.
    pub affinity_timeout: Option<u32>,
    /// What kind of address it is (ClusterIP, NodePort, ...).
    pub kind: FrontendKind,
    /// Which clients reach it: on the node, from outside, or both.
    pub reach: Reach,
    /// loadBalancerSourceRanges: traffic from outside is accepted only from
    /// these (`None`: from anywhere; `Some(empty)`: from nowhere).
    pub source_ranges: Option<Vec<ipnet::IpNet>>,
    /// How a new connection picks its backend.
    pub lb_algorithm: LbAlgorithm,
    /// How traffic from outside reaches a backend on another node, when
    /// the service's annotation says (`None`: the node's `--nodeport-mode`;
    /// always `None` on a frontend only clients on the node reach).
    pub forwarding: Option<Forwarding>,
}

impl Frontend {
    /// A ClusterIP-like entry for local clients with these backends.
    #[must_use]
    pub fn new(service_port: ServicePort, kind: FrontendKind, backends: Vec<Backend>) -> Self {
        Self {
            service_port,
            backends,
            affinity_timeout: None,
            kind,
            reach: Reach::LocalClients,
            source_ranges: None,
            lb_algorithm: LbAlgorithm::Random,
            forwarding: None,
        }
    }
}

/// The desired service table: every frontend the node must translate.
pub type ServiceTable = BTreeMap<FrontendKey, Frontend>;

/// The table as text, one frontend a line (`ADDR:PORT/PROTO -> B1 B2 ...`,
/// terminating backends marked `~`, this node's marked `(local)`), for
/// logs and golden-file tests.
#[must_use]
pub fn render(table: &ServiceTable) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (key, frontend) in table {
        let _ = write!(out, "{key} {}", frontend.service_port);
        if frontend.kind != FrontendKind::ClusterIp {
            let _ = write!(out, " {}", frontend.kind.as_str());
            let _ = match frontend.reach {
                Reach::LocalClients => write!(out, " local-clients"),
                Reach::Both => Ok(()),
                Reach::Outside => write!(out, " outside-only"),
            };
        }
        if let Some(ranges) = &frontend.source_ranges {
            let ranges: Vec<String> = ranges.iter().map(ToString::to_string).collect();
            let _ = write!(out, " sources={}", if ranges.is_empty() { "none".to_owned() } else { ranges.join(",") });
        }
        if let Some(t) = frontend.affinity_timeout {
            let _ = write!(out, " affinity={t}s");
        }
        if frontend.lb_algorithm != LbAlgorithm::Random {
            let _ = write!(out, " lb={}", frontend.lb_algorithm);
        }
        if let Some(forwarding) = frontend.forwarding {
            let _ = write!(out, " forward={forwarding}");
        }
        out.push_str(" ->");
        if frontend.backends.is_empty() {
            out.push_str(" (none)");
        }
        for b in &frontend.backends {
            let mark = if b.state == BackendState::Terminating { "~" } else { "" };
            let local = if b.local { "(local)" } else { "" };
            let _ = match b.addr {
                IpAddr::V4(a) => write!(out, " {mark}{a}:{}{local}", b.port),
                IpAddr::V6(a) => write!(out, " {mark}[{a}]:{}{local}", b.port),
            };
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
