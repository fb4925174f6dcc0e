//! Why each endpoint of a service port is used or not, for `ebpf-proxy
//! explain`: the same inputs as `endpoints::backends_for_port` (the port,
//! the family, the slices, the selection), every endpoint the slices list
//! with its verdict. A test holds the two together: the endpoints said to
//! be used are exactly the backends the model programs.
//!
//! `explain_entry` is what the agent answers `ebpf-proxy explain` with
//! (`crate::observe::explain_socket`): one frontend entry of a service, from the
//! service, its slices and the node the model last translated for.
use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

use super::{
    BackendState, FrontendKey,
    endpoints::{Hints, Selection, Topology, topology},
    frontends::{self, PortSpec},
    input::{AddressType, EndpointSpec, ServiceSpec, SliceSpec},
    table::NodeContext,
};

/// Why an endpoint the cluster has is not a backend of a frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Unused {
    /// Its slice has no port of this name and protocol.
    PortNameUnmatched,
    /// Neither ready nor serving-and-terminating.
    NotReady,
    /// On another node, and the traffic policy is Local.
    OtherNode,
    /// Serving and terminating, but ready endpoints exist (kube-proxy falls
    /// back to terminating endpoints only when no endpoint is ready).
    TerminatingNotNeeded,
    /// Its node hints are for other nodes, and every ready endpoint has node
    /// hints with one for this node (`trafficDistribution: PreferSameNode`).
    NodeHint,
    /// Its zone hints are for other zones, and every ready endpoint has hints
    /// with one for this node's zone.
    ZoneHint,
    /// Past the most backends a frontend holds (by address order).
    OverCap,
}

impl Unused {
    /// What the operator reads.
    #[must_use]
    pub(crate) const fn text(self) -> &'static str {
        match self {
            Self::PortNameUnmatched => "its slice has no port of this name and protocol",
            Self::NotReady => "not ready (and not serving while terminating)",
            Self::OtherNode => "on another node, and the traffic policy is Local",
            Self::TerminatingNotNeeded => "terminating; ready endpoints exist, so it is not needed",
            Self::NodeHint => "its node hints are for other nodes",
            Self::ZoneHint => "its zone hints are for other zones",
            Self::OverCap => "over the most backends a frontend holds",
        }
    }
}

/// One endpoint of the service's slices, and whether the frontend uses it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EndpointUse {
    pub(crate) address: IpAddr,
    /// The target port (`None`: the slice has no matching port).
    pub(crate) port: Option<u16>,
    /// Its node (`nodeName`), when the slice says.
    pub(crate) node: Option<String>,
    /// `None`: a backend of the frontend.
    pub(crate) unused: Option<Unused>,
}

/// Every endpoint one frontend entry may use, with its verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Explained {
    /// The name of the service port the entry serves (`""`: unnamed).
    pub(crate) port_name: String,
    /// Only this node's endpoints are eligible (a Local traffic policy:
    /// `internalTrafficPolicy` for a ClusterIP, `externalTrafficPolicy`
    /// for the external entry of traffic from outside).
    pub(crate) local_only: bool,
    /// The zone whose hints are followed, when the node has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) zone: Option<String>,
    pub(crate) endpoints: Vec<EndpointUse>,
}

/// Why a service entry cannot be explained.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotExplained {
    #[error("the service is not programmed: {0}")]
    Skipped(&'static str),
    #[error("the service has no entry {0} on this node (the maps may be older than the service: run explain again)")]
    NoSuchEntry(FrontendKey),
}

/// Every endpoint of `svc`'s slices for the entry `key` (its address,
/// port or nodePort, protocol and scope), with why it is not used: the
/// port and the endpoint selection are found as `translate_service` finds
/// them for that entry (`service::entry_selection`), so the answer holds
/// for exactly the entry the maps hold.
pub(crate) fn explain_entry(
    svc: &ServiceSpec,
    slices: &[&SliceSpec],
    node: &NodeContext,
    key: FrontendKey,
) -> Result<Explained, NotExplained> {
    let svc_frontends =
        frontends::service_frontends(svc, &mut Vec::new()).map_err(|reason| NotExplained::Skipped(reason.as_str()))?;
    let (port, selection) = svc_frontends
        .ports
        .iter()
        .enumerate()
        .find_map(|(i, port)| Some((port, super::service::entry_selection(&svc_frontends, port, i, node, key)?)))
        .ok_or(NotExplained::NoSuchEntry(key))?;
    // In the model's order (by namespace and name), so the answer is stable.
    let mut slices = slices.to_vec();
    slices.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(Explained {
        port_name: port.name.clone(),
        local_only: selection.local_node.is_some(),
        zone: selection.zone.map(str::to_owned),
        endpoints: endpoint_uses(port, key.addr.is_ipv6(), &slices, &selection),
    })
}

/// An endpoint that passed the per-endpoint checks: its best state across
/// slices, its topology hints, its node.
type Candidate<'a> = (BackendState, Hints<'a>, Option<String>);

/// An endpoint's conditions, as the model reads them (the source filled
/// in kube-proxy's defaults: absent ready/serving true, terminating false).
const fn state_of(endpoint: &EndpointSpec) -> Option<BackendState> {
    match (endpoint.ready, endpoint.serving && endpoint.terminating) {
        (true, _) => Some(BackendState::Active),
        (false, true) => Some(BackendState::Terminating),
        (false, false) => None,
    }
}

/// Every endpoint of `port` in the slices of one family (`ipv6`), with
/// why it is not used, under `selection`: the reasons are checked in the
/// order the model applies them (port, conditions, node, terminating
/// fallback, node or zone hints, cap), and each endpoint gets the first that applies. An
/// endpoint without a valid address of the family is left out (the model
/// reports it as a problem of its slice).
#[must_use]
pub(crate) fn endpoint_uses(
    port: &PortSpec,
    ipv6: bool,
    slices: &[&SliceSpec],
    selection: &Selection<'_>,
) -> Vec<EndpointUse> {
    let family = if ipv6 { AddressType::IPv6 } else { AddressType::IPv4 };
    let mut out = Vec::new();
    // Candidates by (address, port): best state, topology hints, node.
    let mut candidates: BTreeMap<(IpAddr, u16), Candidate<'_>> = BTreeMap::new();
    for slice in slices.iter().filter(|s| s.address_type == family) {
        let target = super::endpoints::slice_port(slice, port, &mut Vec::new());
        for endpoint in &slice.endpoints {
            let Some(address) = endpoint.address().as_ref().and_then(super::input::Address::ip) else { continue };
            if address.is_ipv6() != ipv6 {
                continue;
            }
            let node = endpoint.node_name().map(str::to_owned);
            let rejected = |unused| EndpointUse { address, port: target, node: node.clone(), unused: Some(unused) };
            let Some(target) = target else {
                out.push(rejected(Unused::PortNameUnmatched));
                continue;
            };
            let Some(state) = state_of(endpoint) else {
                out.push(rejected(Unused::NotReady));
                continue;
            };
            if selection.local_node.is_some() && node.as_deref() != Some(selection.node_name) {
                out.push(rejected(Unused::OtherNode));
                continue;
            }
            let c = candidates.entry((address, target)).or_insert((state, Hints::default(), None));
            c.0 = c.0.min(state);
            c.1.add(endpoint);
            // The model marks a backend local if any of its entries is.
            if c.2.as_deref() != Some(selection.node_name) {
                c.2.clone_from(&node);
            }
        }
    }
    let wanted = if candidates.values().any(|c| c.0 == BackendState::Active) {
        BackendState::Active
    } else {
        BackendState::Terminating
    };
    let topology = if wanted == BackendState::Active {
        topology(selection, candidates.values().filter(|c| c.0 == BackendState::Active).map(|c| &c.1))
    } else {
        Topology::Any
    };
    let mut kept = 0;
    for ((address, target), (state, hints, node)) in candidates {
        let unused = if state != wanted {
            Some(Unused::TerminatingNotNeeded)
        } else if !hints.allow(topology) {
            Some(match topology {
                Topology::Node(_) => Unused::NodeHint,
                _ => Unused::ZoneHint,
            })
        } else if kept == selection.max_backends {
            Some(Unused::OverCap)
        } else {
            kept += 1;
            None
        };
        out.push(EndpointUse { address, port: Some(target), node, unused });
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    use super::*;
    use crate::model::{ObjectRef, Protocol, endpoints::backends_for_port};

    /// Slices as the source hands them to the model.
    fn slices(yaml: &str) -> Vec<SliceSpec> {
        yaml.split("---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| SliceSpec::from(&serde_norway::from_str::<EndpointSlice>(d).unwrap()))
            .collect()
    }

    fn http() -> PortSpec {
        PortSpec { name: "http".into(), port: 80, protocol: Protocol::Tcp, node_port: None }
    }

    const PORTS: &str = "addressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\n";

    /// A slice with the ports above and `endpoints` (YAML flow list items).
    fn slice(endpoints: &[&str]) -> String {
        format!("metadata: {{name: s, namespace: ns}}\n{PORTS}endpoints: [{}]\n", endpoints.join(", "))
    }

    struct Case {
        name: &'static str,
        slices: String,
        local: bool,
        zone: Option<&'static str>,
        max: usize,
        /// (last octet of 10.0.0.x, verdict)
        expected: &'static [(u8, Option<Unused>)],
    }

    fn cases() -> Vec<Case> {
        let ep = |last: u8, rest: &str| format!("{{addresses: [10.0.0.{last}]{rest}}}");
        let ready = |last| ep(last, ", conditions: {ready: true}, nodeName: here");
        let zoned = |last, zone: &str| {
            ep(last, &format!(", conditions: {{ready: true}}, nodeName: here, hints: {{forZones: [{{name: {zone}}}]}}"))
        };
        let terminating = |last| ep(last, ", conditions: {ready: false, serving: true, terminating: true}");
        vec![
            Case {
                name: "ready endpoints are used; not ready ones are not",
                slices: slice(&[&ready(1), &ep(2, ", conditions: {ready: false}")]),
                local: false,
                zone: None,
                max: 10,
                expected: &[(2, Some(Unused::NotReady)), (1, None)],
            },
            Case {
                name: "terminating ones only when nothing is ready",
                slices: slice(&[&ready(1), &terminating(2)])
                    + "---\n"
                    + &slice(&[&terminating(3)]).replace("name: s,", "name: t,"),
                local: false,
                zone: None,
                max: 10,
                expected: &[
                    (1, None),
                    (2, Some(Unused::TerminatingNotNeeded)),
                    (3, Some(Unused::TerminatingNotNeeded)),
                ],
            },
            Case {
                name: "the fallback when none is ready",
                slices: slice(&[
                    &terminating(2),
                    &ep(3, ", conditions: {ready: false, serving: false, terminating: true}"),
                ]),
                local: false,
                zone: None,
                max: 10,
                expected: &[(3, Some(Unused::NotReady)), (2, None)],
            },
            Case {
                name: "Local: endpoints of other nodes are not used",
                slices: slice(&[&ready(1), &ep(2, ", nodeName: there"), &ep(3, "")]),
                local: true,
                zone: None,
                max: 10,
                expected: &[(2, Some(Unused::OtherNode)), (3, Some(Unused::OtherNode)), (1, None)],
            },
            Case {
                name: "zone hints for this zone narrow the ready endpoints",
                slices: slice(&[&zoned(1, "a"), &zoned(2, "b")]),
                local: false,
                zone: Some("a"),
                max: 10,
                expected: &[(1, None), (2, Some(Unused::ZoneHint))],
            },
            Case {
                name: "zone hints are ignored unless every ready endpoint has one",
                slices: slice(&[&zoned(1, "a"), &ready(2)]),
                local: false,
                zone: Some("a"),
                max: 10,
                expected: &[(1, None), (2, None)],
            },
            Case {
                name: "a slice without the port name",
                slices: slice(&[&ready(1)])
                    + "---\n"
                    + &slice(&[&ready(2)]).replace("name: http", "name: metrics").replace("name: s,", "name: t,"),
                local: false,
                zone: None,
                max: 10,
                expected: &[(2, Some(Unused::PortNameUnmatched)), (1, None)],
            },
            Case {
                name: "over the cap, by address order",
                slices: slice(&[&ready(3), &ready(1), &ready(2)]),
                local: false,
                zone: None,
                max: 2,
                expected: &[(1, None), (2, None), (3, Some(Unused::OverCap))],
            },
        ]
    }

    /// kube-proxy's topologyModeFromHints (pkg/proxy/topology.go): node
    /// hints (`trafficDistribution: PreferSameNode`) are followed when every
    /// ready endpoint has one and one names this node, before zone hints.
    fn node_hint_cases() -> Vec<Case> {
        let ep = |last: u8, rest: &str| format!("{{addresses: [10.0.0.{last}]{rest}}}");
        let zoned = |last, zone: &str| {
            ep(last, &format!(", conditions: {{ready: true}}, nodeName: here, hints: {{forZones: [{{name: {zone}}}]}}"))
        };
        let noded = |last, nodes: &str| {
            ep(last, &format!(", conditions: {{ready: true}}, hints: {{forNodes: [{nodes}], forZones: [{{name: a}}]}}"))
        };
        vec![
            Case {
                name: "node hints for this node narrow the ready endpoints, before zone hints",
                slices: slice(&[
                    &noded(1, "{name: here}"),
                    &noded(2, "{name: there}"),
                    &noded(3, "{name: there}, {name: here}"),
                ]),
                local: false,
                zone: Some("a"),
                max: 10,
                expected: &[(1, None), (2, Some(Unused::NodeHint)), (3, None)],
            },
            Case {
                name: "node hints naming only other nodes fall back to zone hints",
                slices: slice(&[&noded(1, "{name: there}"), &zoned(2, "b")])
                    .replace("forZones: [{name: b}]", "forZones: [{name: b}], forNodes: [{name: there}]"),
                local: false,
                zone: Some("a"),
                max: 10,
                expected: &[(1, None), (2, Some(Unused::ZoneHint))],
            },
            Case {
                name: "node hints are ignored unless every ready endpoint has one",
                slices: slice(&[&noded(1, "{name: here}"), &zoned(2, "a"), &ep(3, ", conditions: {ready: false}")]),
                local: false,
                zone: None,
                max: 10,
                expected: &[(3, Some(Unused::NotReady)), (1, None), (2, None)],
            },
        ]
    }

    #[test]
    fn each_endpoint_gets_its_reason() {
        for case in cases().into_iter().chain(node_hint_cases()) {
            let owned = slices(&case.slices);
            let refs: Vec<&SliceSpec> = owned.iter().collect();
            let selection = Selection {
                local_node: case.local.then_some("here"),
                zone: case.zone,
                node_name: "here",
                max_backends: case.max,
            };
            let uses = endpoint_uses(&http(), false, &refs, &selection);
            let got: Vec<(u8, Option<Unused>)> = uses
                .iter()
                .map(|u| match u.address {
                    IpAddr::V4(a) => (a.octets()[3], u.unused),
                    IpAddr::V6(_) => unreachable!("IPv4 slices"),
                })
                .collect();
            assert_eq!(got, case.expected, "{}", case.name);
            // The endpoints said to be used are the model's backends.
            let backends = backends_for_port(
                &ObjectRef::new("Service", Some("ns"), Some("s")),
                &http(),
                false,
                &refs,
                &selection,
                &mut Vec::new(),
            );
            let said_used: Vec<(IpAddr, u16)> =
                uses.iter().filter(|u| u.unused.is_none()).map(|u| (u.address, u.port.unwrap())).collect();
            let programmed: Vec<(IpAddr, u16)> = backends.iter().map(|b| (b.addr, b.port)).collect();
            assert_eq!(said_used, programmed, "{}: the model's backends", case.name);
            assert!(uses.iter().all(|u| u.unused.is_none_or(|r| !r.text().is_empty())));
        }
    }

    /// A NodePort service, externalTrafficPolicy: Local, and
    /// internalTrafficPolicy as given.
    fn service(internal: &str) -> ServiceSpec {
        let yaml = format!(
            "metadata: {{name: s, namespace: ns}}\nspec: {{type: NodePort, clusterIP: 10.96.0.9, \
             externalTrafficPolicy: Local, internalTrafficPolicy: {internal}, \
             ports: [{{name: http, port: 80, nodePort: 30080}}]}}\n"
        );
        ServiceSpec::from(&serde_norway::from_str::<k8s_openapi::api::core::v1::Service>(&yaml).unwrap())
    }

    /// Each entry of a service is explained with the selection the model
    /// gives it: the endpoints said to be used are the backends of that
    /// entry in the model's own translation.
    #[test]
    fn entries_are_explained_as_the_model_translates_them() {
        use crate::model::{NodeContext, Scope, service::translate_service};
        let owned = slices(&slice(&[
            "{addresses: [10.0.0.1], conditions: {ready: true}, nodeName: here}",
            "{addresses: [10.0.0.2], conditions: {ready: true}, nodeName: there}",
            "{addresses: [10.0.0.3], conditions: {ready: false}, nodeName: here}",
        ]));
        let refs: Vec<&SliceSpec> = owned.iter().collect();
        let node = NodeContext::new("here").with_ips(vec!["192.0.2.1".parse().unwrap()]);
        let cluster_ip = FrontendKey::new("10.96.0.9".parse().unwrap(), 80, Protocol::Tcp);
        let node_port = FrontendKey::new("192.0.2.1".parse().unwrap(), 30080, Protocol::Tcp);
        let external = node_port.with_scope(Scope::External);
        for (internal, key, local_only, used) in [
            ("Cluster", cluster_ip, false, &[1, 2][..]),
            ("Local", cluster_ip, true, &[1][..]),
            ("Cluster", node_port, false, &[1, 2][..]),
            ("Cluster", external, true, &[1][..]),
        ] {
            let svc = service(internal);
            let got = explain_entry(&svc, &refs, &node, key).unwrap();
            assert_eq!((got.port_name.as_str(), got.local_only), ("http", local_only), "{internal} {key}");
            let said_used: Vec<(IpAddr, u16)> =
                got.endpoints.iter().filter(|u| u.unused.is_none()).map(|u| (u.address, u.port.unwrap())).collect();
            let expected: Vec<(IpAddr, u16)> =
                used.iter().map(|last| (IpAddr::from([10, 0, 0, *last]), 8080)).collect();
            assert_eq!(said_used, expected, "{internal} {key}");
            let output = translate_service(&svc, &refs, &node);
            let claim = output.claims.iter().find(|c| c.key == key).expect("the model has the entry");
            let frontend = claim.frontend.as_ref().expect("a fresh translation keeps its frontends");
            let programmed: Vec<(IpAddr, u16)> = frontend.backends.iter().map(|b| (b.addr, b.port)).collect();
            assert_eq!(said_used, programmed, "{internal} {key}: the model's backends");
            let not_ready = got.endpoints.iter().find(|u| u.address == IpAddr::from([10, 0, 0, 3])).unwrap();
            assert_eq!(not_ready.unused, Some(Unused::NotReady));
        }
        let elsewhere = FrontendKey::new("10.96.0.10".parse().unwrap(), 80, Protocol::Tcp);
        assert_eq!(
            explain_entry(&service("Cluster"), &refs, &node, elsewhere),
            Err(NotExplained::NoSuchEntry(elsewhere))
        );
        let udp = FrontendKey::new("10.96.0.9".parse().unwrap(), 80, Protocol::Udp);
        assert!(explain_entry(&service("Cluster"), &refs, &node, udp).is_err(), "the port is TCP");
        let mut headless = service("Cluster");
        headless.cluster_ip = Some("None".into());
        headless.cluster_ips = Box::default();
        assert!(matches!(explain_entry(&headless, &refs, &node, cluster_ip), Err(NotExplained::Skipped(_))));
    }
}
