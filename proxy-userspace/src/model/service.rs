//! One service's part of the table: its frontends with their backends, the
//! problems found in it and its slices, and its health check. A pure
//! function of the Service, its EndpointSlices and the node.
use std::{borrow::Cow, collections::BTreeMap, net::IpAddr};

use super::{
    Frontend, FrontendKey, FrontendKind, Problem, Reach, Scope,
    endpoints::{self, Selection},
    frontends::{self, PortSpec, ServiceFrontends, SkipReason},
    input::{ServiceSpec, SliceSpec},
    table::{HealthCheck, NodeContext},
};

/// A frontend a service asks for, with the field it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) key: FrontendKey,
    /// The frontend, while the service does not serve the key (another
    /// claimant does, or the claim is not yet in the table); `None` once
    /// it was moved into the table, which then holds the one copy (see
    /// `super::state`).
    pub(crate) frontend: Option<Box<Frontend>>,
    /// The field of the service it comes from (for conflict problems).
    pub(crate) field: Cow<'static, str>,
}

/// What one service contributes.
#[derive(Clone, Debug)]
pub(crate) struct ServiceOutput {
    /// Its frontends, each key once (a key the service asks for twice is a
    /// problem, the first is kept).
    pub(crate) claims: Vec<Claim>,
    pub(crate) problems: Vec<Problem>,
    /// Why the service is not programmed, when it is not.
    pub(crate) skipped: Option<SkipReason>,
    /// Boxed: few services have one, and every service's output is kept.
    pub(crate) health_check: Option<Box<HealthCheck>>,
    /// Service ports (per family) with a Local traffic policy and no
    /// endpoint on this node: kube-proxy's
    /// `sync_proxy_rules_no_local_endpoints_total`.
    pub(crate) no_local: NoLocalEndpoints,
}

/// Counts of service ports with a Local traffic policy and no endpoint on
/// this node, by policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoLocalEndpoints {
    /// internalTrafficPolicy: Local.
    pub(crate) internal: usize,
    /// externalTrafficPolicy: Local (services reachable from outside).
    pub(crate) external: usize,
}

impl NoLocalEndpoints {
    pub(crate) fn add(&mut self, other: Self) {
        self.internal += other.internal;
        self.external += other.external;
    }

    pub(crate) fn subtract(&mut self, other: Self) {
        self.internal -= other.internal;
        self.external -= other.external;
    }
}

/// The part of the table service `svc` makes, with `slices` (those that
/// name it, any order).
pub(crate) fn translate_service(svc: &ServiceSpec, slices: &[&SliceSpec], node: &NodeContext) -> ServiceOutput {
    let mut problems = Vec::new();
    let svc_frontends = match frontends::service_frontends(svc, &mut problems) {
        Ok(f) => f,
        Err(reason) => {
            return ServiceOutput {
                claims: Vec::new(),
                problems,
                skipped: Some(reason),
                health_check: None,
                no_local: NoLocalEndpoints::default(),
            };
        }
    };
    let object = svc_frontends.object.clone();
    let mut slices: Vec<&SliceSpec> = slices.to_vec();
    slices.sort_by(|a, b| a.id.cmp(&b.id));
    for slice in &slices {
        endpoints::unmatched_slice_ports(slice, &svc_frontends.ports, &mut problems);
    }
    let families: Vec<bool> = svc_frontends.addrs.iter().map(IpAddr::is_ipv6).collect();
    let mut claims: Vec<Claim> = Vec::new();
    let mut no_local = NoLocalEndpoints::default();
    for (i, port) in svc_frontends.ports.iter().enumerate() {
        // Backends per (family, endpoint selection), computed once.
        let mut cache: BTreeMap<(bool, Endpoints), Vec<super::Backend>> = BTreeMap::new();
        // One copy for every frontend of the port (see `ServicePort`).
        let service_port = super::ServicePort::of(svc.id(), &port.name);
        for planned in port_frontends(&svc_frontends, port, i, node, &families) {
            let ipv6 = planned.addr.is_ipv6();
            let backends = cache
                .entry((ipv6, planned.endpoints))
                .or_insert_with(|| {
                    let selection = planned.endpoints.selection(&svc_frontends, node);
                    endpoints::backends_for_port(&object, port, ipv6, &slices, &selection, &mut problems)
                })
                .clone();
            let key =
                FrontendKey { addr: planned.addr, port: planned.port, protocol: port.protocol, scope: planned.scope };
            let from_outside = planned.reach.from_outside();
            let frontend = Frontend {
                service_port: service_port.clone(),
                backends,
                affinity_timeout: svc_frontends.affinity_timeout,
                kind: planned.kind,
                reach: planned.reach,
                source_ranges: svc_frontends
                    .source_ranges
                    .clone()
                    .filter(|_| from_outside && planned.kind != FrontendKind::ExternalIp),
                lb_algorithm: svc_frontends.lb_algorithm.unwrap_or(node.lb_algorithm),
                // Only traffic from outside to a NodePort, LoadBalancer IP
                // or externalIP may go by DSR (a ClusterIP routed to the
                // node is always source-NATed).
                forwarding: svc_frontends
                    .forwarding
                    .filter(|_| from_outside && planned.kind != FrontendKind::ClusterIp),
            };
            if let Some(first) = claims.iter().find(|c| c.key == key) {
                let served_by =
                    first.frontend.as_ref().map(|f| &f.service_port).expect("a new claim holds its frontend");
                problems.push(Problem::error(
                    &object,
                    planned.field,
                    format!("{key} is already served by {served_by}; skipped"),
                ));
            } else {
                claims.push(Claim { key, frontend: Some(Box::new(frontend)), field: planned.field });
            }
        }
        // As kube-proxy counts them: a port whose Local policy leaves it no
        // endpoint (pkg/proxy/iptables, serviceNoLocalEndpointsTotal*).
        for ((_, endpoints), backends) in &cache {
            match endpoints {
                Endpoints::Internal if svc_frontends.internal_local && backends.is_empty() => no_local.internal += 1,
                Endpoints::LocalNode if backends.is_empty() => no_local.external += 1,
                _ => {}
            }
        }
    }
    let health_check = svc_frontends.health_check_node_port.map(|port| {
        Box::new(HealthCheck {
            service: object.clone(),
            port,
            local_endpoints: endpoints::local_ready_endpoints(&slices, &node.node_name),
        })
    });
    // Kept until the service changes: no spare capacity (10,000 services).
    claims.shrink_to_fit();
    problems.shrink_to_fit();
    ServiceOutput { claims, problems, skipped: None, health_check, no_local }
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
    field: Cow<'static, str>,
}

/// Every entry one service port gets on this node: its ClusterIPs; its
/// nodePort on each node address and on 127.0.0.1; its LoadBalancer ingress
/// IPs; its externalIPs. Local clients reach all endpoints through all of
/// them (as kube-proxy sends in-cluster traffic to cluster endpoints, and
/// captures every externalIP in its OUTPUT chain too), except, with
/// `external_ips_local_only`, an externalIP that is not this node's
/// (a mitigation of CVE-2020-8554). Traffic
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
            field: Cow::Borrowed("spec.clusterIP"),
        })
        .collect();
    if let Some(np) = port.node_port {
        let field: Cow<'static, str> = Cow::Owned(format!("spec.ports[{index}].nodePort"));
        for ip in node.node_port_ips.iter().filter(|ip| has(ip)) {
            push_external(&mut out, svc, (*ip, np), FrontendKind::NodePort, field.clone(), true);
        }
        let loopback = IpAddr::V4(super::NODE_PORT_LOOPBACK);
        if node.node_port_loopback && has(&loopback) {
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
        push_external(
            &mut out,
            svc,
            (*ip, port.port),
            FrontendKind::LoadBalancer,
            Cow::Borrowed("status.loadBalancer.ingress"),
            true,
        );
    }
    for ip in svc.external_ips.iter().filter(|ip| has(ip)) {
        let local_clients = !node.external_ips_local_only || node.node_ips.contains(ip);
        push_external(
            &mut out,
            svc,
            (*ip, port.port),
            FrontendKind::ExternalIp,
            Cow::Borrowed("spec.externalIPs"),
            local_clients,
        );
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
    field: Cow<'static, str>,
    local_clients: bool,
) {
    let entry = |scope, reach, endpoints, field| Planned { addr, port, kind, scope, reach, endpoints, field };
    match (local_clients, svc.external_local) {
        (true, false) => out.push(entry(Scope::All, Reach::Both, Endpoints::Cluster, field)),
        (true, true) => {
            out.push(entry(Scope::All, Reach::LocalClients, Endpoints::Cluster, field.clone()));
            out.push(entry(Scope::External, Reach::Outside, Endpoints::LocalNode, field));
        }
        (false, false) => out.push(entry(Scope::All, Reach::Outside, Endpoints::Cluster, field)),
        // The twin carries this node's endpoints; the entry itself every
        // endpoint, so that the TC programs tell "no endpoint at all"
        // (rejected) from "none on this node" (dropped), as kube-proxy does.
        (false, true) => {
            out.push(entry(Scope::All, Reach::Outside, Endpoints::Cluster, field.clone()));
            out.push(entry(Scope::External, Reach::Outside, Endpoints::LocalNode, field));
        }
    }
}

/// The endpoint selection of the entry `key` of port `port` (the
/// `index`th of `svc`), exactly as `translate_service` makes it for that
/// entry; `None` when the port has no such entry on this node.
pub(super) fn entry_selection<'a>(
    svc: &ServiceFrontends,
    port: &PortSpec,
    index: usize,
    node: &'a NodeContext,
    key: FrontendKey,
) -> Option<Selection<'a>> {
    let families: Vec<bool> = svc.addrs.iter().map(IpAddr::is_ipv6).collect();
    port_frontends(svc, port, index, node, &families)
        .into_iter()
        .find(|p| p.addr == key.addr && p.port == key.port && p.scope == key.scope && port.protocol == key.protocol)
        .map(|p| p.endpoints.selection(svc, node))
}
