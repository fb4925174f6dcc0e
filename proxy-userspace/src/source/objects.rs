//! A snapshot of the objects the model reads.
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};

/// Services, EndpointSlices and this node's Node object as one source sees
/// them at one moment.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    /// The Node this agent runs on (for its zone), when the source has it.
    pub nodes: Vec<Node>,
}
