//! An EndpointSlice as the agent keeps it between syncs: only what the
//! model reads, in about a fifth of the memory of the API object (whose
//! endpoints carry a pod reference and a dozen optional fields each). At
//! 10,000 services the slices were most of the agent's memory.
//!
//! The model reads the API type: a stored slice is expanded back
//! (`to_object`) for the services being translated, one service at a time.
//! A field the model starts to read must be kept here too; the tests
//! check that a round trip translates the same.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::discovery::v1::{Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use crate::model::{SERVICE_NAME_LABEL, ServiceId, owning_service};

/// Annotation the EndpointSlice controller sets to when the change that
/// made this version of the slice happened.
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// An EndpointSlice by namespace and name.
pub type SliceId = (String, String);

#[derive(Clone, Debug, PartialEq)]
pub struct StoredSlice {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub resource_version: Option<String>,
    /// The `kubernetes.io/service-name` label.
    pub service_name: Option<String>,
    /// The last-change-trigger-time annotation.
    pub trigger_time: Option<String>,
    /// The service it names, as the model reads the label.
    owner: Option<ServiceId>,
    pub address_type: String,
    pub ports: Option<Vec<EndpointPort>>,
    pub endpoints: Option<Box<[StoredEndpoint]>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StoredEndpoint {
    pub addresses: Box<[Box<str>]>,
    pub conditions: Option<EndpointConditions>,
    pub node_name: Option<Box<str>>,
    pub zone: Option<Box<str>>,
    pub hints: Option<Box<EndpointHints>>,
}

impl StoredSlice {
    /// Namespace and name.
    #[must_use]
    pub fn id(&self) -> SliceId {
        (self.namespace.clone().unwrap_or_else(|| "default".into()), self.name.clone().unwrap_or_default())
    }

    /// The service the slice names, if it names one.
    #[must_use]
    pub fn owner(&self) -> Option<&ServiceId> {
        self.owner.as_ref()
    }

    /// The API object again, with what the model reads.
    #[must_use]
    pub fn to_object(&self) -> EndpointSlice {
        let labels = self.service_name.as_ref().map(|s| BTreeMap::from([(SERVICE_NAME_LABEL.to_owned(), s.clone())]));
        let annotations =
            self.trigger_time.as_ref().map(|t| BTreeMap::from([(TRIGGER_TIME_ANNOTATION.to_owned(), t.clone())]));
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                resource_version: self.resource_version.clone(),
                labels,
                annotations,
                ..ObjectMeta::default()
            },
            address_type: self.address_type.clone(),
            ports: self.ports.clone(),
            endpoints: self.endpoints.as_ref().map(|e| e.iter().map(StoredEndpoint::to_object).collect()),
        }
    }
}

impl From<EndpointSlice> for StoredSlice {
    fn from(slice: EndpointSlice) -> Self {
        let owner = owning_service(&slice);
        let meta = slice.metadata;
        let mut labels = meta.labels.unwrap_or_default();
        let mut annotations = meta.annotations.unwrap_or_default();
        Self {
            namespace: meta.namespace,
            name: meta.name,
            resource_version: meta.resource_version,
            service_name: labels.remove(SERVICE_NAME_LABEL),
            trigger_time: annotations.remove(TRIGGER_TIME_ANNOTATION),
            owner,
            address_type: slice.address_type,
            ports: slice.ports,
            endpoints: slice.endpoints.map(|e| e.into_iter().map(StoredEndpoint::from).collect()),
        }
    }
}

impl StoredEndpoint {
    fn to_object(&self) -> Endpoint {
        Endpoint {
            addresses: self.addresses.iter().map(|a| String::from(&**a)).collect(),
            conditions: self.conditions.clone(),
            node_name: self.node_name.as_deref().map(str::to_owned),
            zone: self.zone.as_deref().map(str::to_owned),
            hints: self.hints.as_deref().cloned(),
            ..Endpoint::default()
        }
    }
}

impl From<Endpoint> for StoredEndpoint {
    fn from(e: Endpoint) -> Self {
        Self {
            addresses: e.addresses.into_iter().map(String::into_boxed_str).collect(),
            conditions: e.conditions,
            node_name: e.node_name.map(String::into_boxed_str),
            zone: e.zone.map(String::into_boxed_str),
            hints: e.hints.map(Box::new),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::{self, NodeContext},
        source::file,
    };

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real-apiserver").join(name)
    }

    #[test]
    fn real_slices_translate_the_same_after_a_round_trip() {
        let services = file::load(&fixture("services.yaml")).unwrap().objects.services;
        let slices = file::load(&fixture("endpointslices.yaml")).unwrap().objects.slices;
        assert!(!slices.is_empty());
        let stored: Vec<StoredSlice> = slices.iter().cloned().map(StoredSlice::from).collect();
        let again: Vec<EndpointSlice> = stored.iter().map(StoredSlice::to_object).collect();
        for node in ["n1", "n2"] {
            let node = NodeContext::new(node).with_ips(vec!["192.168.0.10".parse().unwrap()]);
            let a = model::translate(&services, &slices, &node);
            let b = model::translate(&services, &again, &node);
            assert_eq!(a.table, b.table);
            assert_eq!(a.problems, b.problems);
            assert_eq!(a.health_checks, b.health_checks);
        }
        for (s, kept) in slices.iter().zip(&stored) {
            assert_eq!(kept.owner(), owning_service(s).as_ref());
            assert_eq!(kept.resource_version, s.metadata.resource_version);
            let trigger = s.metadata.annotations.as_ref().and_then(|a| a.get(TRIGGER_TIME_ANNOTATION));
            assert_eq!(kept.trigger_time.as_ref(), trigger);
            // Stored again, the object gives the same stored slice.
            assert_eq!(&StoredSlice::from(kept.to_object()), kept);
        }
    }
}
