//! Endpoints of a service port, from all of the service's EndpointSlices.
use std::{collections::BTreeMap, net::IpAddr};

use super::{
    Backend, BackendState, ObjectRef, Problem, Protocol,
    frontends::{PortSpec, valid_port},
    input::{AddressType, EndpointSpec, SliceSpec},
};

/// Endpoint selection rules for one service.
pub(crate) struct Selection<'a> {
    /// Keep only endpoints on this node (`internalTrafficPolicy: Local`).
    pub(crate) local_node: Option<&'a str>,
    /// This node's zone, to follow zone hints (topology-aware routing,
    /// `trafficDistribution: PreferClose`).
    pub(crate) zone: Option<&'a str>,
    /// This node's name: its endpoints are marked local.
    pub(crate) node_name: &'a str,
    /// Most backends one frontend may have.
    pub(crate) max_backends: usize,
}

/// Backends of `port` of one family (from slices of that addressType) in
/// slot order: ready endpoints, or when there are none
/// the serving-and-terminating ones; de-duplicated across slices; sorted by
/// address and port. Topology hints narrow the ready endpoints as
/// [`topology`] decides (node hints, then zone hints); otherwise they are
/// ignored.
pub(crate) fn backends_for_port(
    service: &ObjectRef,
    port: &PortSpec,
    ipv6: bool,
    slices: &[&SliceSpec],
    selection: &Selection<'_>,
    problems: &mut Vec<Problem>,
) -> Vec<Backend> {
    // (addr, port) -> best state seen across slices, topology hints, and
    // whether it is on this node.
    let mut found: BTreeMap<(IpAddr, u16), (BackendState, Hints<'_>, bool)> = BTreeMap::new();
    let (address_type, family) = if ipv6 { (AddressType::IPv6, "IPv6") } else { (AddressType::IPv4, "IPv4") };
    for slice in slices {
        if slice.address_type != address_type {
            continue;
        }
        let Some(target) = slice_port(slice, port, problems) else {
            continue;
        };
        let object = slice.object_ref();
        for (k, endpoint) in slice.endpoints.iter().enumerate() {
            let state = if endpoint.ready {
                BackendState::Active
            } else if endpoint.serving && endpoint.terminating {
                BackendState::Terminating
            } else {
                continue;
            };
            let local = endpoint.node_name() == Some(selection.node_name);
            if selection.local_node.is_some() && !local {
                continue;
            }
            // Like kube-proxy, only an endpoint's first address is used.
            let Some(raw) = endpoint.address() else {
                problems.push(Problem::error(
                    &object,
                    format!("endpoints[{k}].addresses"),
                    "endpoint has no address; skipped",
                ));
                continue;
            };
            let addr = match raw.ip() {
                Some(addr) if addr.is_ipv6() == ipv6 => addr,
                _ => {
                    problems.push(Problem::error(
                        &object,
                        format!("endpoints[{k}].addresses[0]"),
                        format!("{:?} is not an {family} address; endpoint skipped", raw.to_string()),
                    ));
                    continue;
                }
            };
            let (s, hints, l) = found.entry((addr, target)).or_insert((state, Hints::default(), local));
            *s = (*s).min(state);
            hints.add(endpoint);
            *l |= local;
        }
    }
    let any_ready = found.values().any(|(s, _, _)| *s == BackendState::Active);
    let wanted = if any_ready { BackendState::Active } else { BackendState::Terminating };
    let chosen: Vec<((IpAddr, u16), Hints<'_>, bool)> = found
        .into_iter()
        .filter(|(_, (state, _, _))| *state == wanted)
        .map(|(k, (_, hints, local))| (k, hints, local))
        .collect();
    let topology = if wanted == BackendState::Active {
        topology(selection, chosen.iter().map(|(_, hints, _)| hints))
    } else {
        Topology::Any
    };
    let mut backends: Vec<Backend> = chosen
        .into_iter()
        .filter(|(_, hints, _)| hints.allow(topology))
        .map(|((addr, port), _, local)| Backend { addr, port, state: wanted, local })
        .collect();
    if backends.len() > selection.max_backends {
        problems.push(Problem::warning(
            service,
            format!("port {}", port.port),
            format!(
                "{} endpoints, more than the {} a frontend holds; the first {} by address are used",
                backends.len(),
                selection.max_backends,
                selection.max_backends
            ),
        ));
        backends.truncate(selection.max_backends);
    }
    backends
}

/// Which topology hints narrow the ready endpoints of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Topology<'a> {
    /// None: every ready endpoint is used.
    Any,
    /// Only endpoints whose `hints.forNodes` names this node.
    Node(&'a str),
    /// Only endpoints whose `hints.forZones` names this node's zone.
    Zone(&'a str),
}

/// The topology hints of one endpoint (merged across the slices that list
/// it).
#[derive(Clone, Debug, Default)]
pub(super) struct Hints<'a> {
    nodes: Vec<&'a str>,
    zones: Vec<&'a str>,
}

impl<'a> Hints<'a> {
    pub(super) fn add(&mut self, endpoint: &'a EndpointSpec) {
        self.nodes.extend(endpoint.node_hints().iter().map(|n| &**n));
        self.zones.extend(endpoint.zone_hints().iter().map(|z| &**z));
    }

    /// Whether an endpoint with these hints is used under `topology`.
    pub(super) fn allow(&self, topology: Topology<'_>) -> bool {
        match topology {
            Topology::Any => true,
            Topology::Node(node) => self.nodes.contains(&node),
            Topology::Zone(zone) => self.zones.contains(&zone),
        }
    }
}

/// kube-proxy's rule (`topologyModeFromHints` in pkg/proxy/topology.go),
/// over the hints of the ready endpoints: when every one has node hints
/// (`trafficDistribution: PreferSameNode`) and one names this node, node
/// hints; else when every one has zone hints and one names this node's
/// zone, zone hints; else none. No ready endpoint: none. A Local traffic
/// policy's endpoints (this node's) are not narrowed by hints: kube-proxy
/// follows hints for cluster endpoints only (`CategorizeEndpoints`).
pub(super) fn topology<'s, 'h: 'i, 'i>(
    selection: &Selection<'s>,
    ready: impl Iterator<Item = &'i Hints<'h>>,
) -> Topology<'s> {
    if selection.local_node.is_some() {
        return Topology::Any;
    }
    let (mut all_node, mut for_node, mut all_zone, mut for_zone) = (true, false, true, false);
    for hints in ready {
        all_node &= !hints.nodes.is_empty();
        for_node |= hints.nodes.contains(&selection.node_name);
        all_zone &= !hints.zones.is_empty();
        for_zone |= selection.zone.is_some_and(|zone| hints.zones.contains(&zone));
    }
    match selection.zone {
        _ if all_node && for_node => Topology::Node(selection.node_name),
        Some(zone) if all_zone && for_zone => Topology::Zone(zone),
        _ => Topology::Any,
    }
}

/// Ready endpoints (distinct addresses, any port or family) of the slices
/// on node `node`: what a healthCheckNodePort reports.
pub(crate) fn local_ready_endpoints(slices: &[&SliceSpec], node: &str) -> usize {
    let mut addrs: std::collections::BTreeSet<super::input::Address> = std::collections::BTreeSet::new();
    for slice in slices {
        for endpoint in &slice.endpoints {
            if endpoint.ready
                && endpoint.node_name() == Some(node)
                && let Some(addr) = endpoint.address()
            {
                addrs.insert(addr);
            }
        }
    }
    addrs.len()
}

/// The target port for `port` in `slice`, matched by name and protocol.
pub(super) fn slice_port(slice: &SliceSpec, port: &PortSpec, problems: &mut Vec<Problem>) -> Option<u16> {
    let (j, sp) = slice
        .ports
        .iter()
        .enumerate()
        .find(|(_, sp)| *sp.name == port.name && protocol_matches(&sp.protocol, port.protocol))?;
    match sp.port.map(valid_port) {
        Some(Some(n)) => Some(n),
        Some(None) => {
            problems.push(Problem::error(
                &slice.object_ref(),
                format!("ports[{j}].port"),
                format!("{} is not a port number (1-65535)", sp.port.unwrap_or_default()),
            ));
            None
        }
        None => {
            problems.push(Problem::warning(
                &slice.object_ref(),
                format!("ports[{j}].port"),
                "no port number; its endpoints are not used",
            ));
            None
        }
    }
}

fn protocol_matches(slice_proto: &str, protocol: Protocol) -> bool {
    matches!((slice_proto, protocol), ("TCP", Protocol::Tcp) | ("UDP", Protocol::Udp) | ("SCTP", Protocol::Sctp))
}

/// Slice ports no service port names, as warnings on the slice.
pub(crate) fn unmatched_slice_ports(slice: &SliceSpec, ports: &[PortSpec], problems: &mut Vec<Problem>) {
    for (j, sp) in slice.ports.iter().enumerate() {
        let (name, proto) = (&*sp.name, &*sp.protocol);
        let matched = ports.iter().any(|p| p.name == name && protocol_matches(proto, p.protocol));
        if !matched {
            problems.push(Problem::warning(
                &slice.object_ref(),
                format!("ports[{j}].name"),
                format!("port {name:?}/{proto} matches no port of the service; it is not used"),
            ));
        }
    }
}
