//! The objects a watching source holds, and what changed since the pipeline
//! last read them. It is fed watch events (kube-runtime's
//! `watcher::Event`: a list or relist, then changes): by the Kubernetes
//! source's watch tasks, or directly by a test, so the same store is
//! tested without an API server.
//!
//! A relist updates the objects in place and removes, when it is complete,
//! those it did not see: the store never holds two copies of the cluster,
//! and never shows it empty. Every object it holds is a version the API
//! server sent, so a read in the middle of a relist sees real objects,
//! only some of them newer. An object a relist brings back at the version
//! the store holds is left as it is; the services whose objects changed or
//! went are pending like those of watch events, so a relist is read and
//! translated as the changes it found (as kube-proxy's change trackers,
//! which compare each relisted object with the one they hold), not as
//! everything again. Only the first list is read whole.
use std::{collections::BTreeSet, hash::Hash, sync::Arc, time::SystemTime};

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use k8s_openapi::{
    api::{
        core::v1::{Node, Service},
        discovery::v1::EndpointSlice,
    },
    jiff::Timestamp,
};
use kube::runtime::watcher::Event;

use super::{
    Changed, Delivery, Snapshot, convert,
    slim::slim_node,
    stored_slice::{self, SliceId, StoredSlice},
    tracker::SliceIndex,
};
use crate::model::{ServiceId, ServiceSpec};

/// The objects of one kind, by id, with a relist in progress.
#[derive(Debug)]
struct Kind<K, V> {
    live: HashMap<K, Entry<V>>,
    /// The ids a relist in progress has seen.
    relist: Option<HashSet<K>>,
    /// The first list is complete.
    listed: bool,
}

/// An object and the resourceVersion it was converted from.
#[derive(Debug)]
struct Entry<V> {
    version: Option<Box<str>>,
    value: Arc<V>,
}

impl<K, V> Default for Kind<K, V> {
    fn default() -> Self {
        Self { live: HashMap::new(), relist: None, listed: false }
    }
}

impl<K: Clone + Eq + Hash, V> Kind<K, V> {
    fn begin_list(&mut self) {
        self.relist = Some(HashSet::new());
    }

    /// Whether the store holds `id` at `version` already; if so, a relist
    /// in progress has seen it. A relist after 410 Gone brings back nearly
    /// every object unchanged: those are neither converted again nor
    /// reallocated (which would scatter the store's long-lived objects
    /// among the freed list pages, where the heap cannot give memory back).
    fn unchanged(&mut self, id: &K, version: Option<&str>) -> bool {
        let held = self.live.get_key_value(id).filter(|(_, e)| version.is_some() && e.version.as_deref() == version);
        // The id held, not `id`: the list's own copy of it is dropped with
        // the list's object, so that a relist holds no copy of an id
        // beside the store's (a shared id: the pointer's 8 bytes).
        if let (Some((held, _)), Some(seen)) = (held, self.relist.as_mut()) {
            seen.insert(held.clone());
        }
        held.is_some()
    }

    /// Puts `value` at `version` in place; returns what it replaced.
    fn upsert(&mut self, id: K, version: Option<&str>, value: V) -> Option<Entry<V>> {
        if let Some(seen) = self.relist.as_mut() {
            seen.insert(id.clone());
        }
        self.live.insert(id, Entry { version: version.map(Into::into), value: Arc::new(value) })
    }

    /// Removes `id`; returns what it held.
    fn remove(&mut self, id: &K) -> Option<Entry<V>> {
        self.live.remove(id)
    }

    /// Ends a list: removes what it did not see; returns those ids and
    /// what each held.
    fn end_list(&mut self) -> Vec<(K, Arc<V>)> {
        self.listed = true;
        let Some(seen) = self.relist.take() else { return Vec::new() };
        let gone: Vec<K> = self.live.keys().filter(|id| !seen.contains(*id)).cloned().collect();
        gone.into_iter().filter_map(|id| self.live.remove(&id).map(|e| (id, e.value))).collect()
    }

    /// What `id` holds now.
    fn value(&self, id: &K) -> Option<&V> {
        self.live.get(id).map(|e| &*e.value)
    }

    fn get(&self, id: &K) -> Option<Arc<V>> {
        self.live.get(id).map(|e| e.value.clone())
    }

    fn all(&self) -> Vec<Arc<V>> {
        self.live.values().map(|e| e.value.clone()).collect()
    }
}

/// What changed since the last read.
#[derive(Debug, Default)]
struct Pending {
    /// Everything must be read: the first lists.
    full: bool,
    /// A relist ended: a sync follows even when it found no change.
    relisted: bool,
    /// This node's Node object changed (its zone or addresses may have).
    node: bool,
    /// Services whose Service changed, or one of whose slices did.
    services: BTreeSet<ServiceId>,
    /// Service and EndpointSlice watch events (not list progress) since
    /// the last read.
    events: (usize, usize),
}

impl Pending {
    /// A list ended: the first asks for everything; a relist for the
    /// services of what it removed (`gone`), besides those it changed.
    fn ended_list(&mut self, relist: bool, gone: impl IntoIterator<Item = ServiceId>) {
        if relist {
            self.services.extend(gone);
            self.relisted = true;
        } else {
            self.full = true;
        }
    }
}

/// The Services and EndpointSlices a source holds, and what changed since the last delivery.
#[derive(Debug)]
pub struct ObjectStore {
    services: Kind<ServiceId, ServiceSpec>,
    slices: Kind<SliceId, StoredSlice>,
    nodes: Kind<String, Node>,
    /// The slices of each service.
    index: SliceIndex,
    pending: Pending,
    /// Trigger times of slice versions that arrived since the last read
    /// (none from the first list: those changes happened before start).
    triggers: Vec<SystemTime>,
}

impl Default for ObjectStore {
    fn default() -> Self {
        Self {
            services: Kind::default(),
            slices: Kind::default(),
            nodes: Kind::default(),
            index: SliceIndex::default(),
            pending: Pending { full: true, node: true, ..Pending::default() },
            triggers: Vec::new(),
        }
    }
}

impl ObjectStore {
    /// Takes in a Service watch event.
    pub fn service_event(&mut self, event: Event<Service>) {
        match event {
            Event::Init => self.services.begin_list(),
            Event::InitApply(svc) => {
                let id = convert::service_id(&svc);
                let version = svc.metadata.resource_version.as_deref();
                if !self.services.unchanged(&id, version) {
                    let spec = self.service_spec(&svc);
                    if self.services.listed {
                        self.pending.services.insert(spec.id());
                    }
                    self.services.upsert(spec.id(), version, spec);
                }
            }
            Event::InitDone => {
                let relist = self.services.listed;
                let gone = self.services.end_list().into_iter().map(|(id, _)| id);
                self.pending.ended_list(relist, gone);
            }
            Event::Apply(svc) => {
                self.pending.events.0 += 1;
                let spec = self.service_spec(&svc);
                self.pending.services.insert(spec.id());
                self.services.upsert(spec.id(), svc.metadata.resource_version.as_deref(), spec);
            }
            Event::Delete(svc) => {
                self.pending.events.0 += 1;
                let id = convert::service_id(&svc);
                self.services.remove(&id);
                self.pending.services.insert(id);
            }
        }
    }

    /// Takes in an EndpointSlice watch event.
    pub fn slice_event(&mut self, event: Event<EndpointSlice>) {
        match event {
            Event::Init => self.slices.begin_list(),
            Event::InitApply(obj) => {
                let id = convert::slice_id(&obj);
                let version = obj.metadata.resource_version.as_deref();
                if self.slices.unchanged(&id, version) {
                    return;
                }
                let slice = self.stored_slice(&obj);
                let id = slice.id();
                // The first list is read whole after it: no need to note
                // what it touches.
                let mut first_list = BTreeSet::new();
                let touched = if self.slices.listed { &mut self.pending.services } else { &mut first_list };
                let old = self.slices.upsert(id.clone(), version, slice);
                self.index.set(&id, old.as_ref().map(|o| &*o.value), self.slices.value(&id), touched);
                // A version new to a relist carries its trigger time (the
                // first list's changes happened before start).
                if self.slices.listed && old.is_none_or(|o| o.version.as_deref() != version) {
                    self.triggers.extend(trigger_time(&obj));
                }
            }
            Event::InitDone => {
                let relist = self.slices.listed;
                let mut touched = BTreeSet::new();
                for (id, before) in self.slices.end_list() {
                    self.index.set(&id, Some(&before), None, &mut touched);
                }
                self.pending.ended_list(relist, touched);
            }
            Event::Apply(obj) => {
                let slice = self.stored_slice(&obj);
                self.pending.events.1 += 1;
                self.triggers.extend(trigger_time(&obj));
                let id = slice.id();
                let old = self.slices.upsert(id.clone(), obj.metadata.resource_version.as_deref(), slice);
                let (before, now) = (old.as_ref().map(|o| &*o.value), self.slices.value(&id));
                self.index.set(&id, before, now, &mut self.pending.services);
            }
            Event::Delete(obj) => {
                self.pending.events.1 += 1;
                let id = convert::slice_id(&obj);
                let before = self.slices.remove(&id);
                self.index.set(&id, before.as_ref().map(|o| &*o.value), None, &mut self.pending.services);
            }
        }
    }

    /// `svc` converted, its id shared with what the store holds already
    /// (the Service's previous version, or the slices that name it).
    fn service_spec(&self, svc: &Service) -> ServiceSpec {
        let mut spec = ServiceSpec::from(svc);
        spec.id = self.shared_id(spec.id);
        spec
    }

    /// `obj` converted, its id and that of the service it names shared
    /// likewise.
    fn stored_slice(&self, obj: &EndpointSlice) -> StoredSlice {
        let mut slice = StoredSlice::from(obj);
        if let Some((held, _)) = self.slices.live.get_key_value(&slice.spec.id) {
            slice.spec.id = held.clone();
        }
        if let Some(owner) = slice.spec.owner.take() {
            slice.spec.owner = Some(self.shared_id(owner));
        }
        slice
    }

    /// The store's copy of `id` when it holds one, else `id`: each
    /// service's id is allocated once however many hold it (see
    /// `crate::model::ServiceId`).
    fn shared_id(&self, id: ServiceId) -> ServiceId {
        self.services
            .live
            .get_key_value(&id)
            .map(|(held, _)| held.clone())
            .or_else(|| self.index.shared_id(&id))
            .unwrap_or(id)
    }

    /// Takes in a Node watch event (the source watches this node's only).
    pub fn node_event(&mut self, event: Event<Node>) {
        let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        match event {
            Event::Init => self.nodes.begin_list(),
            Event::InitApply(mut node) => {
                slim_node(&mut node);
                self.nodes.upsert(name(&node), None, node);
            }
            Event::InitDone => {
                self.nodes.end_list();
                self.pending.node = true;
            }
            Event::Apply(mut node) => {
                slim_node(&mut node);
                self.nodes.upsert(name(&node), None, node);
                self.pending.node = true;
            }
            Event::Delete(node) => {
                self.nodes.remove(&name(&node));
                self.pending.node = true;
            }
        }
    }

    /// Whether every first list is complete.
    #[must_use]
    pub(crate) fn is_listed(&self) -> bool {
        self.services.listed && self.slices.listed && self.nodes.listed
    }

    /// Service and EndpointSlice changes since the last read.
    #[must_use]
    pub(crate) const fn pending_events(&self) -> (usize, usize) {
        self.pending.events
    }

    /// Whether anything changed since the last read.
    #[must_use]
    pub fn has_pending(&self) -> bool {
        self.pending.full || self.pending.relisted || self.pending.node || !self.pending.services.is_empty()
    }

    /// What changed since the last read (everything, the first time and
    /// after a relist).
    pub fn take(&mut self) -> Delivery {
        let pending = std::mem::take(&mut self.pending);
        if pending.full {
            return self.everything();
        }
        let services = pending.services.into_iter().map(|id| self.service(id)).collect();
        let nodes = pending.node.then(|| self.nodes.all());
        Delivery {
            snapshot: Snapshot::Changed { services, nodes },
            triggers: std::mem::take(&mut self.triggers),
            rejected: 0,
        }
    }

    /// Everything the store holds.
    pub fn everything(&mut self) -> Delivery {
        self.pending = Pending::default();
        let snapshot =
            Snapshot::Full { services: self.services.all(), slices: self.slices.all(), nodes: self.nodes.all() };
        Delivery { snapshot, triggers: std::mem::take(&mut self.triggers), rejected: 0 }
    }

    /// One service's objects as the store holds them now.
    fn service(&self, id: ServiceId) -> Changed {
        let service = self.services.get(&id);
        let slices = self.index.slices_of(&id).filter_map(|s| self.slices.get(s)).collect();
        Changed { id, service, slices }
    }

    /// One Service and its slices as the store holds them now.
    #[must_use]
    pub(crate) fn inputs(&self, id: &ServiceId) -> Option<super::change_source::ServiceInputs> {
        let Changed { service, slices, .. } = self.service(id.clone());
        Some((service?, slices))
    }

    /// Objects held: Services, EndpointSlices.
    #[must_use]
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.services.live.len(), self.slices.live.len())
    }
}

fn trigger_time(slice: &EndpointSlice) -> Option<SystemTime> {
    stored_slice::trigger_time(slice)?.parse::<Timestamp>().ok().map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn meta(name: &str, version: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        }
    }

    fn slice_object(name: &str, service: &str, version: &str, trigger: &str) -> EndpointSlice {
        let mut metadata = meta(name, version);
        metadata.labels = Some(BTreeMap::from([("kubernetes.io/service-name".into(), service.into())]));
        metadata.annotations =
            Some(BTreeMap::from([("endpoints.kubernetes.io/last-change-trigger-time".into(), trigger.into())]));
        EndpointSlice { metadata, address_type: "IPv4".into(), ..EndpointSlice::default() }
    }

    fn service_object(name: &str, version: &str) -> Service {
        Service { metadata: meta(name, version), ..Service::default() }
    }

    fn id(name: &str) -> ServiceId {
        ServiceId::new("ns", name)
    }

    fn slice_id(name: &str) -> SliceId {
        SliceId::new("ns", name)
    }

    fn listed() -> ObjectStore {
        let mut store = ObjectStore::default();
        store.node_event(Event::Init);
        store.node_event(Event::InitDone);
        store.service_event(Event::Init);
        store.service_event(Event::InitApply(service_object("web", "1")));
        store.service_event(Event::InitDone);
        store.slice_event(Event::Init);
        store.slice_event(Event::InitApply(slice_object("a", "web", "1", "2026-01-01T00:00:00Z")));
        assert!(!store.is_listed(), "not before every list is complete");
        store.slice_event(Event::InitDone);
        assert!(store.is_listed());
        store
    }

    fn changed_services(delivery: &Delivery) -> Vec<ServiceId> {
        match &delivery.snapshot {
            Snapshot::Changed { services, .. } => services.iter().map(|c| c.id.clone()).collect(),
            Snapshot::Full { .. } => panic!("a full snapshot"),
        }
    }

    /// Each service's id is held once, whichever of the Service and its
    /// slices came first: by the store's key, the converted Service, every
    /// slice's owner and the slice index; each slice's id too.
    #[test]
    fn a_service_and_its_slices_share_one_id() {
        for service_first in [true, false] {
            let mut store = listed();
            let service =
                |store: &mut ObjectStore, version| store.service_event(Event::Apply(service_object("web", version)));
            if service_first {
                service(&mut store, "1");
            }
            store.slice_event(Event::Apply(slice_object("web-a", "web", "1", "2024-01-01T00:00:00Z")));
            store.slice_event(Event::Apply(slice_object("web-b", "web", "1", "2024-01-01T00:00:00Z")));
            if !service_first {
                service(&mut store, "1");
            }
            // A new version of the Service keeps the copy.
            service(&mut store, "2");
            let (key, entry) = store.services.live.get_key_value(&id("web")).unwrap();
            let owners: Vec<ServiceId> = ["web-a", "web-b"]
                .iter()
                .map(|s| store.slices.get(&slice_id(s)).unwrap().owner().unwrap().clone())
                .collect();
            let indexed = store.index.shared_id(&id("web")).unwrap();
            assert!(
                key.shares(&entry.value.id) && owners.iter().all(|o| o.shares(key)) && indexed.shares(key),
                "service first: {service_first}"
            );
            // A slice's id likewise, through a new version of it.
            store.slice_event(Event::Apply(slice_object("web-a", "web", "2", "2024-01-01T00:00:01Z")));
            let (key, slice) = store.slices.live.get_key_value(&slice_id("web-a")).unwrap();
            let listed: Vec<&SliceId> = store.index.slices_of(&id("web")).collect();
            assert!(key.shares(&slice.value.spec.id) && listed.iter().any(|s| s.shares(key)), "{listed:?}");
        }
    }

    #[test]
    fn the_first_read_is_everything_without_triggers() {
        let mut store = listed();
        let first = store.take();
        assert!(
            matches!(first.snapshot, Snapshot::Full { ref services, ref slices, .. } if services.len() == 1 && slices.len() == 1)
        );
        assert!(first.triggers.is_empty(), "the first list's changes happened before start");
        assert!(!store.has_pending());
    }

    #[test]
    fn a_change_names_its_service_and_carries_its_trigger() {
        let mut store = listed();
        store.take();
        store.slice_event(Event::Apply(slice_object("b", "web", "2", "2026-01-01T00:00:01Z")));
        let d = store.take();
        assert_eq!(changed_services(&d), [id("web")]);
        assert_eq!(d.triggers.len(), 1);
        let Snapshot::Changed { services, .. } = d.snapshot else { unreachable!() };
        assert_eq!(services[0].slices.len(), 2, "both slices of web");
        // A slice that moves to another service touches both.
        store.slice_event(Event::Apply(slice_object("b", "api", "3", "2026-01-01T00:00:02Z")));
        assert_eq!(changed_services(&store.take()), [id("api"), id("web")]);
    }

    #[test]
    fn a_relist_updates_in_place_and_removes_what_it_did_not_see_at_its_end() {
        let mut store = listed();
        store.slice_event(Event::Apply(slice_object("b", "web", "2", "2026-01-01T00:00:01Z")));
        store.take();
        // A relist: a unchanged, b at a new version, c new; a service gone.
        store.slice_event(Event::Init);
        store.slice_event(Event::InitApply(slice_object("b", "web", "3", "2026-01-01T00:00:02Z")));
        store.slice_event(Event::InitApply(slice_object("c", "web", "1", "2026-01-01T00:00:03Z")));
        assert_eq!(store.counts().1, 3, "nothing is removed before the relist is done");
        store.slice_event(Event::InitDone);
        assert_eq!(store.counts().1, 2, "a was not in the relist");
        store.service_event(Event::Init);
        store.service_event(Event::InitDone);
        assert!(store.has_pending());
        let d = store.take();
        // web: its Service went (the service relist did not see it), b
        // changed, c came, a went.
        assert_eq!(changed_services(&d), [id("web")]);
        let Snapshot::Changed { services, .. } = &d.snapshot else { unreachable!() };
        assert!(services[0].service.is_none());
        assert_eq!(services[0].slices.len(), 2);
        assert_eq!(d.triggers.len(), 2, "b's new version and c");
    }

    #[test]
    fn a_relist_keeps_unchanged_objects_where_they_are() {
        let mut store = listed();
        store.take();
        let held =
            |store: &ObjectStore| (store.services.get(&id("web")).unwrap(), store.slices.get(&slice_id("a")).unwrap());
        let (service, slice) = held(&store);
        store.service_event(Event::Init);
        store.service_event(Event::InitApply(service_object("web", "1")));
        store.service_event(Event::InitDone);
        store.slice_event(Event::Init);
        store.slice_event(Event::InitApply(slice_object("a", "web", "1", "2026-01-01T00:00:00Z")));
        store.slice_event(Event::InitDone);
        let (service_after, slice_after) = held(&store);
        assert!(Arc::ptr_eq(&service, &service_after) && Arc::ptr_eq(&slice, &slice_after), "same versions: kept");
        assert!(store.has_pending(), "a relist is followed by a sync, even when it found no change");
        let d = store.take();
        assert!(changed_services(&d).is_empty() && d.triggers.is_empty(), "nothing new");
        // A new version is converted again, and its trigger counts.
        store.slice_event(Event::Init);
        store.slice_event(Event::InitApply(slice_object("a", "api", "2", "2026-01-01T00:00:01Z")));
        store.slice_event(Event::InitDone);
        let (_, slice_after) = held(&store);
        assert!(!Arc::ptr_eq(&slice, &slice_after));
        assert_eq!(slice_after.owner(), Some(&id("api")));
        assert_eq!(store.take().triggers.len(), 1);
    }

    #[test]
    fn deletions_are_pending_for_their_service() {
        let mut store = listed();
        store.take();
        store.service_event(Event::Delete(service_object("web", "1")));
        let d = store.take();
        let Snapshot::Changed { services, nodes } = d.snapshot else { panic!("full") };
        assert!(services[0].service.is_none() && services[0].slices.len() == 1 && nodes.is_none());
        store.slice_event(Event::Delete(slice_object("a", "web", "1", "")));
        assert_eq!(changed_services(&store.take()), [id("web")]);
    }
}
