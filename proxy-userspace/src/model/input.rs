//! What the model reads: a Service and an EndpointSlice in the compact
//! form the source converts each API object into once
//! (`crate::source::convert`), with only the fields the model uses. This is
//! also what the source's store holds between syncs.
//!
//! Values the model validates (addresses, port numbers, protocols, CIDRs)
//! stay as the API object wrote them, so a problem names the field and the
//! value as written; defaults the API documents (`protocol: TCP`, endpoint
//! conditions) are applied by the conversion.
//!
//! A field the model starts to read is added here and filled in
//! `crate::source::convert`, nowhere else.
use std::{fmt, net::IpAddr, sync::Arc};

use super::{ObjectRef, ServiceId, SliceId};

/// `spec.type` of a Service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServiceType {
    /// `ClusterIP`, and a type the model does not know (served as one).
    #[default]
    ClusterIp,
    /// `NodePort`.
    NodePort,
    /// `LoadBalancer`.
    LoadBalancer,
    /// `ExternalName`: not proxied.
    ExternalName,
}

/// One Service as the model reads it. Held by the store between syncs:
/// its text fields are boxed, without a `String`'s or a `Vec`'s spare
/// capacity and third word (200 bytes and 64 a port before, 144 and 48).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceSpec {
    /// `metadata.namespace` (`default` when unset) and `metadata.name`
    /// (`<unnamed>` when unset), shared with every holder of the id.
    pub(crate) id: ServiceId,
    /// The value of the `service.kubernetes.io/service-proxy-name` label.
    pub(crate) service_proxy_name: Option<Box<str>>,
    /// The object has no `spec` (the fields below are then unset).
    pub(crate) no_spec: bool,
    pub(crate) service_type: ServiceType,
    /// `spec.clusterIP` as written.
    pub(crate) cluster_ip: Option<Box<str>>,
    /// `spec.clusterIPs` as written (authoritative when not empty).
    pub(crate) cluster_ips: Box<[Box<str>]>,
    pub(crate) ports: Box<[ServicePortSpec]>,
    /// `spec.internalTrafficPolicy: Local`.
    pub(crate) internal_local: bool,
    /// `spec.externalTrafficPolicy: Local`.
    pub(crate) external_local: bool,
    /// `spec.sessionAffinity: ClientIP`, with
    /// `sessionAffinityConfig.clientIP.timeoutSeconds` as written.
    #[allow(clippy::option_option, reason = "no affinity, affinity without a timeout written, or with one")]
    pub(crate) client_ip_affinity: Option<Option<i32>>,
    /// `spec.externalIPs` as written.
    pub(crate) external_ips: Box<[Box<str>]>,
    /// `status.loadBalancer.ingress`, in order (problems name the index).
    pub(crate) lb_ingress: Box<[IngressSpec]>,
    /// `spec.loadBalancerSourceRanges` as written.
    pub(crate) source_ranges: Box<[Box<str>]>,
    /// `spec.healthCheckNodePort` as written.
    pub(crate) health_check_node_port: Option<i32>,
    /// The `ebpf-proxy.io/lb-algorithm` annotation.
    pub(crate) lb_algorithm: Annotation<super::LbAlgorithm>,
    /// The `ebpf-proxy.io/nodeport-mode` annotation.
    pub(crate) nodeport_mode: Annotation<super::Forwarding>,
}

/// One of ebpf-proxy's own annotations of a Service (`lb-algorithm`,
/// `nodeport-mode`), as the conversion read it. Unlike the values above,
/// a value it does not name is not kept as written: one byte in the
/// padding of every stored Service instead of a string's 16 (a million
/// services' worth at 100,000), for annotations that are rarely set and,
/// when wrong, reported without their value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Annotation<T> {
    /// No annotation.
    #[default]
    Unset,
    /// An annotation naming this value.
    Set(T),
    /// A value that names none.
    Unknown,
}

impl<T> Annotation<T> {
    /// The annotation's value as written (`None`: unset), read by `parse`.
    pub(crate) fn read(value: Option<&str>, parse: impl Fn(&str) -> Option<T>) -> Self {
        match value {
            None => Self::Unset,
            Some(value) => parse(value).map_or(Self::Unknown, Self::Set),
        }
    }
}

/// One `spec.ports[]` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServicePortSpec {
    /// `""` when unnamed.
    pub(crate) name: Box<str>,
    /// As written; `TCP` when unset.
    pub(crate) protocol: Box<str>,
    pub(crate) port: i32,
    pub(crate) node_port: Option<i32>,
}

/// One `status.loadBalancer.ingress[]` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IngressSpec {
    /// As written; `None`: a hostname-only ingress.
    pub(crate) ip: Option<Box<str>>,
    /// `ipMode: Proxy`: the load balancer itself proxies it.
    pub(crate) proxy_mode: bool,
}

impl ServiceSpec {
    #[must_use]
    pub(crate) fn object_ref(&self) -> ObjectRef {
        ObjectRef::new("Service", Some(self.id.namespace()), Some(self.id.name()))
    }

    /// The id (a shared copy).
    #[must_use]
    pub fn id(&self) -> ServiceId {
        self.id.clone()
    }
}

/// `addressType` of an EndpointSlice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AddressType {
    /// `IPv4`.
    #[default]
    IPv4,
    /// `IPv6`.
    IPv6,
    /// `FQDN` and anything else: not proxied.
    Other,
}

/// One EndpointSlice as the model reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceSpec {
    /// `metadata.namespace` (`default` when unset) and `metadata.name`
    /// (`<unnamed>` when unset), shared with the store's key.
    pub id: SliceId,
    /// The service its `kubernetes.io/service-name` label names.
    pub owner: Option<ServiceId>,
    pub(crate) address_type: AddressType,
    pub(crate) ports: Box<[SlicePortSpec]>,
    pub(crate) endpoints: Box<[EndpointSpec]>,
}

impl SliceSpec {
    #[must_use]
    pub(crate) fn object_ref(&self) -> ObjectRef {
        ObjectRef::new("EndpointSlice", Some(self.id.namespace()), Some(self.id.name()))
    }
}

/// One `ports[]` entry of a slice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlicePortSpec {
    /// `""` when unnamed.
    pub(crate) name: Box<str>,
    /// As written; `TCP` when unset.
    pub(crate) protocol: Box<str>,
    pub(crate) port: Option<i32>,
}

/// One endpoint of a slice: 32 bytes (a cluster of 100,000 services
/// holds a million of them). Its node name, hints and an address written
/// otherwise are one pointer to a copy shared by every endpoint placed
/// alike (nearly every endpoint on one node: `Placement`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSpec {
    /// Its first address (as kube-proxy, the model uses only that one)
    /// when it is an IP address written the way it prints (nearly always;
    /// else the placement holds it as written).
    ip: Option<IpAddr>,
    /// `conditions.ready` (unset: true).
    pub(crate) ready: bool,
    /// `conditions.serving` (unset: true).
    pub(crate) serving: bool,
    /// `conditions.terminating` (unset: false).
    pub(crate) terminating: bool,
    /// `None`: no node name, no hints, and an IP address or none.
    placement: Option<Placement>,
}

/// An endpoint's `hints`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointHints {
    /// `hints.forZones[].name`.
    pub(crate) zones: Box<[Box<str>]>,
    /// `hints.forNodes[].name` (`trafficDistribution: PreferSameNode`).
    pub(crate) nodes: Box<[Box<str>]>,
}

impl EndpointHints {
    fn is_empty(&self) -> bool {
        self.zones.is_empty() && self.nodes.is_empty()
    }
}

/// Where an endpoint runs and what few endpoints have, shared: every
/// endpoint on one node with the same hints holds one copy
/// (`crate::source::placements` hands them out), a pointer of 8 bytes in
/// each endpoint.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Placement(Arc<PlacementData>);

/// Where an endpoint runs: its node and zone, and its hints.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PlacementData {
    /// `nodeName`.
    pub(crate) node_name: Option<Box<str>>,
    pub(crate) hints: EndpointHints,
    /// The first address when it is not an IP address written the way it
    /// prints (kept as written, for the problem that names it).
    pub(crate) raw_address: Option<Box<str>>,
}

impl Placement {
    /// A copy of its own (the source shares one: `crate::source::placements`).
    #[must_use]
    pub(crate) fn new(data: PlacementData) -> Self {
        Self(Arc::new(data))
    }

    #[cfg(test)]
    /// Whether `a` and `b` are the same copy.
    #[must_use]
    pub(crate) fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// Holders of this copy.
    #[must_use]
    pub(crate) fn holders(this: &Self) -> usize {
        Arc::strong_count(&this.0)
    }
}

impl std::ops::Deref for Placement {
    type Target = PlacementData;
    fn deref(&self) -> &PlacementData {
        &self.0
    }
}

impl std::borrow::Borrow<PlacementData> for Placement {
    fn borrow(&self) -> &PlacementData {
        &self.0
    }
}

impl EndpointSpec {
    /// An endpoint with its first address (`None`: it has none), its node
    /// and hints, and, as the API leaves them unset, ready, serving and not
    /// terminating. `share` gives the placement's shared copy.
    #[must_use]
    pub(crate) fn new(
        address: Option<Address>,
        node_name: Option<&str>,
        hints: EndpointHints,
        share: impl FnOnce(PlacementData) -> Placement,
    ) -> Self {
        let (ip, raw_address) = match address {
            Some(Address::Ip(ip)) => (Some(ip), None),
            Some(Address::Raw(raw)) => (None, Some(raw)),
            None => (None, None),
        };
        let placed = node_name.is_some() || raw_address.is_some() || !hints.is_empty();
        let placement =
            placed.then(|| share(PlacementData { node_name: node_name.map(Into::into), hints, raw_address }));
        Self { ip, placement, ..Self::default() }
    }

    /// Its first address, as written (`None`: it has none).
    #[must_use]
    pub(crate) fn address(&self) -> Option<Address> {
        match (self.ip, self.placement.as_ref().and_then(|p| p.raw_address.as_ref())) {
            (Some(ip), _) => Some(Address::Ip(ip)),
            (None, Some(raw)) => Some(Address::Raw(raw.clone())),
            (None, None) => None,
        }
    }

    /// `nodeName`.
    #[must_use]
    pub(crate) fn node_name(&self) -> Option<&str> {
        self.placement.as_ref()?.node_name.as_deref()
    }

    /// `hints.forZones[].name`.
    #[must_use]
    pub(crate) fn zone_hints(&self) -> &[Box<str>] {
        self.placement.as_ref().map_or(&[], |p| &p.hints.zones)
    }

    /// `hints.forNodes[].name`.
    #[must_use]
    pub(crate) fn node_hints(&self) -> &[Box<str>] {
        self.placement.as_ref().map_or(&[], |p| &p.hints.nodes)
    }

    #[cfg(test)]
    /// Its shared placement (`None`: it has none).
    #[must_use]
    pub(crate) const fn placement(&self) -> Option<&Placement> {
        self.placement.as_ref()
    }
}

impl Default for EndpointSpec {
    fn default() -> Self {
        Self { ip: None, ready: true, serving: true, terminating: false, placement: None }
    }
}

/// An endpoint address: parsed when it is an IP address written the way
/// it prints (nearly always), else kept as written for the problem that
/// names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Address {
    /// An IP address.
    Ip(IpAddr),
    /// Anything else, as written.
    Raw(Box<str>),
}

impl Address {
    #[must_use]
    pub(crate) fn new(raw: &str) -> Self {
        match raw.parse::<IpAddr>() {
            // An IPv4 address parses only as written canonically (four
            // decimal parts, no leading zero), so it is not written back
            // to compare (a million endpoints at 100,000 services).
            Ok(ip @ IpAddr::V4(_)) => Self::Ip(ip),
            Ok(ip) if ip.to_string() == raw => Self::Ip(ip),
            _ => Self::Raw(raw.into()),
        }
    }

    /// The address, if it is one.
    #[must_use]
    pub(crate) fn ip(&self) -> Option<IpAddr> {
        match self {
            Self::Ip(ip) => Some(*ip),
            Self::Raw(raw) => raw.parse().ok(),
        }
    }
}

/// As written.
impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(ip) => ip.fmt(f),
            Self::Raw(raw) => f.write_str(raw),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_keeps_how_it_was_written() {
        for raw in [
            "10.0.0.1",
            "0.0.0.0",
            "fd00::1",
            "::ffff:10.0.0.1",
            "010.0.0.1",
            "10.00.0.1",
            "10.0.0.01",
            "10.0.0.1.",
            "+10.0.0.1",
            "10.0.0.256",
            "10.0.1",
            "fd00:0::1",
            "FD00::1",
            "x",
            "",
        ] {
            let addr = Address::new(raw);
            assert_eq!(addr.to_string(), raw);
            assert_eq!(addr.ip(), raw.parse().ok(), "{raw}");
        }
        assert!(matches!(Address::new("10.0.0.1"), Address::Ip(_)));
        assert!(matches!(Address::new("fd00:0::1"), Address::Raw(_)));
    }
}
