//! A snapshot of the objects the model reads.
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

/// Services and EndpointSlices as one source sees them at one moment.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
}
