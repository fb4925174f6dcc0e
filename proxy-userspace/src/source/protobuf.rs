//! The API server's protobuf encoding (`application/vnd.kubernetes.protobuf`,
//! what kube-proxy and every client-go component ask for): lists, watch
//! events and error Statuses of Services and EndpointSlices, decoded lean.
//!
//! A body is the magic `k8s\0` and then a `runtime.Unknown` whose `raw`
//! holds the object (k8s.io/apimachinery/pkg/runtime/serializer/protobuf);
//! a watch stream is frames of a 4-byte big-endian length and a
//! `meta.v1.WatchEvent`, whose object's `raw` is such a body again.
//!
//! The messages below declare only what `super::convert` and the store
//! read, with the field numbers of k8s.io/api's `generated.proto`: prost
//! skips every other field unread (managedFields, targetRefs, the rest of
//! the spec), as `super::lean` does for JSON. They become the same lean
//! k8s-openapi objects `super::lean` makes, so the store and `convert`
//! cannot tell the encodings apart; the tests decode the real API server's
//! captures of the same moment in both and compare what `convert` makes
//! of them (tests/fixtures/real-apiserver-protobuf).
//!
//! A list is read as it arrives (`read_list`): a list from the API server's
//! watch cache comes in one response, 35 MB for 60,000 EndpointSlices, and
//! only one item's bytes are held at a time.
use std::{
    collections::BTreeMap,
    io::{self, Read},
};

use k8s_openapi::{
    api::{
        core::v1 as core,
        discovery::v1::{self as discovery},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use prost::Message;

use super::lean::{LeanService, LeanSlice};

/// The protobuf media type, as `Accept` asks for it and `Content-Type`
/// names it (a watch adds `;stream=watch`).
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// What every protobuf body starts with.
const MAGIC: &[u8; 4] = b"k8s\0";

/// An API server answer that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A protobuf body without the `k8s\0` envelope.
    #[error(
        "a body announced as protobuf does not start with the `k8s\\0` envelope (a proxy or a server that is not \
         kube-apiserver? run with --kube-api-content-type application/json)"
    )]
    NoEnvelope,
    /// The protobuf does not decode.
    #[error("the API server's protobuf does not decode: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// Reading the answer failed.
    #[error("reading the API server's answer: {0}")]
    Io(#[from] io::Error),
}

/// The object of a body: what follows the magic in `runtime.Unknown`.
#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
}

/// `bytes` without the envelope: the object's own encoding.
fn unwrap(bytes: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let body = bytes.strip_prefix(MAGIC).ok_or(DecodeError::NoEnvelope)?;
    Ok(Unknown::decode(body)?.raw.unwrap_or_default())
}

/// `meta.v1.ObjectMeta`: what `convert` and the store read.
#[derive(Clone, PartialEq, Message)]
struct Meta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: BTreeMap<String, String>,
}

/// The metadata as `super::lean` keeps it: of the annotations only those
/// the proxy reads.
fn object_meta(meta: Option<Meta>) -> ObjectMeta {
    let Some(mut m) = meta else { return ObjectMeta::default() };
    m.annotations.retain(|key, _| super::lean::is_kept_annotation(key));
    ObjectMeta {
        name: set(m.name),
        namespace: set(m.namespace),
        resource_version: set(m.resource_version),
        labels: (!m.labels.is_empty()).then_some(m.labels),
        annotations: (!m.annotations.is_empty()).then_some(m.annotations),
        ..ObjectMeta::default()
    }
}

/// A string Go holds as a plain `string`: protobuf sends it even when
/// empty, where JSON leaves it out (`omitempty`), and k8s-openapi reads
/// that as unset.
fn set(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// A number Go holds as a plain `int32` with `omitempty` (a node port):
/// zero is unset, as in JSON.
fn nonzero(n: Option<i32>) -> Option<i32> {
    n.filter(|n| *n != 0)
}

/// A list that may be missing (an empty repeated field is not sent).
fn some<T>(list: Vec<T>) -> Option<Vec<T>> {
    (!list.is_empty()).then_some(list)
}

/// `core.v1.Service`.
#[derive(Clone, PartialEq, Message)]
struct Service {
    #[prost(message, optional, tag = "1")]
    metadata: Option<Meta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<ServiceSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<ServiceStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct ServiceSpec {
    #[prost(message, repeated, tag = "1")]
    ports: Vec<ServicePort>,
    #[prost(string, optional, tag = "3")]
    cluster_ip: Option<String>,
    #[prost(string, optional, tag = "4")]
    type_: Option<String>,
    #[prost(string, repeated, tag = "5")]
    external_ips: Vec<String>,
    #[prost(string, optional, tag = "7")]
    session_affinity: Option<String>,
    #[prost(string, repeated, tag = "9")]
    load_balancer_source_ranges: Vec<String>,
    #[prost(string, optional, tag = "11")]
    external_traffic_policy: Option<String>,
    #[prost(int32, optional, tag = "12")]
    health_check_node_port: Option<i32>,
    #[prost(message, optional, tag = "14")]
    session_affinity_config: Option<SessionAffinityConfig>,
    #[prost(string, repeated, tag = "18")]
    cluster_ips: Vec<String>,
    #[prost(string, optional, tag = "22")]
    internal_traffic_policy: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ServicePort {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    protocol: Option<String>,
    #[prost(int32, optional, tag = "3")]
    port: Option<i32>,
    #[prost(int32, optional, tag = "5")]
    node_port: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct SessionAffinityConfig {
    #[prost(message, optional, tag = "1")]
    client_ip: Option<ClientIpConfig>,
}

#[derive(Clone, PartialEq, Message)]
struct ClientIpConfig {
    #[prost(int32, optional, tag = "1")]
    timeout_seconds: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct ServiceStatus {
    #[prost(message, optional, tag = "1")]
    load_balancer: Option<LoadBalancerStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct LoadBalancerStatus {
    #[prost(message, repeated, tag = "1")]
    ingress: Vec<LoadBalancerIngress>,
}

#[derive(Clone, PartialEq, Message)]
struct LoadBalancerIngress {
    #[prost(string, optional, tag = "1")]
    ip: Option<String>,
    #[prost(string, optional, tag = "3")]
    ip_mode: Option<String>,
}

impl From<Service> for LeanService {
    fn from(svc: Service) -> Self {
        let spec = svc.spec.map(|s| core::ServiceSpec {
            ports: some(
                s.ports
                    .into_iter()
                    .map(|p| core::ServicePort {
                        name: set(p.name),
                        protocol: set(p.protocol),
                        port: p.port.unwrap_or_default(),
                        node_port: nonzero(p.node_port),
                        ..core::ServicePort::default()
                    })
                    .collect(),
            ),
            cluster_ip: set(s.cluster_ip),
            cluster_ips: some(s.cluster_ips),
            type_: set(s.type_),
            external_ips: some(s.external_ips),
            session_affinity: set(s.session_affinity),
            session_affinity_config: s.session_affinity_config.map(|c| core::SessionAffinityConfig {
                client_ip: c.client_ip.map(|c| core::ClientIPConfig { timeout_seconds: c.timeout_seconds }),
            }),
            load_balancer_source_ranges: some(s.load_balancer_source_ranges),
            external_traffic_policy: set(s.external_traffic_policy),
            internal_traffic_policy: s.internal_traffic_policy,
            health_check_node_port: nonzero(s.health_check_node_port),
            ..core::ServiceSpec::default()
        });
        let status = svc.status.map(|s| core::ServiceStatus {
            load_balancer: s.load_balancer.map(|lb| core::LoadBalancerStatus {
                ingress: some(
                    lb.ingress
                        .into_iter()
                        .map(|i| core::LoadBalancerIngress { ip: set(i.ip), ip_mode: i.ip_mode, ..Default::default() })
                        .collect(),
                ),
            }),
            ..core::ServiceStatus::default()
        });
        Self(Box::new(core::Service { metadata: object_meta(svc.metadata), spec, status }))
    }
}

/// `discovery.v1.EndpointSlice`.
#[derive(Clone, PartialEq, Message)]
struct EndpointSlice {
    #[prost(message, optional, tag = "1")]
    metadata: Option<Meta>,
    #[prost(message, repeated, tag = "2")]
    endpoints: Vec<Endpoint>,
    #[prost(message, repeated, tag = "3")]
    ports: Vec<EndpointPort>,
    #[prost(string, optional, tag = "4")]
    address_type: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Endpoint {
    #[prost(string, repeated, tag = "1")]
    addresses: Vec<String>,
    #[prost(message, optional, tag = "2")]
    conditions: Option<EndpointConditions>,
    #[prost(string, optional, tag = "6")]
    node_name: Option<String>,
    #[prost(message, optional, tag = "8")]
    hints: Option<EndpointHints>,
}

#[derive(Clone, PartialEq, Message)]
struct EndpointConditions {
    #[prost(bool, optional, tag = "1")]
    ready: Option<bool>,
    #[prost(bool, optional, tag = "2")]
    serving: Option<bool>,
    #[prost(bool, optional, tag = "3")]
    terminating: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct EndpointHints {
    #[prost(message, repeated, tag = "1")]
    for_zones: Vec<Named>,
    #[prost(message, repeated, tag = "2")]
    for_nodes: Vec<Named>,
}

/// `ForZone` and `ForNode`: a name.
#[derive(Clone, PartialEq, Message)]
struct Named {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct EndpointPort {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    protocol: Option<String>,
    #[prost(int32, optional, tag = "3")]
    port: Option<i32>,
}

impl From<EndpointSlice> for LeanSlice {
    fn from(slice: EndpointSlice) -> Self {
        let names = |hints: Vec<Named>| hints.into_iter().map(|h| h.name.unwrap_or_default()).collect::<Vec<_>>();
        let endpoints = slice
            .endpoints
            .into_iter()
            .map(|e| discovery::Endpoint {
                addresses: e.addresses,
                conditions: e.conditions.map(|c| discovery::EndpointConditions {
                    ready: c.ready,
                    serving: c.serving,
                    terminating: c.terminating,
                }),
                hints: e.hints.map(|h| discovery::EndpointHints {
                    for_zones: some(names(h.for_zones).into_iter().map(|name| discovery::ForZone { name }).collect()),
                    for_nodes: some(names(h.for_nodes).into_iter().map(|name| discovery::ForNode { name }).collect()),
                }),
                node_name: e.node_name,
                ..discovery::Endpoint::default()
            })
            .collect();
        let ports = slice
            .ports
            .into_iter()
            .map(|p| discovery::EndpointPort { name: p.name, protocol: p.protocol, port: p.port, ..Default::default() })
            .collect();
        Self(Box::new(discovery::EndpointSlice {
            metadata: object_meta(slice.metadata),
            address_type: slice.address_type.unwrap_or_default(),
            endpoints: some(endpoints),
            ports: some(ports),
        }))
    }
}

/// An object the lists and watches decode from either encoding.
pub trait Decode: Sized + Send + 'static + serde::de::DeserializeOwned {
    /// The object from its protobuf encoding (without the envelope).
    fn from_protobuf(raw: &[u8]) -> Result<Self, DecodeError>;
    /// The object's resourceVersion.
    fn resource_version(&self) -> Option<&str>;
}

impl Decode for LeanService {
    fn from_protobuf(raw: &[u8]) -> Result<Self, DecodeError> {
        Ok(Service::decode(raw)?.into())
    }

    fn resource_version(&self) -> Option<&str> {
        self.0.metadata.resource_version.as_deref()
    }
}

impl Decode for LeanSlice {
    fn from_protobuf(raw: &[u8]) -> Result<Self, DecodeError> {
        Ok(EndpointSlice::decode(raw)?.into())
    }

    fn resource_version(&self) -> Option<&str> {
        self.0.metadata.resource_version.as_deref()
    }
}

/// What a list response holds, in the order it comes.
#[derive(Debug)]
pub enum Listed<K> {
    /// The list's resourceVersion and continue token.
    Meta {
        /// The list's resourceVersion.
        resource_version: Option<String>,
        /// The token that asks for the next page.
        continue_token: Option<String>,
    },
    /// An object of the list.
    Item(K),
}

/// `meta.v1.ListMeta`.
#[derive(Clone, PartialEq, Message)]
struct ListMeta {
    #[prost(string, optional, tag = "2")]
    resource_version: Option<String>,
    #[prost(string, optional, tag = "3")]
    continue_token: Option<String>,
}

/// Reads a protobuf list body from `body` as it arrives, handing its
/// metadata and each item to `each` as soon as it is read; only one item's
/// bytes are held at a time. Stops early (with `Ok`) when `each` returns
/// false.
///
/// # Errors
/// The body cannot be read, or is not a protobuf list.
pub fn read_list<K: Decode>(body: impl Read, mut each: impl FnMut(Listed<K>) -> bool) -> Result<(), DecodeError> {
    let mut body = io::BufReader::with_capacity(64 * 1024, body);
    let mut magic = [0; 4];
    body.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(DecodeError::NoEnvelope);
    }
    let mut buf = Vec::new();
    // runtime.Unknown: the list is its `raw` (2).
    while let Some((field, wire)) = key(&mut body)? {
        if (field, wire) != (2, LEN) {
            skip(&mut body, wire)?;
            continue;
        }
        let len = varint(&mut body)?.ok_or_else(truncated)?;
        let mut list = (&mut body).take(len);
        // The list: metadata (1), then items (2).
        while let Some((field, wire)) = key(&mut list)? {
            match (field, wire) {
                (1, LEN) => {
                    let meta = ListMeta::decode(bytes(&mut list, &mut buf)?)?;
                    let (resource_version, continue_token) = (meta.resource_version, meta.continue_token);
                    if !each(Listed::Meta { resource_version, continue_token }) {
                        return Ok(());
                    }
                }
                (2, LEN) => {
                    if !each(Listed::Item(K::from_protobuf(bytes(&mut list, &mut buf)?)?)) {
                        return Ok(());
                    }
                }
                _ => skip(&mut list, wire)?,
            }
        }
        if list.limit() > 0 {
            return Err(truncated().into());
        }
    }
    Ok(())
}

/// Length-delimited wire type.
const LEN: u8 = 2;

fn truncated() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "the protobuf body ends inside a field")
}

/// The next field's number and wire type; `None` at the end of `r`.
fn key(r: &mut impl Read) -> io::Result<Option<(u64, u8)>> {
    Ok(varint(r)?.map(|k| (k >> 3, u8::try_from(k & 7).unwrap_or_default())))
}

/// A varint; `None` when `r` ends before it.
fn varint(r: &mut impl Read) -> io::Result<Option<u64>> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let mut byte = [0];
        if r.read(&mut byte)? == 0 {
            return if shift == 0 { Ok(None) } else { Err(truncated()) };
        }
        value |= u64::from(byte[0] & 0x7f) << shift;
        if byte[0] < 0x80 {
            return Ok(Some(value));
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "a protobuf varint longer than ten bytes"))
}

/// A length-delimited field's bytes, read into `buf`.
fn bytes<'a>(r: &mut impl Read, buf: &'a mut Vec<u8>) -> io::Result<&'a [u8]> {
    let len = usize::try_from(varint(r)?.ok_or_else(truncated)?).map_err(io::Error::other)?;
    buf.resize(len, 0);
    r.read_exact(buf).map_err(|_| truncated())?;
    Ok(buf)
}

/// Reads past a field of wire type `wire`.
fn skip(r: &mut impl Read, wire: u8) -> io::Result<()> {
    let len = match wire {
        0 => return varint(r)?.map(drop).ok_or_else(truncated),
        1 => 8,
        LEN => varint(r)?.ok_or_else(truncated)?,
        5 => 4,
        _ => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("protobuf wire type {wire}"))),
    };
    if io::copy(&mut r.take(len), &mut io::sink())? < len {
        return Err(truncated());
    }
    Ok(())
}

/// `meta.v1.WatchEvent`.
#[derive(Clone, PartialEq, Message)]
struct WatchEvent {
    #[prost(string, optional, tag = "1")]
    type_: Option<String>,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtension>,
}

#[derive(Clone, PartialEq, Message)]
struct RawExtension {
    #[prost(bytes = "vec", optional, tag = "1")]
    raw: Option<Vec<u8>>,
}

/// A watch event as the watch reads it.
#[derive(Debug)]
pub(crate) enum Watched<K> {
    /// `ADDED`, `MODIFIED`, `DELETED` or `BOOKMARK`, and its object.
    Object(String, K),
    /// `ERROR`, and the Status it carries.
    Error(Box<kube::core::Status>),
}

/// The length of the next frame of a protobuf watch stream that starts
/// `buf`, once `buf` holds all of it.
#[must_use]
pub(crate) fn frame_len(buf: &[u8]) -> Option<usize> {
    let head: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    let len = usize::try_from(u32::from_be_bytes(head)).ok()?;
    (buf.len() >= 4 + len).then_some(4 + len)
}

/// One frame of a protobuf watch stream (its length, then the event).
///
/// # Errors
/// The frame is not a protobuf watch event.
pub(crate) fn watch_event<K: Decode>(frame: &[u8]) -> Result<Watched<K>, DecodeError> {
    let event = WatchEvent::decode(frame.get(4..).unwrap_or_default())?;
    let raw = unwrap(&event.object.and_then(|o| o.raw).unwrap_or_default())?;
    let kind = event.type_.unwrap_or_default();
    if kind == "ERROR" {
        return Ok(Watched::Error(Box::new(status_of(&raw)?)));
    }
    Ok(Watched::Object(kind, K::from_protobuf(&raw)?))
}

/// `meta.v1.Status`.
#[derive(Clone, PartialEq, Message)]
struct Status {
    #[prost(string, optional, tag = "3")]
    message: Option<String>,
    #[prost(string, optional, tag = "4")]
    reason: Option<String>,
    #[prost(int32, optional, tag = "6")]
    code: Option<i32>,
}

fn status_of(raw: &[u8]) -> Result<kube::core::Status, DecodeError> {
    let s = Status::decode(raw)?;
    Ok(kube::core::Status {
        code: s.code.and_then(|c| u16::try_from(c).ok()).unwrap_or_default(),
        message: s.message.unwrap_or_default(),
        reason: s.reason.unwrap_or_default(),
        status: Some(kube::core::response::StatusSummary::Failure),
        ..kube::core::Status::default()
    })
}

/// An error answer's Status, from a protobuf body.
///
/// # Errors
/// The body is not a protobuf Status.
pub fn status(body: &[u8]) -> Result<kube::core::Status, DecodeError> {
    status_of(&unwrap(body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ServiceSpec as ModelService, SliceSpec};

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/fixtures/real-apiserver-protobuf/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn json_items<K: serde::de::DeserializeOwned>(name: &str) -> Vec<K> {
        let list: serde_json::Value = serde_json::from_slice(&fixture(name)).unwrap();
        list["items"].as_array().unwrap().iter().map(|i| serde_json::from_value(i.clone()).unwrap()).collect()
    }

    fn pb_list<K: Decode>(name: &str) -> (Option<String>, Vec<K>) {
        let (mut rv, mut items) = (None, Vec::new());
        read_list(&fixture(name)[..], |listed| {
            match listed {
                Listed::Meta { resource_version, .. } => rv = resource_version,
                Listed::Item(item) => items.push(item),
            }
            true
        })
        .unwrap();
        (rv, items)
    }

    /// The same list a real kube-apiserver served at the same moment in
    /// both encodings converts to the same model inputs.
    #[test]
    fn real_protobuf_lists_convert_as_their_json() {
        let (rv, services) = pb_list::<LeanService>("services-list.pb");
        let json = json_items::<LeanService>("services-list.json");
        assert!(rv.is_some_and(|rv| !rv.is_empty()));
        assert_eq!(services.len(), json.len());
        assert!(services.len() >= 3, "default/kubernetes, app/web, app/web-np");
        for (pb, json) in services.iter().zip(&json) {
            assert_eq!(ModelService::from(&*pb.0), ModelService::from(&*json.0));
            assert_eq!(pb.0.metadata, json.0.metadata, "name, namespace, version, labels");
        }
        let node_port = services.iter().map(|s| ModelService::from(&*s.0)).find(|s| s.id.name() == "web-np").unwrap();
        assert_eq!(node_port.ports[0].node_port, Some(30080));

        let (_, slices) = pb_list::<LeanSlice>("endpointslices-list.pb");
        let json = json_items::<LeanSlice>("endpointslices-list.json");
        assert_eq!(slices.len(), json.len());
        for (pb, json) in slices.iter().zip(&json) {
            assert_eq!(SliceSpec::from(&*pb.0), SliceSpec::from(&*json.0));
            assert_eq!(pb.0.metadata, json.0.metadata, "with the trigger time, if any");
        }
        assert!(slices.iter().any(|s| SliceSpec::from(&*s.0).endpoints.len() == 3), "the three pods of app/web");
    }

    fn frames(name: &str) -> Vec<Vec<u8>> {
        let mut stream = &fixture(name)[..];
        let mut out = Vec::new();
        while let Some(len) = frame_len(stream) {
            out.push(stream[..len].to_vec());
            stream = &stream[len..];
        }
        assert!(stream.is_empty(), "the capture ends on a frame's end");
        out
    }

    /// Every event of the captured protobuf watch is the JSON watch's
    /// event of the same moment.
    #[test]
    fn real_protobuf_watch_events_decode_as_their_json() {
        let pb: Vec<Watched<LeanSlice>> =
            frames("endpointslices-watch.pbstream").iter().map(|f| watch_event(f).unwrap()).collect();
        let json: Vec<(String, LeanSlice)> = String::from_utf8(fixture("endpointslices-watch.jsonstream"))
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let e: serde_json::Value = serde_json::from_str(l).unwrap();
                (e["type"].as_str().unwrap().to_owned(), serde_json::from_value(e["object"].clone()).unwrap())
            })
            .collect();
        assert_eq!(pb.len(), 24);
        assert_eq!(pb.len(), json.len());
        for (pb, (kind, json)) in pb.iter().zip(&json) {
            let Watched::Object(pb_kind, pb) = pb else { panic!("an object") };
            assert_eq!(pb_kind, kind);
            assert_eq!(pb.0.metadata.resource_version, json.0.metadata.resource_version);
            assert_eq!(SliceSpec::from(&*pb.0), SliceSpec::from(&*json.0));
        }
        let kinds: Vec<String> = frames("services-watch.pbstream")
            .iter()
            .map(|f| match watch_event::<LeanService>(f).unwrap() {
                Watched::Object(kind, svc) => format!("{kind} {}", svc.0.metadata.name.unwrap_or_default()),
                Watched::Error(s) => format!("ERROR {}", s.code),
            })
            .collect();
        assert!(kinds.iter().any(|k| k == "MODIFIED web"), "{kinds:?}");
        assert!(kinds.iter().any(|k| k == "DELETED web-np"), "{kinds:?}");
    }

    /// ebpf-proxy's own annotations reach the model by protobuf as by
    /// JSON (`lean::is_kept_annotation`); the others are dropped.
    #[test]
    fn a_services_own_annotations_are_kept() {
        use crate::model::{Annotation, Forwarding, LB_ALGORITHM_ANNOTATION, LbAlgorithm, NODEPORT_MODE_ANNOTATION};
        let annotations = [
            (LB_ALGORITHM_ANNOTATION, "least-connections"),
            (NODEPORT_MODE_ANNOTATION, "dsr"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ];
        let svc = Service {
            metadata: Some(Meta {
                name: Some("web".into()),
                annotations: annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
                ..Meta::default()
            }),
            spec: None,
            status: None,
        };
        let lean = LeanService::from_protobuf(&svc.encode_to_vec()).unwrap();
        assert_eq!(lean.0.metadata.annotations.as_ref().map(std::collections::BTreeMap::len), Some(2));
        let model = ModelService::from(&*lean.0);
        assert_eq!(model.lb_algorithm, Annotation::Set(LbAlgorithm::LeastConnections));
        assert_eq!(model.nodeport_mode, Annotation::Set(Forwarding::Dsr));
    }

    #[test]
    fn broken_bodies_are_errors_not_lists() {
        let whole = fixture("endpointslices-list.pb");
        let count = |body: &[u8]| {
            let mut n = 0;
            read_list::<LeanSlice>(body, |_| {
                n += 1;
                true
            })
            .map(|()| n)
        };
        assert!(count(&whole).is_ok());
        assert!(matches!(count(&whole[..whole.len() - 3]), Err(DecodeError::Io(_) | DecodeError::Protobuf(_))));
        assert!(matches!(count(b"{\"kind\":\"List\"}"), Err(DecodeError::NoEnvelope)));
        // Stopped early: no error.
        assert_eq!(read_list::<LeanSlice>(&whole[..], |_| false).ok(), Some(()));
    }
}
