//! Services + EndpointSlices -> the desired service table.
use std::collections::{BTreeMap, btree_map::Entry};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};

use super::{
    Frontend, FrontendKey, ObjectRef, Problem, ServiceTable,
    endpoints::{self, Selection},
    frontends::{self, SkipReason},
};

/// What the model needs to know about the node it runs on.
#[derive(Clone, Debug)]
pub struct NodeContext {
    pub node_name: String,
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
        Self { node_name: node_name.into(), zone: None, max_backends: usize::from(u16::MAX) }
    }

    /// This node's context, its zone read from its Node object among `nodes`.
    #[must_use]
    pub fn from_nodes<'a>(node_name: &str, nodes: impl IntoIterator<Item = &'a Node>) -> Self {
        let zone = nodes
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(node_name))
            .and_then(|n| n.metadata.labels.as_ref()?.get(ZONE_LABEL).cloned());
        Self { zone, ..Self::new(node_name) }
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
        let selection = Selection {
            local_node: svc_frontends.internal_local.then_some(node.node_name.as_str()),
            // Zone hints apply to cluster-wide traffic, not to Local.
            zone: if svc_frontends.internal_local { None } else { node.zone.as_deref() },
            max_backends: node.max_backends,
        };
        for port in &svc_frontends.ports {
            let mut per_family: [Option<Vec<super::Backend>>; 2] = [None, None];
            for addr in &svc_frontends.addrs {
                let ipv6 = addr.is_ipv6();
                let backends = per_family[usize::from(ipv6)]
                    .get_or_insert_with(|| {
                        endpoints::backends_for_port(object, port, ipv6, &slices, &selection, &mut out.problems)
                    })
                    .clone();
                let key = FrontendKey { addr: *addr, port: port.port, protocol: port.protocol };
                let frontend = Frontend {
                    service_port: format!("{}/{}:{}", object.namespace, object.name, port.name),
                    backends,
                    affinity_timeout: svc_frontends.affinity_timeout,
                };
                match out.table.entry(key) {
                    Entry::Vacant(v) => {
                        v.insert(frontend);
                    }
                    Entry::Occupied(o) => out.problems.push(Problem::error(
                        object,
                        "spec.clusterIP",
                        format!("{key} is already served by {}; this port is skipped", o.get().service_port),
                    )),
                }
            }
        }
    }
    out
}
