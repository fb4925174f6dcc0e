//! Services + EndpointSlices -> the desired service table.
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

use super::{
    ObjectRef, Problem, ServiceTable,
    frontends::SkipReason,
    input::{ServiceSpec, SliceSpec},
    state::TableState,
};

/// What the model needs to know about the node it runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeContext {
    pub(crate) node_name: String,
    /// This node's addresses (with `external_ips_local_only`, the only
    /// externalIPs clients on the node reach through the service).
    pub(crate) node_ips: Vec<IpAddr>,
    /// The node addresses NodePorts are served on (besides 127.0.0.1), by
    /// `crate::node::nodeport_addresses::serving` (here, all of `node_ips`).
    pub(crate) node_port_ips: Vec<IpAddr>,
    /// NodePorts are served on 127.0.0.1 too (nodePortAddresses admits
    /// 127.0.0.0/8).
    pub(crate) node_port_loopback: bool,
    /// This node's `topology.kubernetes.io/zone`, for zone hints.
    pub(crate) zone: Option<String>,
    /// Most backends one frontend may have (its slot array).
    pub(crate) max_backends: usize,
    /// Clients on the node reach an externalIP through the service only
    /// when it is one of `node_ips` (a mitigation of CVE-2020-8554);
    /// otherwise every externalIP, as kube-proxy does.
    pub(crate) external_ips_local_only: bool,
    /// How a service without the lb-algorithm annotation balances
    /// (`--lb-algorithm`).
    pub(crate) lb_algorithm: super::LbAlgorithm,
}

/// The Node label that names its zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Whether `node` should get traffic from load balancers: not being
/// deleted, not tainted for deletion by the autoscaler (kube-proxy's
/// `nodeEligible`, pkg/proxy/healthcheck).
#[must_use]
pub fn node_eligible(node: &Node) -> bool {
    let deleted = node.metadata.deletion_timestamp.is_some();
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
    !deleted && !tainted
}

impl NodeContext {
    /// The context of node `node_name`, every other setting at its default.
    #[must_use]
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            node_ips: Vec::new(),
            node_port_ips: Vec::new(),
            node_port_loopback: true,
            zone: None,
            max_backends: usize::from(u16::MAX),
            external_ips_local_only: false,
            lb_algorithm: super::LbAlgorithm::Random,
        }
    }

    /// With these node addresses, all of them serving NodePorts.
    #[must_use]
    pub fn with_ips(self, ips: Vec<IpAddr>) -> Self {
        Self { node_port_ips: ips.clone(), node_ips: ips, ..self }
    }

    /// This node's context from its Node object among `nodes`: the zone
    /// label, and the InternalIP and ExternalIP addresses.
    #[must_use]
    pub(crate) fn from_nodes<'a>(node_name: &str, nodes: impl IntoIterator<Item = &'a Node>) -> Self {
        let node = nodes.into_iter().find(|n| n.metadata.name.as_deref() == Some(node_name));
        let zone = node.and_then(|n| n.metadata.labels.as_ref()?.get(ZONE_LABEL).cloned());
        let node_ips = node
            .and_then(|n| n.status.as_ref()?.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
            .filter_map(|a| a.address.parse().ok())
            .collect();
        Self { zone, ..Self::new(node_name) }.with_ips(node_ips)
    }
}

/// A `healthCheckNodePort` this node serves (LoadBalancer services with
/// externalTrafficPolicy: Local): load balancers probe it to learn whether
/// the node has endpoints of the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    pub(crate) service: ObjectRef,
    pub(crate) port: u16,
    /// Ready endpoints of the service on this node.
    pub(crate) local_endpoints: usize,
}

/// The result of a translation: the table, and what could not be used.
#[derive(Debug, Default)]
pub struct Translation {
    /// The desired service table.
    pub table: ServiceTable,
    /// What could not be used, and why.
    pub problems: Vec<Problem>,
    /// Services deliberately not programmed, and why.
    pub skipped: Vec<(ObjectRef, SkipReason)>,
    /// Health check ports to serve, by port.
    pub health_checks: Vec<HealthCheck>,
}

/// Translates services and their slices into the frontends of this node.
///
/// Deterministic: the same objects give the same table whatever their order
/// (a key two services ask for goes to the first by namespace and name).
/// Takes the model's inputs, or anything that converts into them (the
/// source converts API objects: tests and tools pass those).
pub fn translate<'a, S, E>(
    services: impl IntoIterator<Item = &'a S>,
    slices: impl IntoIterator<Item = &'a E>,
    node: &NodeContext,
) -> Translation
where
    S: 'a,
    E: 'a,
    &'a S: Into<ServiceSpec>,
    &'a E: Into<SliceSpec>,
{
    let services: Vec<ServiceSpec> = services.into_iter().map(Into::into).collect();
    let slices: Vec<SliceSpec> = slices.into_iter().map(Into::into).collect();
    let mut state = TableState::default();
    state.replace_all(&services, &slices, node);
    let problems = state.problems().cloned().collect();
    let skipped = state.skipped().collect();
    let health_checks = state.health_checks();
    // The table is moved out, not copied.
    Translation { table: state.into_table(), problems, skipped, health_checks }
}
