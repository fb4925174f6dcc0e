//! The EndpointSlices as the watch reports them, kept compact
//! (`StoredSlice`), with what changed since the agent last read them.
//!
//! Kept here rather than in a kube-runtime reflector store, which would
//! hold the API objects; the list/relist semantics are the reflector's: a
//! relist is gathered aside and swapped in whole when complete, so a
//! reconnect never shows a cluster without slices.
use std::{collections::HashMap, sync::Arc, time::SystemTime};

use k8s_openapi::{api::discovery::v1::EndpointSlice, jiff::Timestamp};
use kube::runtime::watcher;

use super::{
    stored_slice::{SliceId, StoredSlice},
    tracker::Pending,
};

#[derive(Debug, Default)]
pub struct SliceStore {
    live: HashMap<SliceId, Arc<StoredSlice>>,
    /// A (re-)list in progress.
    relisting: Option<HashMap<SliceId, Arc<StoredSlice>>>,
    /// The first list is complete.
    listed: bool,
    /// Trigger times of slice versions that arrived since the last read
    /// (none from the first list: those changes happened before start).
    triggers: Vec<SystemTime>,
}

impl SliceStore {
    /// Takes in one watch event, recording in `pending` what it touched.
    pub fn apply(&mut self, event: watcher::Event<EndpointSlice>, pending: &mut Pending) {
        match event {
            watcher::Event::Init => self.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(obj) => {
                let slice = StoredSlice::from(obj);
                let id = slice.id();
                if self.listed && self.live.get(&id).map(|s| &s.resource_version) != Some(&slice.resource_version) {
                    self.triggers.extend(trigger_time(&slice));
                }
                self.relisting.get_or_insert_default().insert(id, Arc::new(slice));
            }
            watcher::Event::InitDone => {
                self.live = self.relisting.take().unwrap_or_default();
                self.listed = true;
                pending.full = true;
            }
            watcher::Event::Apply(obj) => {
                let slice = StoredSlice::from(obj);
                self.triggers.extend(trigger_time(&slice));
                pending.slice(&slice);
                self.live.insert(slice.id(), Arc::new(slice));
            }
            watcher::Event::Delete(obj) => {
                let slice = StoredSlice::from(obj);
                pending.slice(&slice);
                self.live.remove(&slice.id());
            }
        }
    }

    /// Whether the first list is complete.
    #[must_use]
    pub fn is_listed(&self) -> bool {
        self.listed
    }

    #[must_use]
    pub fn get(&self, id: &SliceId) -> Option<Arc<StoredSlice>> {
        self.live.get(id).cloned()
    }

    /// Every slice.
    #[must_use]
    pub fn all(&self) -> Vec<Arc<StoredSlice>> {
        self.live.values().cloned().collect()
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.live.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The trigger times gathered since the last call.
    pub fn take_triggers(&mut self) -> Vec<SystemTime> {
        std::mem::take(&mut self.triggers)
    }
}

fn trigger_time(slice: &StoredSlice) -> Option<SystemTime> {
    slice.trigger_time.as_deref()?.parse::<Timestamp>().ok().map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn slice(name: &str, version: &str, trigger: &str) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                resource_version: Some(version.into()),
                labels: Some(BTreeMap::from([("kubernetes.io/service-name".into(), "web".into())])),
                annotations: Some(BTreeMap::from([(
                    "endpoints.kubernetes.io/last-change-trigger-time".into(),
                    trigger.into(),
                )])),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            ..EndpointSlice::default()
        }
    }

    fn id(name: &str) -> SliceId {
        ("ns".into(), name.into())
    }

    #[test]
    fn a_relist_swaps_in_whole_and_only_new_versions_count_as_triggers() {
        let mut store = SliceStore::default();
        let mut pending = Pending::default();
        store.apply(watcher::Event::Init, &mut pending);
        store.apply(watcher::Event::InitApply(slice("a", "1", "2026-01-01T00:00:00Z")), &mut pending);
        assert!(!store.is_listed() && store.get(&id("a")).is_none(), "a list is not visible before it is done");
        store.apply(watcher::Event::InitDone, &mut pending);
        assert!(store.is_listed() && pending.full);
        assert!(store.take_triggers().is_empty(), "the first list's changes happened before start");

        store.apply(watcher::Event::Apply(slice("b", "2", "2026-01-01T00:00:01Z")), &mut pending);
        assert_eq!(store.take_triggers().len(), 1);
        assert!(pending.slices.contains(&id("b")));

        // A relist: a unchanged, b at a new version, c gone missing from it.
        store.apply(watcher::Event::Init, &mut pending);
        store.apply(watcher::Event::InitApply(slice("a", "1", "2026-01-01T00:00:00Z")), &mut pending);
        store.apply(watcher::Event::InitApply(slice("b", "3", "2026-01-01T00:00:02Z")), &mut pending);
        assert_eq!(store.len(), 2, "the old state stays until the relist is done");
        store.apply(watcher::Event::InitDone, &mut pending);
        assert_eq!(store.take_triggers().len(), 1, "only b changed");
        assert_eq!(store.get(&id("b")).unwrap().resource_version.as_deref(), Some("3"));

        store.apply(watcher::Event::Delete(slice("a", "1", "")), &mut pending);
        assert!(store.get(&id("a")).is_none());
        assert_eq!(store.all().len(), 1);
    }
}
