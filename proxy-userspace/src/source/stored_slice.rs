//! An EndpointSlice as the agent keeps it between syncs: the model's input
//! form of it (`crate::model::SliceSpec`, converted once in
//! `super::convert`; the store keeps its resourceVersion). At 10,000
//! services the slices as the API sends them were most of the agent's
//! memory.
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::model::{ServiceId, SliceSpec};

/// Annotation the EndpointSlice controller sets to when the change that
/// made this version of the slice happened.
pub(crate) const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

pub(crate) use crate::model::SliceId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSlice {
    /// What the model reads.
    pub(crate) spec: SliceSpec,
}

impl StoredSlice {
    /// Namespace and name (a shared copy).
    #[must_use]
    pub(crate) fn id(&self) -> SliceId {
        self.spec.id.clone()
    }

    /// The service the slice names, if it names one.
    #[must_use]
    pub(crate) const fn owner(&self) -> Option<&ServiceId> {
        self.spec.owner.as_ref()
    }
}

impl From<&EndpointSlice> for StoredSlice {
    fn from(slice: &EndpointSlice) -> Self {
        Self { spec: slice.into() }
    }
}

/// The slice's last-change-trigger-time annotation, as written.
#[must_use]
pub(crate) fn trigger_time(slice: &EndpointSlice) -> Option<&str> {
    slice.metadata.annotations.as_ref()?.get(TRIGGER_TIME_ANNOTATION).map(String::as_str)
}
