//! What a source delivers: all objects at once, or the services that
//! changed, in the model's input form (`super::convert`).
use std::sync::Arc;

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};

use super::stored_slice::StoredSlice;
#[cfg(test)]
use crate::model::SliceSpec;
use crate::model::{ServiceId, ServiceSpec};

/// Services, EndpointSlices and this node's Node object as one source sees
/// them at one moment.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    /// The Node this agent runs on (for its zone), when the source has it.
    pub nodes: Vec<Node>,
}

impl Objects {
    #[cfg(test)]
    /// The Services and EndpointSlices in the model's input form.
    #[must_use]
    pub(crate) fn inputs(&self) -> (Vec<ServiceSpec>, Vec<SliceSpec>) {
        (self.services.iter().map(Into::into).collect(), self.slices.iter().map(Into::into).collect())
    }
}

/// What a source has for the agent since it last asked.
#[derive(Clone, Debug)]
pub(crate) enum Snapshot {
    /// Everything: the first read, a relist, a services file read again.
    Full { services: Vec<Arc<ServiceSpec>>, slices: Vec<Arc<StoredSlice>>, nodes: Vec<Arc<Node>> },
    /// Only these services changed: each with its Service now (`None`:
    /// deleted) and the EndpointSlices that name it now; `nodes` is this
    /// node's Node object when it may have changed.
    Changed { services: Vec<Changed>, nodes: Option<Vec<Arc<Node>>> },
}

/// One service's objects now.
#[derive(Clone, Debug)]
pub(crate) struct Changed {
    pub(crate) id: ServiceId,
    pub(crate) service: Option<Arc<ServiceSpec>>,
    pub(crate) slices: Vec<Arc<StoredSlice>>,
}

impl From<Objects> for Snapshot {
    fn from(objects: Objects) -> Self {
        Self::Full {
            services: objects.services.iter().map(|s| Arc::new(ServiceSpec::from(s))).collect(),
            slices: objects.slices.iter().map(|s| Arc::new(StoredSlice::from(s))).collect(),
            nodes: objects.nodes.into_iter().map(Arc::new).collect(),
        }
    }
}
