//! What the store drops from the Node object: at 10,000 services the
//! objects as the API sends them are most of the agent's memory. (Services
//! and EndpointSlices are kept in the model's input form, `super::convert`,
//! which takes only what the model reads.)
use k8s_openapi::{
    api::core::v1::{Node, NodeSpec, NodeStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use crate::model::{TO_BE_DELETED_TAINT, ZONE_LABEL};

/// Metadata the model never reads: managed fields, owner references,
/// finalizers, annotations.
fn slim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    meta.annotations = None;
}

/// The node keeps its zone label, its addresses, and what says it is
/// going away (deletionTimestamp, the autoscaler's taint; see `health`):
/// not its images, conditions, other taints and the rest of its spec and
/// status.
pub(crate) fn slim_node(node: &mut Node) {
    slim_meta(&mut node.metadata);
    if let Some(labels) = node.metadata.labels.as_mut() {
        labels.retain(|k, _| k == ZONE_LABEL);
    }
    let taints = node.spec.take().and_then(|s| s.taints).map(|mut taints| {
        taints.retain(|t| t.key == TO_BE_DELETED_TAINT);
        taints
    });
    node.spec = taints.filter(|t| !t.is_empty()).map(|taints| NodeSpec { taints: Some(taints), ..NodeSpec::default() });
    if let Some(status) = node.status.as_mut() {
        *status = NodeStatus { addresses: status.addresses.take(), ..NodeStatus::default() };
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{NodeSpec, Taint},
        apimachinery::pkg::apis::meta::v1::Time,
    };

    use super::*;

    #[test]
    fn a_node_keeps_what_says_it_goes_away() {
        let taint = |key: &str| Taint { key: key.to_owned(), effect: "NoSchedule".into(), ..Taint::default() };
        let mut node = Node::default();
        node.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        node.spec = Some(NodeSpec {
            taints: Some(vec![taint("node.kubernetes.io/unschedulable"), taint(TO_BE_DELETED_TAINT)]),
            pod_cidr: Some("10.244.0.0/24".into()),
            ..NodeSpec::default()
        });
        slim_node(&mut node);
        assert!(node.metadata.deletion_timestamp.is_some());
        let spec = node.spec.expect("the autoscaler taint is kept");
        assert_eq!(spec.taints.unwrap().iter().map(|t| t.key.as_str()).collect::<Vec<_>>(), [TO_BE_DELETED_TAINT]);
        assert_eq!(spec.pod_cidr, None);

        let mut plain =
            Node { spec: Some(NodeSpec { taints: Some(vec![taint("x")]), ..NodeSpec::default() }), ..Node::default() };
        slim_node(&mut plain);
        assert_eq!(plain.spec, None, "nothing of the spec is kept");
    }
}
