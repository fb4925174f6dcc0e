//! Property test: random Services and EndpointSlices through the model,
//! against a straightforward reference written separately from it (plain
//! nested loops over every object, no grouping or maps).
use std::net::Ipv4Addr;

use std::collections::{BTreeMap, BTreeSet};

use ebpf_proxy::model::{
    Backend, BackendState, Frontend, FrontendKey, FrontendKind, NodeContext, Protocol, Reach, Scope, ServiceId,
    ServiceInput, ServicePort, ServiceSpec, ServiceTable, SliceSpec, TableState, translate,
};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use proptest::prelude::*;
use serde_json::{Value, json};

#[derive(Debug, Clone)]
struct Svc {
    ns: u8,
    name: u8,
    ip: u8,
    kind: u8, // 0..=3 ClusterIP, 4 NodePort, 5 NodePort with externalTrafficPolicy Local, 6 headless, 7 ExternalName, 8 other proxy
    local: bool,
    ports: Vec<(u8, u16, bool)>, // (name, port, udp)
    affinity: Affinity,
}

impl Svc {
    /// Its port named `PORT_NAMES[pname]`, as the model names it.
    fn service_port(&self, pname: u8) -> ServicePort {
        ServicePort::new(format!("ns{}", self.ns), format!("s{}", self.name), PORT_NAMES[usize::from(pname)])
    }
}

#[derive(Debug, Clone, Copy)]
enum Affinity {
    None,
    /// sessionAffinity ClientIP without a timeout (the default applies).
    ClientIp,
    ClientIpFor(u16),
}

#[derive(Debug, Clone)]
struct Ep {
    addr: u8,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
    node: u8,
    /// `hints.forNodes`: nodes `n{i}`.
    node_hints: Vec<u8>,
}

#[derive(Debug, Clone)]
struct Slice {
    ns: u8,
    service: u8,
    ipv6: bool,
    ports: Vec<(u8, u16, bool)>,
    endpoints: Vec<Ep>,
}

const PORT_NAMES: [&str; 3] = ["", "http", "dns"];

fn svc_strategy() -> impl Strategy<Value = Svc> {
    (
        0u8..2,
        0u8..3,
        0u8..3,
        0u8..9,
        any::<bool>(),
        prop::collection::vec((0u8..3, 1u16..4, any::<bool>()), 1..3),
        prop_oneof![Just(Affinity::None), Just(Affinity::ClientIp), (1u16..600).prop_map(Affinity::ClientIpFor)],
    )
        .prop_map(|(ns, name, ip, kind, local, ports, affinity)| Svc {
            ns,
            name,
            ip,
            kind,
            local,
            ports,
            affinity,
        })
}

fn ep_strategy() -> impl Strategy<Value = Ep> {
    let cond = prop::option::of(any::<bool>());
    (0u8..5, cond.clone(), cond.clone(), cond, 0u8..2, prop::collection::vec(0u8..2, 0..2)).prop_map(
        |(addr, ready, serving, terminating, node, node_hints)| Ep {
            addr,
            ready,
            serving,
            terminating,
            node,
            node_hints,
        },
    )
}

fn slice_strategy() -> impl Strategy<Value = Slice> {
    (
        0u8..2,
        0u8..3,
        prop::bool::weighted(0.1),
        prop::collection::vec((0u8..3, 8000u16..8003, any::<bool>()), 0..3),
        prop::collection::vec(ep_strategy(), 0..5),
    )
        .prop_map(|(ns, service, ipv6, ports, endpoints)| Slice { ns, service, ipv6, ports, endpoints })
}

fn proto(udp: bool) -> &'static str {
    if udp { "UDP" } else { "TCP" }
}

fn to_service(s: &Svc) -> Service {
    let mut meta = json!({"name": format!("s{}", s.name), "namespace": format!("ns{}", s.ns)});
    if s.kind == 8 {
        meta["labels"] = json!({"service.kubernetes.io/service-proxy-name": "other"});
    }
    let ip = if s.kind == 6 { "None".to_owned() } else { format!("10.96.0.{}", s.ip) };
    let mut spec = json!({
        "clusterIP": ip,
        "ports": s.ports.iter().map(|(n, p, udp)| json!({"name": PORT_NAMES[usize::from(*n)], "port": p, "protocol": proto(*udp)})).collect::<Vec<Value>>(),
    });
    if s.kind == 7 {
        spec["type"] = json!("ExternalName");
    }
    if matches!(s.kind, 4 | 5) {
        spec["type"] = json!("NodePort");
        for (port, (_, number, _)) in spec["ports"].as_array_mut().unwrap().iter_mut().zip(&s.ports) {
            port["nodePort"] = json!(node_port(*number));
        }
        if s.kind == 5 {
            spec["externalTrafficPolicy"] = json!("Local");
        }
    }
    if s.local {
        spec["internalTrafficPolicy"] = json!("Local");
    }
    if !matches!(s.affinity, Affinity::None) {
        spec["sessionAffinity"] = json!("ClientIP");
    }
    if let Affinity::ClientIpFor(t) = s.affinity {
        spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": t}});
    }
    serde_json::from_value(json!({"metadata": meta, "spec": spec})).unwrap()
}

fn to_slice(s: &Slice, i: usize) -> EndpointSlice {
    let endpoints: Vec<Value> = s
        .endpoints
        .iter()
        .map(|e| {
            let mut c = serde_json::Map::new();
            for (k, v) in [("ready", e.ready), ("serving", e.serving), ("terminating", e.terminating)] {
                if let Some(v) = v {
                    c.insert(k.into(), json!(v));
                }
            }
            let for_nodes: Vec<Value> = e.node_hints.iter().map(|n| json!({"name": format!("n{n}")})).collect();
            json!({"addresses": [format!("10.244.0.{}", e.addr)], "conditions": c, "nodeName": format!("n{}", e.node), "hints": {"forNodes": for_nodes}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("slice{i}"), "namespace": format!("ns{}", s.ns), "labels": {"kubernetes.io/service-name": format!("s{}", s.service)}},
        "addressType": if s.ipv6 { "IPv6" } else { "IPv4" },
        "ports": s.ports.iter().map(|(n, p, udp)| json!({"name": PORT_NAMES[usize::from(*n)], "port": p, "protocol": proto(*udp)})).collect::<Vec<Value>>(),
        "endpoints": endpoints,
    }))
    .unwrap()
}

/// The nodePort of a service port.
fn node_port(port: u16) -> u16 {
    30_000 + port
}

/// This node's address (NodePorts are served on it and on 127.0.0.1).
const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 1);

/// Node hints (kube-proxy's topologyModeFromHints, pkg/proxy/topology.go):
/// when every ready endpoint of `chosen` has one (`hinted`: endpoint, a node
/// it is hinted for) and one is for `node`, only those. (Not for a Local
/// policy's endpoints: the caller's.)
fn follow_node_hints(chosen: &mut Vec<(u8, u16)>, hinted: &[((u8, u16), u8)], node: u8) {
    let for_node = |ep: &(u8, u16)| hinted.contains(&(*ep, node));
    if chosen.iter().all(|ep| hinted.iter().any(|(h, _)| h == ep)) && chosen.iter().any(for_node) {
        chosen.retain(for_node);
    }
}

/// The backends of port (`pname`, `udp`) of service `s`, of this node's
/// endpoints only when `only_here`.
fn port_backends(s: &Svc, slices: &[Slice], (pname, udp): (u8, bool), node: u8, only_here: bool) -> Vec<Backend> {
    let mut ready: Vec<(u8, u16)> = Vec::new();
    let mut terminating: Vec<(u8, u16)> = Vec::new();
    let mut here: Vec<(u8, u16)> = Vec::new();
    // (endpoint, a node it is hinted for), over its entries.
    let mut hinted: Vec<((u8, u16), u8)> = Vec::new();
    for sl in slices {
        if sl.ns != s.ns || sl.service != s.name || sl.ipv6 {
            continue;
        }
        let Some(target) = sl.ports.iter().find(|(n, _, u)| *n == pname && *u == udp).map(|(_, p, _)| *p) else {
            continue;
        };
        for e in &sl.endpoints {
            if only_here && e.node != node {
                continue;
            }
            let is_ready = e.ready.unwrap_or(true);
            let serving = e.serving.unwrap_or(true);
            let term = e.terminating.unwrap_or(false);
            if is_ready {
                ready.push((e.addr, target));
            } else if serving && term {
                terminating.push((e.addr, target));
            } else {
                continue;
            }
            if e.node == node {
                here.push((e.addr, target));
            }
            hinted.extend(e.node_hints.iter().map(|n| ((e.addr, target), *n)));
        }
    }
    terminating.retain(|t| !ready.contains(t));
    let (mut chosen, state) =
        if ready.is_empty() { (terminating, BackendState::Terminating) } else { (ready, BackendState::Active) };
    chosen.sort_unstable();
    chosen.dedup();
    if !only_here && state == BackendState::Active {
        follow_node_hints(&mut chosen, &hinted, node);
    }
    chosen
        .iter()
        .map(|(a, p)| Backend {
            addr: Ipv4Addr::new(10, 244, 0, *a).into(),
            port: *p,
            state,
            local: here.contains(&(*a, *p)),
        })
        .collect()
}

/// The reference: the Kubernetes rules the model follows
/// (docs/services.md, "Endpoints and topology"), written out plainly.
fn reference(services: &[Svc], slices: &[Slice], node: u8) -> ServiceTable {
    let mut order: Vec<&Svc> = services.iter().collect();
    order.sort_by_key(|s| (s.ns, s.name));
    let mut table = ServiceTable::new();
    let mut seen_services = Vec::new();
    for s in order {
        // Duplicate objects: the first of a namespace/name wins (as a map would keep one).
        if seen_services.contains(&(s.ns, s.name)) {
            continue;
        }
        seen_services.push((s.ns, s.name));
        if s.kind >= 6 {
            continue;
        }
        let mut done_ports: Vec<(u16, bool)> = Vec::new();
        for (pname, port, udp) in &s.ports {
            if done_ports.contains(&(*port, *udp)) {
                continue;
            }
            done_ports.push((*port, *udp));
            let backends = |only_here: bool| port_backends(s, slices, (*pname, *udp), node, only_here);
            let protocol = if *udp { Protocol::Udp } else { Protocol::Tcp };
            let frontend = |kind, reach, backends| Frontend {
                reach,
                affinity_timeout: match s.affinity {
                    Affinity::None => None,
                    Affinity::ClientIp => Some(10_800),
                    Affinity::ClientIpFor(t) => Some(u32::from(t)),
                },
                ..Frontend::new(s.service_port(*pname), kind, backends)
            };
            let cluster_ip = FrontendKey::new(Ipv4Addr::new(10, 96, 0, s.ip).into(), *port, protocol);
            table.entry(cluster_ip).or_insert(frontend(
                FrontendKind::ClusterIp,
                Reach::LocalClients,
                backends(s.local),
            ));
            if matches!(s.kind, 4 | 5) {
                let on_node = FrontendKey::new(NODE_IP.into(), node_port(*port), protocol);
                let loopback = FrontendKey::new(Ipv4Addr::LOCALHOST.into(), node_port(*port), protocol);
                if s.kind == 4 {
                    table.entry(on_node).or_insert(frontend(FrontendKind::NodePort, Reach::Both, backends(false)));
                } else {
                    let np = frontend(FrontendKind::NodePort, Reach::LocalClients, backends(false));
                    table.entry(on_node).or_insert(np);
                    let twin = frontend(FrontendKind::NodePort, Reach::Outside, backends(true));
                    table.entry(on_node.with_scope(Scope::External)).or_insert(twin);
                }
                let lo = frontend(FrontendKind::NodePort, Reach::LocalClients, backends(false));
                table.entry(loopback).or_insert(lo);
            }
        }
    }
    table
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn model_matches_the_reference(
        services in prop::collection::vec(svc_strategy(), 0..6),
        slices in prop::collection::vec(slice_strategy(), 0..6),
    ) {
        // One object per namespace/name, as in a cluster.
        let mut unique: Vec<Svc> = Vec::new();
        for s in &services {
            if !unique.iter().any(|u| (u.ns, u.name) == (s.ns, s.name)) {
                unique.push(s.clone());
            }
        }
        let k8s_services: Vec<Service> = unique.iter().map(to_service).collect();
        let k8s_slices: Vec<EndpointSlice> = slices.iter().enumerate().map(|(i, s)| to_slice(s, i)).collect();
        let got = translate(&k8s_services, &k8s_slices, &NodeContext::new("n0").with_ips(vec![NODE_IP.into()])).table;
        let want = reference(&unique, &slices, 0);
        prop_assert_eq!(got, want);
    }
}

/// The inputs of every service of a world (API objects converted as the
/// source does): the Service and the slices naming it (sorted, to compare).
fn inputs<'a>(services: &'a [ServiceSpec], slices: &'a [SliceSpec]) -> BTreeMap<ServiceId, ServiceInput<'a>> {
    let mut out: BTreeMap<ServiceId, ServiceInput<'a>> = BTreeMap::new();
    for svc in services {
        out.entry(svc.id()).or_default().service = Some(svc);
    }
    for slice in slices {
        let owner = slice.owner.clone().expect("every generated slice names a service");
        out.entry(owner).or_default().slices.push(slice);
    }
    for input in out.values_mut() {
        input.slices.sort_by_key(|s| s.id.name().to_owned());
    }
    out
}

/// A generated world as the model's inputs: its services (the first of
/// each name) and slices.
fn world((services, slices): &(Vec<Svc>, Vec<Slice>)) -> (Vec<ServiceSpec>, Vec<SliceSpec>) {
    let mut unique: Vec<Svc> = Vec::new();
    for s in services {
        if !unique.iter().any(|u| (u.ns, u.name) == (s.ns, s.name)) {
            unique.push(s.clone());
        }
    }
    (
        unique.iter().map(|s| (&to_service(s)).into()).collect(),
        slices.iter().enumerate().map(|(i, s)| (&to_slice(s, i)).into()).collect(),
    )
}

fn same(a: Option<&ServiceInput<'_>>, b: Option<&ServiceInput<'_>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.service == b.service && a.slices == b.slices,
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A sequence of worlds applied service by service (only the services
    /// whose Service or slices changed) gives exactly the full translation
    /// of each world: table, problems, health checks; and the keys it
    /// reports changed are exactly those that did.
    #[test]
    fn incremental_updates_match_a_full_translation(
        worlds in prop::collection::vec(
            (prop::collection::vec(svc_strategy(), 0..6), prop::collection::vec(slice_strategy(), 0..6)),
            1..5,
        ),
    ) {
        let node = NodeContext::new("n0").with_ips(vec![NODE_IP.into()]);
        let mut state = TableState::default();
        let mut previous: (Vec<ServiceSpec>, Vec<SliceSpec>) = (Vec::new(), Vec::new());
        for generated in worlds {
            let (services, slices) = world(&generated);
            let before = state.table().clone();
            let (old, new) = (inputs(&previous.0, &previous.1), inputs(&services, &slices));
            let ids: BTreeSet<ServiceId> = old.keys().chain(new.keys()).cloned().collect();
            let changed: Vec<(ServiceId, ServiceInput<'_>)> = ids
                .into_iter()
                .filter(|id| !same(old.get(id), new.get(id)))
                .map(|id| {
                    let input = new.get(&id).map_or(ServiceInput { service: None, slices: Vec::new() }, |i| {
                        ServiceInput { service: i.service, slices: i.slices.clone() }
                    });
                    (id, input)
                })
                .collect();
            let delta = state.update(changed, &node);

            let mut full = TableState::default();
            full.replace_all(&services, &slices, &node);
            prop_assert_eq!(state.table(), full.table());
            let mut got: Vec<String> = state.problems().map(ToString::to_string).collect();
            let mut want: Vec<String> = full.problems().map(ToString::to_string).collect();
            got.sort();
            want.sort();
            prop_assert_eq!(got, want);
            prop_assert_eq!(state.health_checks(), full.health_checks());
            let differ: BTreeSet<FrontendKey> = before
                .keys()
                .chain(full.table().keys())
                .filter(|k| before.get(k) != full.table().get(k))
                .copied()
                .collect();
            prop_assert_eq!(delta.keys, differ);
            previous = (services, slices);
        }
    }

    /// A start's translation (`replace_all` into an empty state, built in
    /// one pass) gives the very state and delta that translating service
    /// by service (`update`) gives, and the next world applies to both
    /// alike.
    #[test]
    fn a_start_builds_what_service_by_service_updates_build(
        worlds in prop::collection::vec(
            (prop::collection::vec(svc_strategy(), 0..8), prop::collection::vec(slice_strategy(), 0..8)),
            2..3,
        ),
    ) {
        let node = NodeContext::new("n0").with_ips(vec![NODE_IP.into()]);
        let (services, slices) = world(&worlds[0]);
        let mut built = TableState::default();
        let got = built.replace_all(&services, &slices, &node);
        // The same inputs, in the order `replace_all` gathers them.
        let mut by_service: BTreeMap<ServiceId, ServiceInput<'_>> = BTreeMap::new();
        for svc in &services {
            by_service.entry(svc.id()).or_default().service = Some(svc);
        }
        for slice in &slices {
            by_service.entry(slice.owner.clone().expect("an owner")).or_default().slices.push(slice);
        }
        let mut updated = TableState::default();
        let want = updated.update(by_service, &node);
        prop_assert_eq!(&got.keys, &want.keys);
        prop_assert_eq!(&got.appeared, &want.appeared);
        prop_assert_eq!(&got.resolved, &want.resolved);
        prop_assert_eq!(&got.skipped, &want.skipped);
        prop_assert_eq!(built.table(), updated.table());
        let problems = |s: &TableState| s.problems().map(ToString::to_string).collect::<Vec<_>>();
        prop_assert_eq!(problems(&built), problems(&updated));
        prop_assert_eq!(built.health_checks(), updated.health_checks());
        prop_assert_eq!(built.no_local_endpoints(), updated.no_local_endpoints());
        prop_assert_eq!(built.skipped().collect::<Vec<_>>(), updated.skipped().collect::<Vec<_>>());
        // Every field: claims and their order, conflicts, kept frontends.
        prop_assert_eq!(format!("{built:?}"), format!("{updated:?}"));

        // The next world, service by service, into both.
        let (next_services, next_slices) = world(&worlds[1]);
        let (old, new) = (inputs(&services, &slices), inputs(&next_services, &next_slices));
        let ids: BTreeSet<ServiceId> = old.keys().chain(new.keys()).cloned().collect();
        let changes = || -> Vec<(ServiceId, ServiceInput<'_>)> {
            ids.iter()
                .map(|id| (id.clone(), new.get(id).cloned().unwrap_or_default()))
                .collect()
        };
        let (a, b) = (built.update(changes(), &node), updated.update(changes(), &node));
        prop_assert_eq!(&a.keys, &b.keys);
        prop_assert_eq!(&a.appeared, &b.appeared);
        prop_assert_eq!(&a.resolved, &b.resolved);
        prop_assert_eq!(built.table(), updated.table());
        prop_assert_eq!(problems(&built), problems(&updated));
        prop_assert_eq!(format!("{built:?}"), format!("{updated:?}"));
    }
}
