//! What every source gives the pipeline (`crate::pipeline`): a signal that
//! something changed, then what changed.
use std::{
    future::Future,
    sync::Arc,
    time::{Instant, SystemTime},
};

use super::{Snapshot, stored_slice::StoredSlice};
use crate::model::{ServiceId, ServiceSpec};

/// One Service and the EndpointSlices that name it, as a source holds them.
pub(crate) type ServiceInputs = (Arc<ServiceSpec>, Vec<Arc<StoredSlice>>);

/// What a source delivers for one sync.
#[derive(Debug)]
pub struct Delivery {
    pub(crate) snapshot: Snapshot,
    /// The `last-change-trigger-time`s of the EndpointSlice versions it
    /// carries that are new since the last delivery.
    pub(crate) triggers: Vec<SystemTime>,
    /// Objects the source could not read (it logged each).
    pub rejected: u64,
}

impl Delivery {
    #[must_use]
    pub(crate) const fn new(snapshot: Snapshot) -> Self {
        Self { snapshot, triggers: Vec::new(), rejected: 0 }
    }
}

/// A source of Services, EndpointSlices and this node's Node: the
/// Kubernetes API, a services file, or a test's own.
pub trait ChangeSource {
    /// For the logs: `kubernetes`, `file`, ...
    fn name(&self) -> &'static str;

    /// Resolves once the source holds a complete first view (the initial
    /// lists); nothing is written before.
    fn ready(&mut self) -> impl Future<Output = anyhow::Result<()>> {
        async { Ok(()) }
    }

    /// Resolves when there is something new to read (the first time: as
    /// soon as there is anything).
    fn changed(&mut self) -> impl Future<Output = ()>;

    /// Called between `changed` and `snapshot`: waits, if the last sync
    /// ended at `last_sync` only moments ago, so a burst becomes one sync.
    fn gather(&mut self, last_sync: Option<Instant>) -> impl Future<Output = ()> {
        let _ = last_sync;
        async {}
    }

    /// What changed since the last call (everything, the first time);
    /// `None` when nothing usable could be read: what is applied stays.
    fn snapshot(&mut self) -> Option<Delivery>;

    /// Everything the source holds (every service is translated again when
    /// this node's addresses or zone change).
    fn everything(&mut self) -> Option<Delivery>;

    /// Changes received and not yet delivered: (Service changes,
    /// EndpointSlice changes), for kube-proxy's `*_changes_pending`.
    fn pending(&self) -> (usize, usize) {
        (0, 0)
    }

    /// The first table is in the maps and translation has started.
    fn started(&self, frontends: usize) {
        let _ = frontends;
    }

    /// The Service `service` and the EndpointSlices that name it as the
    /// source holds them now (for `ebpf-proxy explain`: at most one sync
    /// ahead of the maps); `None` when it has no such Service (or keeps no
    /// objects).
    fn inputs(&self, service: &ServiceId) -> Option<ServiceInputs> {
        let _ = service;
        None
    }
}
