//! What the stores drop from the API objects: at 10,000 services the
//! objects as the API sends them are most of the agent's memory. A field
//! the model starts to read must be kept here too. (EndpointSlices are
//! kept as `StoredSlice`, which takes only what the model reads.)
use k8s_openapi::{
    api::core::v1::{Node, NodeStatus, Service},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use crate::model::ZONE_LABEL;

/// Metadata the model never reads: managed fields, owner references,
/// finalizers, annotations.
fn slim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    meta.annotations = None;
}

pub fn slim_service(svc: &mut Service) {
    slim_meta(&mut svc.metadata);
    if let Some(status) = svc.status.as_mut() {
        status.conditions = None;
    }
}

/// The node keeps its zone label and its addresses: not its images,
/// conditions and the rest of its status.
pub fn slim_node(node: &mut Node) {
    slim_meta(&mut node.metadata);
    if let Some(labels) = node.metadata.labels.as_mut() {
        labels.retain(|k, _| k == ZONE_LABEL);
    }
    node.spec = None;
    if let Some(status) = node.status.as_mut() {
        *status = NodeStatus { addresses: status.addresses.take(), ..NodeStatus::default() };
    }
}
