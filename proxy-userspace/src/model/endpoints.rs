//! Endpoints of a service port, from all of the service's EndpointSlices.
use std::{collections::BTreeMap, net::IpAddr};

use super::{
    Backend, BackendState, ObjectRef, Problem, Protocol,
    frontends::{PortSpec, valid_port},
    input::{AddressType, SliceSpec},
};

/// Endpoint selection rules for one service.
pub struct Selection<'a> {
    /// Keep only endpoints on this node (`internalTrafficPolicy: Local`).
    pub local_node: Option<&'a str>,
    /// This node's zone, to follow zone hints (topology-aware routing,
    /// `trafficDistribution: PreferClose`).
    pub zone: Option<&'a str>,
    /// This node's name: its endpoints are marked local.
    pub node_name: &'a str,
    /// Most backends one frontend may have.
    pub max_backends: usize,
}

/// Backends of `port` of one family (from slices of that addressType) in
/// slot order: ready endpoints, or when there are none
/// the serving-and-terminating ones; de-duplicated across slices; sorted by
/// address and port. Zone hints narrow the ready endpoints to this node's
/// zone when every ready endpoint has hints and one is for this zone (as
/// kube-proxy does); otherwise they are ignored.
pub fn backends_for_port(
    service: &ObjectRef,
    port: &PortSpec,
    ipv6: bool,
    slices: &[&SliceSpec],
    selection: &Selection<'_>,
    problems: &mut Vec<Problem>,
) -> Vec<Backend> {
    // (addr, port) -> best state seen across slices, zone hints, and
    // whether it is on this node.
    let mut found: BTreeMap<(IpAddr, u16), (BackendState, Vec<&str>, bool)> = BTreeMap::new();
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
            let local = endpoint.node_name.as_deref() == Some(selection.node_name);
            if selection.local_node.is_some() && !local {
                continue;
            }
            // Like kube-proxy, only an endpoint's first address is used.
            let Some(raw) = &endpoint.address else {
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
            let hints: Vec<&str> = endpoint.zone_hints.iter().map(|z| &**z).collect();
            found
                .entry((addr, target))
                .and_modify(|(s, h, l)| {
                    *s = (*s).min(state);
                    h.extend(hints.iter().copied());
                    *l |= local;
                })
                .or_insert((state, hints, local));
        }
    }
    let any_ready = found.values().any(|(s, _, _)| *s == BackendState::Active);
    let wanted = if any_ready { BackendState::Active } else { BackendState::Terminating };
    let mut chosen: Vec<((IpAddr, u16), Vec<&str>, bool)> = found
        .into_iter()
        .filter(|(_, (state, _, _))| *state == wanted)
        .map(|(k, (_, hints, local))| (k, hints, local))
        .collect();
    if let Some(zone) = selection.zone
        && wanted == BackendState::Active
        && chosen.iter().all(|(_, hints, _)| !hints.is_empty())
        && chosen.iter().any(|(_, hints, _)| hints.contains(&zone))
    {
        chosen.retain(|(_, hints, _)| hints.contains(&zone));
    }
    let mut backends: Vec<Backend> =
        chosen.into_iter().map(|((addr, port), _, local)| Backend { addr, port, state: wanted, local }).collect();
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

/// Ready endpoints (distinct addresses, any port or family) of the slices
/// on node `node`: what a healthCheckNodePort reports.
pub fn local_ready_endpoints(slices: &[&SliceSpec], node: &str) -> usize {
    let mut addrs: std::collections::BTreeSet<&super::input::Address> = std::collections::BTreeSet::new();
    for slice in slices {
        for endpoint in &slice.endpoints {
            if endpoint.ready
                && endpoint.node_name.as_deref() == Some(node)
                && let Some(addr) = &endpoint.address
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
    matches!((slice_proto, protocol), ("TCP", Protocol::Tcp) | ("UDP", Protocol::Udp))
}

/// Slice ports no service port names, as warnings on the slice.
pub fn unmatched_slice_ports(slice: &SliceSpec, ports: &[PortSpec], problems: &mut Vec<Problem>) {
    for (j, sp) in slice.ports.iter().enumerate() {
        let (name, proto) = (&*sp.name, &*sp.protocol);
        if proto == "SCTP" {
            continue;
        }
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
