//! Services and EndpointSlices decoded lean: the watches deserialize only
//! the fields `super::convert` reads, straight from the API server's JSON,
//! into a k8s-openapi object that holds just those. What an object as a
//! real API server sends it carries besides (`managedFields`, whose
//! `fieldsV1` would each be decoded into a tree of JSON values, kubectl's
//! last-applied annotation, each endpoint's `targetRef`) is skipped by the
//! JSON reader without being allocated: decoding them was most of the
//! agent's time and allocations while the lists arrived.
//!
//! A field `convert` starts to read must be decoded here too; the tests at
//! the end decode the real API server's captures both ways and compare
//! what `convert` makes of them.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{Service, ServiceSpec, ServiceStatus},
        discovery::v1::{Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::{Deserialize, Deserializer, de::IgnoredAny};

use super::stored_slice::TRIGGER_TIME_ANNOTATION;

/// A Service with only what `convert` reads (see the module docs).
///
/// Boxed, as `LeanSlice`: from its decoding to the store an object is
/// moved about eight times (into the page's list, the watcher's queue, its
/// event, the channel to the store, the store's batch), and a Service is
/// 824 bytes, an EndpointSlice 432; boxed, each move is a pointer's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeanService(pub(crate) Box<Service>);

/// An EndpointSlice with only what `convert` and the store read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeanSlice(pub Box<EndpointSlice>);

/// The metadata `convert` and the store read: namespace, name, labels,
/// resourceVersion, and of the annotations only the EndpointSlice
/// controller's trigger time and `ebpf-proxy.io/lb-algorithm`.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "kept_annotations")]
    annotations: Option<BTreeMap<String, String>>,
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> Self {
        Self {
            name: m.name,
            namespace: m.namespace,
            resource_version: m.resource_version,
            labels: m.labels,
            annotations: m.annotations,
            ..Self::default()
        }
    }
}

/// Whether an annotation is one the proxy reads: the trigger time (a
/// slice's), ebpf-proxy's own (a service's). The others (kubectl's
/// last-applied configuration among them) are not kept.
pub(super) fn is_kept_annotation(key: &str) -> bool {
    key == TRIGGER_TIME_ANNOTATION
        || key == crate::model::LB_ALGORITHM_ANNOTATION
        || key == crate::model::NODEPORT_MODE_ANNOTATION
}

/// The annotations `is_kept_annotation` keeps; the others are skipped
/// unread.
fn kept_annotations<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of annotations")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut kept = None;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if is_kept_annotation(&key) {
                    let value = map.next_value::<String>()?;
                    kept.get_or_insert_with(BTreeMap::new).insert(key.into_owned(), value);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(kept)
        }
    }
    d.deserialize_any(Visitor)
}

impl<'de> Deserialize<'de> for LeanService {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Lean {
            #[serde(default)]
            metadata: Meta,
            spec: Option<ServiceSpec>,
            status: Option<ServiceStatus>,
        }
        let Lean { metadata, spec, status } = Lean::deserialize(d)?;
        Ok(Self(Box::new(Service { metadata: metadata.into(), spec, status })))
    }
}

impl<'de> Deserialize<'de> for LeanSlice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Lean {
            #[serde(default)]
            metadata: Meta,
            #[serde(default)]
            address_type: String,
            endpoints: Option<Vec<LeanEndpoint>>,
            ports: Option<Vec<EndpointPort>>,
        }
        /// An endpoint without its `targetRef`, `zone`, `hostname` and
        /// deprecated topology.
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct LeanEndpoint {
            #[serde(default, deserialize_with = "null_as_empty")]
            addresses: Vec<String>,
            conditions: Option<EndpointConditions>,
            hints: Option<EndpointHints>,
            node_name: Option<String>,
        }
        let Lean { metadata, address_type, endpoints, ports } = Lean::deserialize(d)?;
        let endpoints = endpoints.map(|endpoints| {
            endpoints
                .into_iter()
                .map(|e| Endpoint {
                    addresses: e.addresses,
                    conditions: e.conditions,
                    hints: e.hints,
                    node_name: e.node_name,
                    ..Endpoint::default()
                })
                .collect()
        });
        Ok(Self(Box::new(EndpointSlice { metadata: metadata.into(), address_type, endpoints, ports })))
    }
}

/// A list that may be `null` (as k8s-openapi reads one).
fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// Where and what the lean types are on the API server: the same as the
/// objects they stand for, so kube's `Api` and watcher request the same
/// paths.
macro_rules! resource_as {
    ($lean:ty, $full:ty) => {
        impl k8s_openapi::Resource for $lean {
            const API_VERSION: &'static str = <$full as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$full as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$full as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$full as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str = <$full as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$full as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::Metadata for $lean {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.0.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.0.metadata
            }
        }
    };
}
resource_as!(LeanService, Service);
resource_as!(LeanSlice, EndpointSlice);

/// What `LeanService` and `LeanSlice` box, once the store takes it.
#[must_use]
#[allow(clippy::boxed_local, reason = "a `fn(Box<K>) -> K` for `unwrap_event`")]
pub(crate) fn unboxed<K>(object: Box<K>) -> K {
    *object
}

/// A watch event of a lean object as one of the object it stands for.
pub(crate) fn unwrap_event<L, K>(
    event: kube::runtime::watcher::Event<L>,
    full: fn(L) -> K,
) -> kube::runtime::watcher::Event<K> {
    use kube::runtime::watcher::Event;
    match event {
        Event::Apply(o) => Event::Apply(full(o)),
        Event::Delete(o) => Event::Delete(full(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(full(o)),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ServiceSpec as ModelService, SliceSpec};

    /// The real API server's list captures (`tests/fixtures/real-apiserver`).
    fn capture(name: &str) -> serde_json::Value {
        let path = format!("{}/tests/fixtures/real-apiserver/{name}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn items(list: &serde_json::Value) -> Vec<String> {
        list["items"].as_array().expect("items").iter().map(ToString::to_string).collect()
    }

    /// The objects of a captured watch stream (one event a line).
    fn watched(name: &str) -> Vec<String> {
        let path = format!("{}/tests/fixtures/real-apiserver/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|e| e["object"]["kind"] == "EndpointSlice")
            .map(|e| e["object"].to_string())
            .collect()
    }

    /// Every Service and EndpointSlice a real kube-apiserver served,
    /// decoded lean, converts to what the whole object converts to.
    #[test]
    fn lean_objects_convert_as_the_whole_ones() {
        let services = items(&capture("services-list-page1.json"));
        assert!(!services.is_empty());
        for json in services {
            let whole: Service = serde_json::from_str(&json).unwrap();
            let lean: LeanService = serde_json::from_str(&json).unwrap();
            assert_eq!(ModelService::from(&*lean.0), ModelService::from(&whole), "{json}");
            assert_eq!(lean.0.metadata.resource_version, whole.metadata.resource_version);
            assert_eq!(lean.0.metadata.managed_fields, None, "managedFields are not decoded");
        }
        let mut slices = items(&capture("endpointslices-list.json"));
        slices.extend(watched("watch-endpointslices-from-0.jsonl"));
        slices.extend(watched("watch-endpointslices-changes.jsonl"));
        assert!(slices.len() > 3);
        for json in slices {
            let whole: EndpointSlice = serde_json::from_str(&json).unwrap();
            let lean: LeanSlice = serde_json::from_str(&json).unwrap();
            assert_eq!(SliceSpec::from(&*lean.0), SliceSpec::from(&whole), "{json}");
            assert_eq!(lean.0.metadata.resource_version, whole.metadata.resource_version);
            assert_eq!(
                super::super::stored_slice::trigger_time(&lean.0),
                super::super::stored_slice::trigger_time(&whole)
            );
        }
    }

    /// Of the annotations only the trigger time is kept; the fields it
    /// does not read, however they are written, are skipped.
    #[test]
    fn only_what_is_read_is_kept() {
        let json = serde_json::json!({
            "metadata": {
                "name": "web-abc", "namespace": "shop", "resourceVersion": "7",
                "labels": {"kubernetes.io/service-name": "web"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"big\": [1, 2, 3]}",
                    TRIGGER_TIME_ANNOTATION: "2026-11-25T10:00:00Z",
                    "other": "x"
                },
                "managedFields": [{"manager": "m", "fieldsV1": {"f:endpoints": {}}}]
            },
            "addressType": "IPv4",
            "endpoints": [{
                "addresses": ["10.0.0.1"], "nodeName": "n1", "zone": "z",
                "conditions": {"ready": false},
                "targetRef": {"kind": "Pod", "name": "p", "uid": "u"},
                "deprecatedTopology": {"a": "b"}
            }, {"addresses": null}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        });
        let LeanSlice(slice) = serde_json::from_value(json).unwrap();
        assert_eq!(
            slice.metadata.annotations,
            Some(BTreeMap::from([(TRIGGER_TIME_ANNOTATION.to_owned(), "2026-11-25T10:00:00Z".to_owned())]))
        );
        assert_eq!(slice.metadata.labels.unwrap()["kubernetes.io/service-name"], "web");
        let endpoints = slice.endpoints.unwrap();
        assert_eq!(endpoints.len(), 2);
        assert_eq!(endpoints[0].target_ref, None);
        assert_eq!(endpoints[0].zone, None);
        assert_eq!(endpoints[0].node_name.as_deref(), Some("n1"));
        assert_eq!(endpoints[0].conditions.as_ref().and_then(|c| c.ready), Some(false));
        assert!(endpoints[1].addresses.is_empty());
        assert_eq!(slice.ports.unwrap()[0].port, Some(8080));

        let svc: LeanService = serde_json::from_str(r#"{"metadata":{"name":"a","annotations":null}}"#).unwrap();
        assert_eq!(svc.0.metadata.annotations, None);
        assert_eq!(svc.0.spec, None);
    }

    /// A Service's own annotations are kept, its others are not.
    #[test]
    fn a_services_own_annotations_are_kept() {
        let svc: LeanService = serde_json::from_str(
            r#"{"metadata":{"name":"a","annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}",
                "ebpf-proxy.io/lb-algorithm":"least-connections","ebpf-proxy.io/nodeport-mode":"snat"}}}"#,
        )
        .unwrap();
        let kept = svc.0.metadata.annotations.unwrap();
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!(kept[crate::model::LB_ALGORITHM_ANNOTATION], "least-connections");
        assert_eq!(kept[crate::model::NODEPORT_MODE_ANNOTATION], "snat");
    }
}
