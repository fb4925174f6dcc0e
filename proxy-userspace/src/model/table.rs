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
    Frontend, FrontendKey, FrontendKind, ObjectRef, Problem, ServiceTable,
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

/// The result of a translation: the table, and what could not be used.
#[derive(Debug, Default)]
pub struct Translation {
    pub table: ServiceTable,
    pub problems: Vec<Problem>,
    /// Services deliberately not programmed, and why.
    pub skipped: Vec<(ObjectRef, SkipReason)>,
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
        // ClusterIP traffic follows internalTrafficPolicy; local clients of
        // NodePorts, LoadBalancer IPs and externalIPs use every endpoint (as
        // kube-proxy sends in-cluster traffic to them to cluster endpoints).
        let internal = Selection {
            local_node: svc_frontends.internal_local.then_some(node.node_name.as_str()),
            // Zone hints apply to cluster-wide traffic, not to Local.
            zone: if svc_frontends.internal_local { None } else { node.zone.as_deref() },
            max_backends: node.max_backends,
        };
        let cluster = Selection { local_node: None, zone: node.zone.as_deref(), max_backends: node.max_backends };
        let families: Vec<bool> = svc_frontends.addrs.iter().map(IpAddr::is_ipv6).collect();
        for (i, port) in svc_frontends.ports.iter().enumerate() {
            // Backends per (family, selection), computed once.
            let mut cache: BTreeMap<(bool, bool), Vec<super::Backend>> = BTreeMap::new();
            for (addr, number, kind, field) in port_frontends(&svc_frontends, port, i, node, &families) {
                let ipv6 = addr.is_ipv6();
                let internal_only = kind == FrontendKind::ClusterIp && svc_frontends.internal_local;
                let backends = cache
                    .entry((ipv6, internal_only))
                    .or_insert_with(|| {
                        let selection = if kind == FrontendKind::ClusterIp { &internal } else { &cluster };
                        endpoints::backends_for_port(object, port, ipv6, &slices, selection, &mut out.problems)
                    })
                    .clone();
                let key = FrontendKey { addr, port: number, protocol: port.protocol };
                let frontend = Frontend {
                    service_port: format!("{}/{}:{}", object.namespace, object.name, port.name),
                    backends,
                    affinity_timeout: svc_frontends.affinity_timeout,
                    kind,
                };
                match out.table.entry(key) {
                    Entry::Vacant(v) => {
                        v.insert(frontend);
                    }
                    Entry::Occupied(o) => out.problems.push(Problem::error(
                        object,
                        field,
                        format!("{key} is already served by {}; skipped", o.get().service_port),
                    )),
                }
            }
        }
    }
    out
}

/// Every (address, port, kind, field) one service port is reached at on
/// this node: its ClusterIPs; its nodePort on each node address and on
/// 127.0.0.1; its LoadBalancer ingress IPs; and those of its externalIPs
/// that are this node's (an externalIP elsewhere is not taken over for
/// local clients: CVE-2020-8554). Only families the service has.
fn port_frontends(
    svc: &ServiceFrontends,
    port: &PortSpec,
    index: usize,
    node: &NodeContext,
    families: &[bool],
) -> Vec<(IpAddr, u16, FrontendKind, String)> {
    let has = |ip: &IpAddr| families.contains(&ip.is_ipv6());
    let mut out: Vec<(IpAddr, u16, FrontendKind, String)> =
        svc.addrs.iter().map(|a| (*a, port.port, FrontendKind::ClusterIp, "spec.clusterIP".to_owned())).collect();
    if let Some(np) = port.node_port {
        let field = format!("spec.ports[{index}].nodePort");
        let loopback = IpAddr::V4(super::NODE_PORT_LOOPBACK);
        for ip in node.node_port_ips.iter().chain(std::iter::once(&loopback)).filter(|ip| has(ip)) {
            out.push((*ip, np, FrontendKind::NodePort, field.clone()));
        }
    }
    for ip in svc.lb_ips.iter().filter(|ip| has(ip)) {
        out.push((*ip, port.port, FrontendKind::LoadBalancer, "status.loadBalancer.ingress".to_owned()));
    }
    for ip in svc.external_ips.iter().filter(|ip| has(ip) && node.node_ips.contains(ip)) {
        out.push((*ip, port.port, FrontendKind::ExternalIp, "spec.externalIPs".to_owned()));
    }
    out
}
