//! Services + EndpointSlices -> the desired service table.
use std::{
    collections::{BTreeMap, btree_map::Entry},
    net::IpAddr,
};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};

use super::{
    Frontend, FrontendKey, FrontendKind, ObjectRef, Problem, Reach, Scope, ServiceTable,
    endpoints::{self, Selection},
    frontends::{self, PortSpec, ServiceFrontends, SkipReason},
};

/// What the model needs to know about the node it runs on.
#[derive(Clone, Debug)]
pub struct NodeContext {
    pub node_name: String,
    /// This node's addresses: externalIPs are served only when they are one
    /// of them.
    pub node_ips: Vec<IpAddr>,
    /// The node addresses NodePorts are served on (besides 127.0.0.1): all
    /// of `node_ips` unless nodePortAddresses narrows them.
    pub node_port_ips: Vec<IpAddr>,
    /// This node's `topology.kubernetes.io/zone`, for zone hints.
    pub zone: Option<String>,
    /// Most backends one frontend may have (its slot array).
    pub max_backends: usize,
}

/// The Node label that names its zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

impl NodeContext {
    #[must_use]
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            node_ips: Vec::new(),
            node_port_ips: Vec::new(),
            zone: None,
            max_backends: usize::from(u16::MAX),
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
    pub fn from_nodes<'a>(node_name: &str, nodes: impl IntoIterator<Item = &'a Node>) -> Self {
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
    pub service: ObjectRef,
    pub port: u16,
    /// Ready endpoints of the service on this node.
    pub local_endpoints: usize,
}

/// The result of a translation: the table, and what could not be used.
#[derive(Debug, Default)]
pub struct Translation {
    pub table: ServiceTable,
    pub problems: Vec<Problem>,
    /// Services deliberately not programmed, and why.
    pub skipped: Vec<(ObjectRef, SkipReason)>,
    /// Health check ports to serve, by port.
    pub health_checks: Vec<HealthCheck>,
}

/// Translates services and their slices into the frontends of this node.
///
/// Deterministic: the same objects give the same table whatever their order.
pub fn translate<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node: &NodeContext,
) -> Translation {
    let mut out = Translation::default();
    let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        if let Some(owner) = endpoints::owning_service(slice) {
            by_service.entry(owner).or_default().push(slice);
        }
    }
    let mut services: Vec<&Service> = services.into_iter().collect();
    services.sort_by_key(|s| frontends::object_ref(s));

    for svc in services {
        let svc_frontends = match frontends::service_frontends(svc, &mut out.problems) {
            Ok(f) => f,
            Err(reason) => {
                out.skipped.push((frontends::object_ref(svc), reason));
                continue;
            }
        };
        let object = &svc_frontends.object;
        let owner = (object.namespace.clone(), object.name.clone());
        let mut slices: Vec<&EndpointSlice> = by_service.get(&owner).cloned().unwrap_or_default();
        slices.sort_by_key(|s| endpoints::object_ref(s));
        for slice in &slices {
            endpoints::unmatched_slice_ports(slice, &svc_frontends.ports, &mut out.problems);
        }
        let families: Vec<bool> = svc_frontends.addrs.iter().map(IpAddr::is_ipv6).collect();
        for (i, port) in svc_frontends.ports.iter().enumerate() {
            // Backends per (family, endpoint selection), computed once.
            let mut cache: BTreeMap<(bool, Endpoints), Vec<super::Backend>> = BTreeMap::new();
            for planned in port_frontends(&svc_frontends, port, i, node, &families) {
                let ipv6 = planned.addr.is_ipv6();
                let backends = cache
                    .entry((ipv6, planned.endpoints))
                    .or_insert_with(|| {
                        let selection = planned.endpoints.selection(&svc_frontends, node);
                        endpoints::backends_for_port(object, port, ipv6, &slices, &selection, &mut out.problems)
                    })
                    .clone();
                let key = FrontendKey {
                    addr: planned.addr,
                    port: planned.port,
                    protocol: port.protocol,
                    scope: planned.scope,
                };
                let from_outside = planned.reach.from_outside();
                let frontend = Frontend {
                    service_port: format!("{}/{}:{}", object.namespace, object.name, port.name),
                    backends,
                    affinity_timeout: svc_frontends.affinity_timeout,
                    kind: planned.kind,
                    reach: planned.reach,
                    source_ranges: svc_frontends
                        .source_ranges
                        .clone()
                        .filter(|_| from_outside && planned.kind != FrontendKind::ExternalIp),
                };
                match out.table.entry(key) {
                    Entry::Vacant(v) => {
                        v.insert(frontend);
                    }
                    Entry::Occupied(o) => out.problems.push(Problem::error(
                        object,
                        planned.field,
                        format!("{key} is already served by {}; skipped", o.get().service_port),
                    )),
                }
            }
        }
        if let Some(port) = svc_frontends.health_check_node_port {
            let local_endpoints = endpoints::local_ready_endpoints(&slices, &node.node_name);
            out.health_checks.push(HealthCheck { service: object.clone(), port, local_endpoints });
        }
    }
    out.health_checks.sort_by_key(|h| h.port);
    out
}

/// Which endpoints a frontend entry uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Endpoints {
    /// ClusterIPs: internalTrafficPolicy decides.
    Internal,
    /// Every endpoint (zone hints followed): local clients of NodePorts,
    /// LoadBalancer IPs and externalIPs, and traffic from outside with
    /// externalTrafficPolicy: Cluster.
    Cluster,
    /// This node's endpoints: traffic from outside with
    /// externalTrafficPolicy: Local.
    LocalNode,
}

impl Endpoints {
    fn selection<'a>(self, svc: &ServiceFrontends, node: &'a NodeContext) -> Selection<'a> {
        let this_node = Some(node.node_name.as_str());
        let (local_node, zone) = match self {
            // Zone hints apply to cluster-wide traffic, not to Local.
            Self::Internal if svc.internal_local => (this_node, None),
            Self::Internal | Self::Cluster => (None, node.zone.as_deref()),
            Self::LocalNode => (this_node, None),
        };
        Selection { local_node, zone, node_name: &node.node_name, max_backends: node.max_backends }
    }
}

/// One entry a service port gets in the table.
struct Planned {
    addr: IpAddr,
    port: u16,
    kind: FrontendKind,
    scope: Scope,
    reach: Reach,
    endpoints: Endpoints,
    /// The field it comes from, for problems.
    field: String,
}

/// Every entry one service port gets on this node: its ClusterIPs; its
/// nodePort on each node address and on 127.0.0.1; its LoadBalancer ingress
/// IPs; its externalIPs. Local clients reach all endpoints through all of
/// them (as kube-proxy sends in-cluster traffic to cluster endpoints), but
/// never an externalIP that is not this node's (CVE-2020-8554). Traffic
/// from outside reaches the node addresses, LoadBalancer IPs and every
/// externalIP; with externalTrafficPolicy: Local it gets a twin entry of
/// scope `External` with this node's endpoints only. Only the families the
/// service has.
fn port_frontends(
    svc: &ServiceFrontends,
    port: &PortSpec,
    index: usize,
    node: &NodeContext,
    families: &[bool],
) -> Vec<Planned> {
    let has = |ip: &IpAddr| families.contains(&ip.is_ipv6());
    let mut out: Vec<Planned> = svc
        .addrs
        .iter()
        .map(|addr| Planned {
            addr: *addr,
            port: port.port,
            kind: FrontendKind::ClusterIp,
            scope: Scope::All,
            reach: Reach::LocalClients,
            endpoints: Endpoints::Internal,
            field: "spec.clusterIP".to_owned(),
        })
        .collect();
    if let Some(np) = port.node_port {
        let field = format!("spec.ports[{index}].nodePort");
        for ip in node.node_port_ips.iter().filter(|ip| has(ip)) {
            push_external(&mut out, svc, (*ip, np), FrontendKind::NodePort, &field, true);
        }
        let loopback = IpAddr::V4(super::NODE_PORT_LOOPBACK);
        if has(&loopback) {
            out.push(Planned {
                addr: loopback,
                port: np,
                kind: FrontendKind::NodePort,
                scope: Scope::All,
                reach: Reach::LocalClients,
                endpoints: Endpoints::Cluster,
                field,
            });
        }
    }
    for ip in svc.lb_ips.iter().filter(|ip| has(ip)) {
        push_external(&mut out, svc, (*ip, port.port), FrontendKind::LoadBalancer, "status.loadBalancer.ingress", true);
    }
    for ip in svc.external_ips.iter().filter(|ip| has(ip)) {
        let ours = node.node_ips.contains(ip);
        push_external(&mut out, svc, (*ip, port.port), FrontendKind::ExternalIp, "spec.externalIPs", ours);
    }
    out
}

/// The entries of an address traffic from outside reaches, and local
/// clients too when `local_clients`.
fn push_external(
    out: &mut Vec<Planned>,
    svc: &ServiceFrontends,
    (addr, port): (IpAddr, u16),
    kind: FrontendKind,
    field: &str,
    local_clients: bool,
) {
    let outside = if svc.external_local { Endpoints::LocalNode } else { Endpoints::Cluster };
    let entry =
        |scope, reach, endpoints| Planned { addr, port, kind, scope, reach, endpoints, field: field.to_owned() };
    match (local_clients, svc.external_local) {
        (true, false) => out.push(entry(Scope::All, Reach::Both, Endpoints::Cluster)),
        (true, true) => {
            out.push(entry(Scope::All, Reach::LocalClients, Endpoints::Cluster));
            out.push(entry(Scope::External, Reach::Outside, Endpoints::LocalNode));
        }
        (false, _) => out.push(entry(Scope::All, Reach::Outside, outside)),
    }
}
