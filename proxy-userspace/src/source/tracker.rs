//! Which EndpointSlices name each service (an index kept in step with the
//! watch events), so a change is read and translated for its service alone.
use std::collections::BTreeSet;

use foldhash::HashMap;

use super::stored_slice::{SliceId, StoredSlice};
use crate::model::ServiceId;

/// The slices of each service, as the `kubernetes.io/service-name` label
/// says. The service a slice named before is read from the slice the store
/// held (the caller passes it), so the index keeps no map back from slice
/// to service, which would hold again ids the store already has.
#[derive(Debug, Default)]
pub(crate) struct SliceIndex {
    /// (A short list each: a service has a few slices.)
    slices_of: HashMap<ServiceId, Vec<SliceId>>,
}

impl SliceIndex {
    /// The index of exactly `slices`.
    #[cfg(test)]
    pub(crate) fn rebuild<'a>(&mut self, slices: impl IntoIterator<Item = &'a StoredSlice>) {
        self.slices_of.clear();
        for slice in slices {
            self.set(&slice.id(), None, Some(slice), &mut BTreeSet::new());
        }
    }

    /// Records that slice `id`, `before` as the store held it (`None`: it
    /// held none), is now `now` (`None`: gone), adding to `touched` the
    /// services it named before and names now.
    pub(crate) fn set(
        &mut self,
        id: &SliceId,
        before: Option<&StoredSlice>,
        now: Option<&StoredSlice>,
        touched: &mut BTreeSet<ServiceId>,
    ) {
        if let Some(before) = before.and_then(StoredSlice::owner) {
            if let Some(set) = self.slices_of.get_mut(before) {
                set.retain(|s| s != id);
                if set.is_empty() {
                    self.slices_of.remove(before);
                }
            }
            touched.insert(before.clone());
        }
        if let Some(owner) = now.and_then(StoredSlice::owner) {
            self.slices_of.entry(owner.clone()).or_insert_with(|| Vec::with_capacity(1)).push(id.clone());
            touched.insert(owner.clone());
        }
    }

    /// The slices that name `service`.
    pub(crate) fn slices_of(&self, service: &ServiceId) -> impl Iterator<Item = &SliceId> {
        self.slices_of.get(service).into_iter().flatten()
    }

    /// The index's copy of `service`'s id, when a slice names it (for the
    /// store to share one copy: see `crate::model::ServiceId`).
    #[must_use]
    pub(crate) fn shared_id(&self, service: &ServiceId) -> Option<ServiceId> {
        self.slices_of.get_key_value(service).map(|(id, _)| id.clone())
    }

    /// Whether no slice names a service.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.slices_of.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{api::discovery::v1::EndpointSlice, apimachinery::pkg::apis::meta::v1::ObjectMeta};
    use proptest::prelude::*;

    use super::*;

    fn slice(ns: &str, name: &str, service: Option<&str>) -> StoredSlice {
        StoredSlice::from(&EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: service.map(|s| BTreeMap::from([("kubernetes.io/service-name".to_owned(), s.to_owned())])),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            ..EndpointSlice::default()
        })
    }

    fn id(ns: &str, name: &str) -> SliceId {
        SliceId::new(ns, name)
    }

    fn service(ns: &str, name: &str) -> ServiceId {
        ServiceId::new(ns, name)
    }

    #[test]
    fn a_slice_that_moves_to_another_service_touches_both() {
        let mut index = SliceIndex::default();
        index.rebuild([&slice("a", "web-1", Some("web"))]);
        let mut touched = BTreeSet::new();
        let before = slice("a", "web-1", Some("web"));
        index.set(&id("a", "web-1"), Some(&before), Some(&slice("a", "web-1", Some("api"))), &mut touched);
        assert_eq!(touched, BTreeSet::from([service("a", "web"), service("a", "api")]));
        assert_eq!(index.slices_of(&service("a", "web")).count(), 0);
        assert_eq!(index.slices_of(&service("a", "api")).collect::<Vec<_>>(), [&id("a", "web-1")]);
    }

    #[test]
    fn a_deleted_slice_or_a_lost_label_leaves_its_service() {
        let mut index = SliceIndex::default();
        let (one, two) = (slice("a", "web-1", Some("web")), slice("a", "web-2", Some("web")));
        index.rebuild([&one, &two]);
        let mut touched = BTreeSet::new();
        index.set(&id("a", "web-1"), Some(&one), None, &mut touched);
        index.set(&id("a", "web-2"), Some(&two), Some(&slice("a", "web-2", None)), &mut touched);
        assert_eq!(touched, BTreeSet::from([service("a", "web")]));
        assert!(index.is_empty());
    }

    proptest! {
        /// After any sequence of slice changes applied one by one, the
        /// index is the one built from the final slices, and every service
        /// whose set of slices changed was reported touched.
        #[test]
        fn updates_one_by_one_match_a_rebuild(
            steps in prop::collection::vec((0..6usize, prop::option::of(0..3usize)), 0..40),
            deletes in prop::collection::vec(any::<bool>(), 40),
        ) {
            let services = ["web", "api", "db"];
            let mut live: BTreeMap<SliceId, StoredSlice> = BTreeMap::new();
            let mut index = SliceIndex::default();
            for (i, (n, owner)) in steps.iter().enumerate() {
                let name = format!("s{n}");
                let before: BTreeMap<ServiceId, BTreeSet<SliceId>> = services
                    .iter()
                    .map(|s| (service("ns", s), index.slices_of(&service("ns", s)).cloned().collect()))
                    .collect();
                let mut touched = BTreeSet::new();
                if deletes[i] {
                    let before = live.remove(&id("ns", &name));
                    index.set(&id("ns", &name), before.as_ref(), None, &mut touched);
                } else {
                    let s = slice("ns", &name, owner.map(|o| services[o]));
                    index.set(&id("ns", &name), live.get(&id("ns", &name)), Some(&s), &mut touched);
                    live.insert(id("ns", &name), s);
                }
                for (svc, old) in before {
                    let now: BTreeSet<SliceId> = index.slices_of(&svc).cloned().collect();
                    prop_assert!(now == old || touched.contains(&svc), "{svc:?} changed but was not touched");
                }
            }
            let mut rebuilt = SliceIndex::default();
            rebuilt.rebuild(live.values());
            let sorted = |i: &SliceIndex| -> BTreeMap<ServiceId, BTreeSet<SliceId>> {
                i.slices_of.iter().map(|(k, v)| (k.clone(), v.iter().cloned().collect())).collect()
            };
            prop_assert_eq!(sorted(&index), sorted(&rebuilt));
        }
    }
}
