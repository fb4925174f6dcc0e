//! The desired table kept up to date service by service: a change to one
//! Service or its EndpointSlices re-translates that service only, and says
//! which frontend keys changed, so the maps are diffed there only.
//!
//! Every service's claims on frontend keys are kept; a key is served by
//! its first claimant in object order (as `translate` does over sorted
//! services), so a key two services ask for passes to the other when the
//! first lets go of it.
use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt as _};

use super::{
    FrontendKey, ObjectRef, Problem, ServiceTable,
    frontends::SkipReason,
    input::{ServiceSpec, SliceSpec},
    service::{Claim, NoLocalEndpoints, ServiceOutput, translate_service},
    table::{HealthCheck, NodeContext},
};

pub use super::object_ids::{ServiceId, SliceId};

/// What an update changed.
#[derive(Debug, Default)]
pub struct Delta {
    /// Frontend keys whose entry was added, changed or removed.
    pub keys: BTreeSet<FrontendKey>,
    /// Problems that appeared, and problems that went away.
    pub appeared: Vec<Problem>,
    /// Problems that went away.
    pub resolved: Vec<Problem>,
    /// Services deliberately not programmed whose reason is new (they were
    /// proxied, skipped for another reason, or not there): what is logged
    /// once, not on every sync.
    pub skipped: Vec<(ObjectRef, SkipReason)>,
}

/// The model's state: each service's translation and the table they make, updated a service at a time.
#[derive(Debug, Default)]
pub struct TableState {
    services: BTreeMap<ServiceId, ServiceOutput>,
    /// The services that claim each key, in object order; the first serves
    /// it. (Nearly always one: a short sorted list, not a map per key.)
    claims: BTreeMap<FrontendKey, Vec<ServiceId>>,
    /// Problems of keys claimed more than once, on the losing services.
    conflicts: BTreeMap<FrontendKey, Vec<Problem>>,
    table: ServiceTable,
    /// Summed over the services.
    no_local: NoLocalEndpoints,
    /// The services with a health check (a few among thousands): what
    /// `health_checks`, asked after every sync, reads.
    health_checked: BTreeSet<ServiceId>,
}

/// One service's inputs: the Service (`None`: gone) and its slices.
#[derive(Clone, Debug, Default)]
pub struct ServiceInput<'a> {
    /// The Service (`None`: gone).
    pub service: Option<&'a ServiceSpec>,
    /// Its EndpointSlices.
    pub slices: Vec<&'a SliceSpec>,
}

impl TableState {
    /// The table as it stands.
    #[must_use]
    pub fn table(&self) -> &ServiceTable {
        &self.table
    }

    /// The table, without the state around it (a one-off translation).
    #[must_use]
    pub(crate) fn into_table(self) -> ServiceTable {
        self.table
    }

    /// Every problem, service by service in object order.
    pub fn problems(&self) -> impl Iterator<Item = &Problem> {
        self.services.values().flat_map(|s| s.problems.iter()).chain(self.conflicts.values().flatten())
    }

    /// Service ports with a Local traffic policy and no endpoint on this
    /// node.
    #[must_use]
    pub const fn no_local_endpoints(&self) -> NoLocalEndpoints {
        self.no_local
    }

    /// The health check ports to serve, by port.
    #[must_use]
    pub fn health_checks(&self) -> Vec<HealthCheck> {
        let mut out: Vec<HealthCheck> = self
            .health_checked
            .iter()
            .filter_map(|id| self.services.get(id)?.health_check.as_deref().cloned())
            .collect();
        out.sort_by_key(|h| h.port);
        out
    }

    /// Services not programmed, and why.
    pub fn skipped(&self) -> impl Iterator<Item = (ObjectRef, SkipReason)> {
        self.services.iter().filter_map(|(id, s)| Some((service_ref(id), s.skipped?)))
    }

    /// Everything anew: every service of `services` with the slices of
    /// `slices` that name it; services no longer there go.
    pub fn replace_all<'a>(
        &mut self,
        services: impl IntoIterator<Item = &'a ServiceSpec>,
        slices: impl IntoIterator<Item = &'a SliceSpec>,
        node: &NodeContext,
    ) -> Delta {
        let inputs = group_inputs(self.services.keys(), services, slices);
        if self.is_empty() {
            return self.build(inputs, node);
        }
        let delta = self.update(inputs, node);
        self.compact();
        delta
    }

    fn is_empty(&self) -> bool {
        self.services.is_empty() && self.claims.is_empty() && self.table.is_empty() && self.conflicts.is_empty()
    }

    /// `update` into an empty state (a start): the same state and delta,
    /// built in one pass over the services in object order and then each
    /// map at once from sorted entries, where `update` searched the trees
    /// by service and by key several times a frontend (a quarter of a
    /// start's translation, comparing ids string by string).
    fn build(&mut self, inputs: Vec<(ServiceId, ServiceInput<'_>)>, node: &NodeContext) -> Delta {
        let mut delta = Delta::default();
        let mut outputs = translate_all(inputs, node);
        // (key, the claimant's place in `outputs`, the claim's in its output)
        let mut claims: Vec<(FrontendKey, usize, usize)> = Vec::new();
        for (place, (id, new)) in outputs.iter().enumerate() {
            self.no_local.add(new.no_local);
            claims.extend(new.claims.iter().enumerate().map(|(at, c)| (c.key, place, at)));
            if let Some(reason) = new_skip_reason(None, new.skipped) {
                delta.skipped.push((service_ref(id), reason));
            }
            diff_problems(None, Some(&new.problems), &mut delta);
        }
        // By key, claimants in object order (their place in `outputs`):
        // the first serves the key.
        claims.sort_unstable();
        // Each tree is built from a list of its entries (in order: every
        // node full, in one pass), each list made at its size and dropped
        // once its tree is built, before the next is made: beside the
        // trees, one list at a time (the table's is the largest, 112 bytes
        // a frontend), at a start's translation and at a restart's, beside
        // the reconciler read back.
        let groups = claims.chunk_by(|a, b| a.0 == b.0).count();
        let mut table = Vec::with_capacity(groups);
        let mut claimants = Vec::with_capacity(groups);
        let mut conflicts = Vec::new();
        for group in claims.chunk_by(|a, b| a.0 == b.0) {
            let (key, first, at) = group[0];
            let claim = &mut outputs[first].1.claims[at];
            let frontend = *claim.frontend.take().expect("a new claim holds its frontend");
            if group.len() > 1 {
                let problems: Vec<Problem> = group[1..]
                    .iter()
                    .map(|&(_, loser, at)| {
                        let message = format!("{key} is already served by {}; skipped", frontend.service_port);
                        let (id, output) = &outputs[loser];
                        Problem::error(&service_ref(id), output.claims[at].field.clone(), message)
                    })
                    .collect();
                diff_problems(None, Some(&problems), &mut delta);
                conflicts.push((key, problems));
            }
            let mut ids: Vec<ServiceId> = group.iter().map(|&(_, i, _)| outputs[i].0.clone()).collect();
            ids.shrink_to_fit();
            claimants.push((key, ids));
            table.push((key, frontend));
        }
        drop(claims);
        self.table = table.into_iter().collect();
        self.claims = claimants.into_iter().collect();
        delta.keys = self.table.keys().copied().collect();
        self.conflicts = conflicts.into_iter().collect();
        self.health_checked =
            outputs.iter().filter(|(_, o)| o.health_check.is_some()).map(|(id, _)| id.clone()).collect();
        self.services = outputs.into_iter().collect();
        delta
    }

    /// Rebuilds the maps from their entries in order, which packs every
    /// tree node full: entries inserted one by one in key order (as
    /// `replace_all` does) leave each node about half empty. Later updates
    /// insert into the packed nodes.
    fn compact(&mut self) {
        super::packed::pack(&mut self.services);
        super::packed::pack(&mut self.claims);
        super::packed::pack(&mut self.table);
    }

    /// Re-translates the services in `changes` (with the node the state was
    /// built for: a changed node needs `replace_all`).
    pub fn update<'a>(
        &mut self,
        changes: impl IntoIterator<Item = (ServiceId, ServiceInput<'a>)>,
        node: &NodeContext,
    ) -> Delta {
        let mut delta = Delta::default();
        let mut touched: BTreeSet<FrontendKey> = BTreeSet::new();
        for (id, input) in changes {
            // A key the old output served keeps its entry in the table
            // until the loop below gives it to the new winner or removes it.
            let old = self.services.remove(&id);
            if let Some(old) = &old {
                self.no_local.subtract(old.no_local);
                for claim in &old.claims {
                    touched.insert(claim.key);
                    if let Some(claimants) = self.claims.get_mut(&claim.key) {
                        claimants.retain(|c| *c != id);
                        if claimants.is_empty() {
                            self.claims.remove(&claim.key);
                        }
                    }
                }
            }
            let new = input.service.map(|svc| translate_service(svc, &input.slices, node));
            if let Some(new) = &new {
                self.no_local.add(new.no_local);
                for Claim { key, .. } in &new.claims {
                    touched.insert(*key);
                    let claimants = self.claims.entry(*key).or_default();
                    if let Err(at) = claimants.binary_search(&id) {
                        claimants.insert(at, id.clone());
                        // Nearly always the only one: no spare capacity.
                        claimants.shrink_to_fit();
                    }
                }
                if let Some(reason) = new_skip_reason(old.as_ref().and_then(|o| o.skipped), new.skipped) {
                    delta.skipped.push((service_ref(&id), reason));
                }
            }
            diff_problems(old.as_ref().map(|o| &o.problems[..]), new.as_ref().map(|n| &n.problems[..]), &mut delta);
            if new.as_ref().is_some_and(|n| n.health_check.is_some()) {
                self.health_checked.insert(id.clone());
            } else {
                self.health_checked.remove(&id);
            }
            if let Some(new) = new {
                self.services.insert(id, new);
            }
        }
        for key in touched {
            if self.serve(key) {
                delta.keys.insert(key);
            }
            let conflicts = self.claims.get(&key).map(|c| self.conflict_problems(key, c)).unwrap_or_default();
            let old =
                if conflicts.is_empty() { self.conflicts.remove(&key) } else { self.conflicts.insert(key, conflicts) };
            diff_problems(old.as_deref(), self.conflicts.get(&key).map(Vec::as_slice), &mut delta);
        }
        delta
    }

    /// Gives `key`'s table entry to its first claimant, moving the
    /// frontend out of that claim (the table holds the one copy of a
    /// served frontend; a claim holds its own only while another serves
    /// the key), or removes the entry when nothing claims it. Whether the
    /// entry changed.
    fn serve(&mut self, key: FrontendKey) -> bool {
        let Some(claimants) = self.claims.get(&key) else {
            return self.table.remove(&key).is_some();
        };
        let winner = claimants[0].clone();
        // The claimant that serves the key now, when still there.
        let serving = claimants.iter().find(|id| self.claim(id, key).is_some_and(|c| c.frontend.is_none())).cloned();
        if serving.as_ref() == Some(&winner) {
            return false;
        }
        let Some(frontend) = self.claim_mut(&winner, key).and_then(|c| c.frontend.take()) else {
            return false;
        };
        let differs = self.table.get(&key) != Some(&*frontend);
        let before = self.table.insert(key, *frontend);
        // A claimant that loses the key keeps its frontend in its claim.
        if let (Some(before), Some(loser)) = (before, serving)
            && let Some(claim) = self.claim_mut(&loser, key)
        {
            claim.frontend = Some(Box::new(before));
        }
        differs
    }

    /// Service `id`'s claim on `key`.
    fn claim(&self, id: &ServiceId, key: FrontendKey) -> Option<&Claim> {
        self.services.get(id)?.claims.iter().find(|c| c.key == key)
    }

    fn claim_mut(&mut self, id: &ServiceId, key: FrontendKey) -> Option<&mut Claim> {
        self.services.get_mut(id)?.claims.iter_mut().find(|c| c.key == key)
    }

    /// The problems of the claimants of `key` that do not serve it.
    fn conflict_problems(&self, key: FrontendKey, claimants: &[ServiceId]) -> Vec<Problem> {
        let Some((first, rest)) = claimants.split_first() else { return Vec::new() };
        if self.claim(first, key).is_none() {
            return Vec::new();
        }
        let Some(winner) = self.table.get(&key) else { return Vec::new() };
        rest.iter()
            .filter_map(|id| Some((id, self.claim(id, key)?)))
            .map(|(id, claim)| {
                let message = format!("{key} is already served by {}; skipped", winner.service_port);
                Problem::error(&service_ref(id), claim.field.clone(), message)
            })
            .collect()
    }
}

/// The Service `id` names (not kept in each service's output: its id
/// says it).
fn service_ref(id: &ServiceId) -> ObjectRef {
    ObjectRef::new("Service", Some(id.namespace()), Some(id.name()))
}

/// One input per service, in object order: each of `services` with the
/// slices of `slices` that name it, and each of `known` (the services
/// translated before) that is in neither, with no input (gone). Grouped
/// through a hash map and sorted once: inserting 100,000 services and
/// looking up 100,000 slices' owners in a tree, in the store's arbitrary
/// order (comparing ids string by string at every level), took about half
/// of a start's translation.
pub(super) fn group_inputs<'a, 'k>(
    known: impl Iterator<Item = &'k ServiceId>,
    services: impl IntoIterator<Item = &'a ServiceSpec>,
    slices: impl IntoIterator<Item = &'a SliceSpec>,
) -> Vec<(ServiceId, ServiceInput<'a>)> {
    let services = services.into_iter();
    let mut inputs: HashMap<ServiceId, ServiceInput<'a>> = HashMap::with_capacity(services.size_hint().0);
    for svc in services {
        inputs.entry(svc.id()).or_default().service = Some(svc);
    }
    for slice in slices {
        let Some(owner) = &slice.owner else { continue };
        match inputs.get_mut(owner) {
            Some(input) => input.slices.push(slice),
            None => inputs.entry(owner.clone()).or_default().slices.push(slice),
        }
    }
    for id in known {
        if !inputs.contains_key(id) {
            inputs.insert(id.clone(), ServiceInput::default());
        }
    }
    let mut inputs: Vec<(ServiceId, ServiceInput<'a>)> = inputs.into_iter().collect();
    inputs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    inputs
}

/// The reason a service is skipped for, when it is not the one it was
/// skipped for before (`None`: proxied, or gone).
fn new_skip_reason(old: Option<SkipReason>, new: Option<SkipReason>) -> Option<SkipReason> {
    new.filter(|reason| old != Some(*reason))
}

/// Adds to `delta` what is in `new` and not in `old` (appeared) and the
/// reverse (resolved).
fn diff_problems(old: Option<&[Problem]>, new: Option<&[Problem]>, delta: &mut Delta) {
    let (old, new) = (old.unwrap_or_default(), new.unwrap_or_default());
    delta.appeared.extend(new.iter().filter(|p| !old.contains(p)).cloned());
    delta.resolved.extend(old.iter().filter(|p| !new.contains(p)).cloned());
}

/// Inputs (services, and owners named only by slices) from which a
/// start's translation takes a second thread: each service translates on
/// its own (`translate_service` reads only its inputs and the node), and
/// on a big cluster it is a visible part of the first sync; below this, a
/// thread costs more than it saves.
const TRANSLATE_IN_TWO_FROM: usize = 2_000;

/// `translate_service` of every input that has a service, in input order;
/// the second half on a thread of its own when there are many.
fn translate_all(inputs: Vec<(ServiceId, ServiceInput<'_>)>, node: &NodeContext) -> Vec<(ServiceId, ServiceOutput)> {
    let one = |(id, input): (ServiceId, ServiceInput<'_>)| {
        let svc = input.service?;
        Some((id, translate_service(svc, &input.slices, node)))
    };
    if inputs.len() < TRANSLATE_IN_TWO_FROM {
        return inputs.into_iter().filter_map(one).collect();
    }
    let mut first = inputs;
    // Handed over through a slot, so that it is still here when no thread
    // can be started.
    let second = std::sync::Mutex::new(Some(first.split_off(first.len() / 2)));
    let take = || second.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take().unwrap_or_default();
    std::thread::scope(|scope| {
        let other = std::thread::Builder::new()
            .name("translate".into())
            .spawn_scoped(scope, || take().into_iter().filter_map(one).collect::<Vec<_>>());
        let mut outputs = Vec::with_capacity(first.len() * 2 + 1);
        outputs.extend(first.into_iter().filter_map(one));
        match other {
            Ok(other) => outputs.extend(other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))),
            Err(_) => outputs.extend(take().into_iter().filter_map(one)),
        }
        outputs
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str) -> ServiceSpec {
        ServiceSpec { id: ServiceId::new("ns", name), ..ServiceSpec::default() }
    }

    fn slice(name: &str, owner: Option<&str>) -> SliceSpec {
        SliceSpec {
            id: SliceId::new("ns", name),
            owner: owner.map(|o| ServiceId::new("ns", o)),
            ..SliceSpec::default()
        }
    }

    /// Each input as (service, whether its Service is there, its slices).
    fn grouped(known: &[&str], services: &[ServiceSpec], slices: &[SliceSpec]) -> Vec<(String, bool, Vec<String>)> {
        let known: Vec<ServiceId> = known.iter().map(|n| ServiceId::new("ns", n)).collect();
        group_inputs(known.iter(), services, slices)
            .into_iter()
            .map(|(id, input)| {
                let mut slices: Vec<String> = input.slices.iter().map(|s| s.id.name().to_owned()).collect();
                slices.sort();
                (id.name().to_owned(), input.service.is_some(), slices)
            })
            .collect()
    }

    #[test]
    fn inputs_are_grouped_by_service_in_object_order() {
        let services = [service("c"), service("a"), service("b")];
        let slices = [slice("b-2", Some("b")), slice("a-1", Some("a")), slice("x", None), slice("b-1", Some("b"))];
        let s = |v: &[&str]| v.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        // (known before, then: each input)
        let cases = [
            (vec![], vec![("a", true, s(&["a-1"])), ("b", true, s(&["b-1", "b-2"])), ("c", true, vec![])]),
            // A service translated before and gone now has an input of
            // nothing; one still there is not doubled.
            (
                vec!["a", "0-gone"],
                vec![
                    ("0-gone", false, vec![]),
                    ("a", true, s(&["a-1"])),
                    ("b", true, s(&["b-1", "b-2"])),
                    ("c", true, vec![]),
                ],
            ),
        ];
        for (known, want) in cases {
            let want: Vec<(String, bool, Vec<String>)> =
                want.into_iter().map(|(n, present, slices)| (n.to_owned(), present, slices)).collect();
            assert_eq!(grouped(&known, &services, &slices), want, "known: {known:?}");
        }
        // Slices whose Service is not there: an input without a Service.
        assert_eq!(
            grouped(&[], &[], &[slice("d-1", Some("d"))]),
            vec![("d".to_owned(), false, vec!["d-1".to_owned()])]
        );
    }
}
