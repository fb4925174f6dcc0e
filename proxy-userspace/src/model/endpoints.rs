//! Endpoints of a service port, from all of the service's EndpointSlices.
use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{
    Backend, BackendState, ObjectRef, Problem, Protocol,
    frontends::{PortSpec, valid_port},
};

/// Label naming the service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

pub fn object_ref(slice: &EndpointSlice) -> ObjectRef {
    ObjectRef::new("EndpointSlice", slice.metadata.namespace.as_deref(), slice.metadata.name.as_deref())
}

/// The service (`namespace`, `name`) a slice belongs to, if it says.
#[must_use]
pub fn owning_service(slice: &EndpointSlice) -> Option<(String, String)> {
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some((slice.metadata.namespace.clone().unwrap_or_else(|| "default".into()), name.clone()))
}

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
    slices: &[&EndpointSlice],
    selection: &Selection<'_>,
    problems: &mut Vec<Problem>,
) -> Vec<Backend> {
    // (addr, port) -> best state seen across slices, zone hints, and
    // whether it is on this node.
    let mut found: BTreeMap<(IpAddr, u16), (BackendState, Vec<String>, bool)> = BTreeMap::new();
    let (address_type, family) = if ipv6 { ("IPv6", "IPv6") } else { ("IPv4", "IPv4") };
    for slice in slices {
        if slice.address_type != address_type {
            continue;
        }
        let Some(target) = slice_port(slice, port, problems) else {
            continue;
        };
        let object = object_ref(slice);
        for (k, endpoint) in slice.endpoints.iter().flatten().enumerate() {
            let conditions = endpoint.conditions.as_ref();
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let serving = conditions.and_then(|c| c.serving).unwrap_or(true);
            let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            let state = if ready {
                BackendState::Active
            } else if serving && terminating {
                BackendState::Terminating
            } else {
                continue;
            };
            let local = endpoint.node_name.as_deref() == Some(selection.node_name);
            if selection.local_node.is_some() && !local {
                continue;
            }
            // Like kube-proxy, only an endpoint's first address is used.
            let Some(raw) = endpoint.addresses.first() else {
                problems.push(Problem::error(
                    &object,
                    format!("endpoints[{k}].addresses"),
                    "endpoint has no address; skipped",
                ));
                continue;
            };
            let addr = match raw.parse::<IpAddr>() {
                Ok(addr) if addr.is_ipv6() == ipv6 => addr,
                _ => {
                    problems.push(Problem::error(
                        &object,
                        format!("endpoints[{k}].addresses[0]"),
                        format!("{raw:?} is not an {family} address; endpoint skipped"),
                    ));
                    continue;
                }
            };
            let hints: Vec<String> = endpoint
                .hints
                .as_ref()
                .and_then(|h| h.for_zones.as_ref())
                .map(|zones| zones.iter().map(|z| z.name.clone()).collect())
                .unwrap_or_default();
            found
                .entry((addr, target))
                .and_modify(|(s, h, l)| {
                    *s = (*s).min(state);
                    h.extend(hints.iter().cloned());
                    *l |= local;
                })
                .or_insert((state, hints, local));
        }
    }
    let any_ready = found.values().any(|(s, _, _)| *s == BackendState::Active);
    let wanted = if any_ready { BackendState::Active } else { BackendState::Terminating };
    let mut chosen: Vec<((IpAddr, u16), Vec<String>, bool)> = found
        .into_iter()
        .filter(|(_, (state, _, _))| *state == wanted)
        .map(|(k, (_, hints, local))| (k, hints, local))
        .collect();
    if let Some(zone) = selection.zone
        && wanted == BackendState::Active
        && chosen.iter().all(|(_, hints, _)| !hints.is_empty())
        && chosen.iter().any(|(_, hints, _)| hints.iter().any(|h| h == zone))
    {
        chosen.retain(|(_, hints, _)| hints.iter().any(|h| h == zone));
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
pub fn local_ready_endpoints(slices: &[&EndpointSlice], node: &str) -> usize {
    let mut addrs: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for slice in slices {
        for endpoint in slice.endpoints.iter().flatten() {
            let ready = endpoint.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if ready
                && endpoint.node_name.as_deref() == Some(node)
                && let Some(addr) = endpoint.addresses.first()
            {
                addrs.insert(addr);
            }
        }
    }
    addrs.len()
}

/// The target port for `port` in `slice`, matched by name and protocol.
pub(super) fn slice_port(slice: &EndpointSlice, port: &PortSpec, problems: &mut Vec<Problem>) -> Option<u16> {
    let (j, sp) = slice.ports.iter().flatten().enumerate().find(|(_, sp)| {
        sp.name.as_deref().unwrap_or("") == port.name && protocol_matches(sp.protocol.as_deref(), port.protocol)
    })?;
    match sp.port.map(valid_port) {
        Some(Some(n)) => Some(n),
        Some(None) => {
            problems.push(Problem::error(
                &object_ref(slice),
                format!("ports[{j}].port"),
                format!("{} is not a port number (1-65535)", sp.port.unwrap_or_default()),
            ));
            None
        }
        None => {
            problems.push(Problem::warning(
                &object_ref(slice),
                format!("ports[{j}].port"),
                "no port number; its endpoints are not used",
            ));
            None
        }
    }
}

fn protocol_matches(slice_proto: Option<&str>, protocol: Protocol) -> bool {
    matches!((slice_proto.unwrap_or("TCP"), protocol), ("TCP", Protocol::Tcp) | ("UDP", Protocol::Udp))
}

/// Slice ports no service port names, as warnings on the slice.
pub fn unmatched_slice_ports(slice: &EndpointSlice, ports: &[PortSpec], problems: &mut Vec<Problem>) {
    for (j, sp) in slice.ports.iter().flatten().enumerate() {
        let name = sp.name.as_deref().unwrap_or("");
        let proto = sp.protocol.as_deref().unwrap_or("TCP");
        if proto == "SCTP" {
            continue;
        }
        let matched = ports.iter().any(|p| p.name == name && protocol_matches(Some(proto), p.protocol));
        if !matched {
            problems.push(Problem::warning(
                &object_ref(slice),
                format!("ports[{j}].name"),
                format!("port {name:?}/{proto} matches no port of the service; it is not used"),
            ));
        }
    }
}
