//! New frontends written in bulk: a start writes 100,000 of them, and one
//! at a time each took four system calls (its rev-NAT entry, its slots,
//! its slot 0, its name). Here a chunk of them takes a batch write per map
//! (in pieces of at most 32 KiB: `crate::datapath::maps`), in the order a reader
//! needs: every rev-NAT entry and slot of the chunk before any of its
//! slots 0, so no reader finds a slot 0 whose count reaches a slot not
//! written yet (docs/design.md, "Write order"). That takes two steps, each
//! in two lanes at once (`ServiceMaps::write_lanes`): the rev-NAT entries
//! and the first part of the slots entries beside the rest of the slots
//! entries (split so that both lanes write about as many), then the slots
//! 0 beside the names (which no reader needs first). Each lane counts what
//! it wrote, and the frontends written whole go on. When `SERVICES` fills
//! while both lanes write slots entries, which frontends got the last room
//! depends on which thread was faster: every one served is whole, and the
//! failures name the others.
//!
//! Only frontends that need nothing else are taken: reached from inside
//! the node only (no Maglev table), no source ranges, and no external
//! twin (whose slot 0 must come first). What is written is recorded
//! frontend by frontend as `update_frontend` records it. After a failed
//! batch the rest of the chunk is left to `update_frontend`, which writes
//! what is missing one frontend at a time: its result is the sync's (a
//! write that fails again is reported there, one that succeeds is not a
//! failure). When a map was full, slots whose slot 0 could not follow are
//! removed first, and the rest of the sync is written one at a time.
use super::{
    AppliedFrontend, BackendAddr, Change, ChangeKind, FrontendFlags, FrontendKey, MapError, Reconciler, Report, Scope,
    ServiceMaps, ServiceTable, codec, remove_slot_entries, set_slot,
};
use proxy_common::{RevNat, RevNatId, ServiceKey, ServiceName, ServiceValue};

use super::maps::Batch;

/// Frontends per chunk (their slots: ~3,000 entries at 10 backends); in
/// unit tests fewer, so that a few hundred frontends span chunks.
pub(super) const CHUNK: usize = if cfg!(test) { 100 } else { 1024 };

/// A chunk ends sooner when its frontends have this many slots (frontends
/// of thousands of backends; `upsert_backends` bounds its lists alike).
const CHUNK_SLOTS: usize = 16_384;

/// How many of a batch's entries were written, and the failure.
fn written(result: Result<(), (usize, MapError)>, len: usize) -> (usize, Option<MapError>) {
    match result {
        Ok(()) => (len, None),
        Err((n, error)) => (n, Some(error)),
    }
}

impl Reconciler {
    /// Writes frontends `updates` of `desired` in order: those this module
    /// takes (see the module docs) a chunk at a time, the others, and
    /// those a failed write left unfinished, one at a time
    /// (`apply_frontend`). After a map was full the rest are written one
    /// at a time.
    pub(super) fn apply_updates(
        &mut self,
        maps: &mut impl ServiceMaps,
        desired: &ServiceTable,
        updates: &[FrontendKey],
        wanted: &WantedIds,
        report: &mut Report,
    ) {
        let mut chunk: Vec<FrontendKey> = Vec::with_capacity(CHUNK.min(updates.len()));
        let mut lists = ChunkLists::default();
        let mut slots = 0;
        let mut in_bulk = true;
        let mut packed = self.frontends.len();
        for (done, key) in updates.iter().enumerate() {
            if in_bulk && self.takes_in_bulk(desired, *key) {
                chunk.push(*key);
                slots += desired[key].backends.len();
                if chunk.len() < CHUNK && slots < CHUNK_SLOTS {
                    continue;
                }
            }
            if !chunk.is_empty() {
                in_bulk = self.write_chunk(maps, desired, &chunk, wanted, &mut lists, report);
                // Frontends inserted one by one in key order (a start's)
                // leave each tree node about half empty, at the start's
                // peak by the last chunk. Packed
                // each time the tree doubled, at most the last half is;
                // not on the last chunk (`apply` packs it after the sync).
                let more = updates.len() - done > CHUNK;
                if more && self.frontends.len() >= 2 * packed.max(CHUNK) {
                    self.pack_frontends();
                    packed = self.frontends.len();
                }
                let last = chunk.last() == Some(key);
                chunk.clear();
                slots = 0;
                if last {
                    continue;
                }
            }
            self.apply_frontend(maps, desired, *key, false, report);
        }
        if !chunk.is_empty() {
            self.write_chunk(maps, desired, &chunk, wanted, &mut lists, report);
        }
    }

    /// Writes `chunk` in bulk, reporting those written whole, then one at
    /// a time what that left; false after a map was full.
    fn write_chunk(
        &mut self,
        maps: &mut impl ServiceMaps,
        desired: &ServiceTable,
        chunk: &[FrontendKey],
        wanted: &WantedIds,
        lists: &mut ChunkLists,
        report: &mut Report,
    ) -> bool {
        let (mut staged, complete) = self.stage(desired, chunk, wanted);
        let started: Vec<FrontendKey> = staged.iter().map(|s| s.key).collect();
        let mut full = !complete;
        full |= self.write_rev_nats_and_slots(maps, &mut staged, lists, report);
        full |= self.write_slot_zeros_and_names(maps, desired, &mut staged, lists, report);
        if full {
            self.remove_slots_without_slot_zero(maps, &started, report);
        }
        for s in &staged {
            report_added(desired, s, report);
        }
        // Every frontend of the chunk was new: one it holds now was begun
        // here, and is done when its slot 0 and name are written (the last
        // two batches, reported as added).
        for key in chunk {
            let begun = self.frontends.get(key);
            if !begun.is_some_and(|f| f.slot_zero.is_some() && f.name_written) {
                self.apply_frontend(maps, desired, *key, begun.is_some(), report);
            }
        }
        !full
    }

    fn takes_in_bulk(&self, desired: &ServiceTable, key: FrontendKey) -> bool {
        let frontend = &desired[&key];
        key.scope == Scope::All
            && !self.frontends.contains_key(&key)
            && !frontend.reach.from_outside()
            && frontend.source_ranges.is_none()
            && !desired.contains_key(&key.with_scope(Scope::External))
    }

    /// Takes the frontends of `chunk` whose backends are all in the map,
    /// each with a rev-NAT id; false when the ids ran out (`update_frontend`
    /// reports it).
    fn stage(&mut self, desired: &ServiceTable, chunk: &[FrontendKey], wanted: &WantedIds) -> (Vec<Staged>, bool) {
        let mut staged = Vec::with_capacity(chunk.len());
        for &key in chunk {
            let frontend = &desired[&key];
            let ids: Option<Vec<u32>> = match wanted.get(key) {
                // One id per backend (`want` reserved one for each), in
                // slot order.
                Some(ids) if ids.len() == frontend.backends.len() => {
                    ids.iter().all(|id| self.backends.is_written(*id)).then(|| ids.to_vec())
                }
                Some(_) => None,
                None => frontend
                    .backends
                    .iter()
                    .map(|b| self.backends.id(&BackendAddr { addr: b.addr, port: b.port, protocol: key.protocol }))
                    .collect(),
            };
            // A backend that failed to be written: reported already, and
            // `update_frontend` leaves the frontend out as well.
            let Some(ids) = ids else { continue };
            let Some(rev_nat) = self.rev_nat_pool.allocate() else { return (staged, false) };
            let mut fe = AppliedFrontend::new(frontend.service_port.clone());
            fe.set_wanted(key, frontend);
            fe.rev_nat = rev_nat;
            fe.slots.reserve_exact(ids.len());
            self.frontends.insert(key, fe);
            staged.push(Staged { key, ids, rev_nat });
        }
        (staged, true)
    }

    /// The rev-NAT entries of `staged` and the first part of its slots
    /// entries in one lane, the rest of the slots entries in the other;
    /// keeps the frontends that have both whole. Whether a map was full.
    fn write_rev_nats_and_slots(
        &mut self,
        maps: &mut impl ServiceMaps,
        staged: &mut Vec<Staged>,
        lists: &mut ChunkLists,
        report: &mut Report,
    ) -> bool {
        let ChunkLists { services, rev_nats, .. } = lists;
        rev_nats.clear();
        rev_nats.extend(staged.iter().map(|s| (s.rev_nat, codec::rev_nat_value(s.key))));
        services.clear();
        services.extend(
            staged
                .iter()
                .flat_map(|s| (0..s.entries()).map(|e| (codec::slots_key(s.key, e), codec::slots_value(&s.ids, e)))),
        );
        report.writes += rev_nats.len() + services.len();
        // The first lane's slots entries: about what the second takes
        // once the rev-NAT entries are counted in the first.
        let target = services.len().saturating_sub(rev_nats.len()) / 2;
        let mid = split_at(staged, Staged::entries, target);
        let at = staged[..mid].iter().map(Staged::entries).sum();
        let (first, second) = services.split_at(at);
        let [a, b] =
            maps.write_lanes([&[Batch::RevNats(rev_nats), Batch::Services(first)], &[Batch::Services(second)]]);
        let ((n1, e1), (n2, e2)) = (written(a, rev_nats.len() + first.len()), written(b, second.len()));
        let rev_nats_written = n1.min(rev_nats.len());
        for s in &staged[..rev_nats_written] {
            self.applied(s).rev_nat_written = true;
        }
        let whole = [
            self.record_slots(&staged[..mid], n1 - rev_nats_written).min(rev_nats_written),
            self.record_slots(&staged[mid..], n2).min(rev_nats_written.saturating_sub(mid)),
        ];
        keep_written(staged, mid, whole, either(e1, e2))
    }

    /// Records the first `n` slots entries of `staged` (in order) as
    /// written: how many of its frontends were written whole.
    fn record_slots(&mut self, staged: &[Staged], mut n: usize) -> usize {
        let mut whole = 0;
        for s in staged {
            let fe = self.frontends.get_mut(&s.key).expect("staged");
            let entries = s.entries();
            for (i, id) in s.ids.iter().enumerate().take(n.min(entries) * codec::SLOTS_PER_ENTRY) {
                set_slot(&mut fe.slots, &mut self.backends, i, *id);
            }
            if n < entries {
                break;
            }
            n -= entries;
            whole += 1;
        }
        whole
    }

    /// The slots 0 of `staged` in one lane, their names in the other;
    /// keeps the frontends that have both. Whether a map was full.
    fn write_slot_zeros_and_names(
        &mut self,
        maps: &mut impl ServiceMaps,
        desired: &ServiceTable,
        staged: &mut Vec<Staged>,
        lists: &mut ChunkLists,
        report: &mut Report,
    ) -> bool {
        let ChunkLists { services, names, .. } = lists;
        services.clear();
        services.extend(staged.iter().map(|s| {
            let frontend = &desired[&s.key];
            let flags = FrontendFlags::of(s.key, frontend, false).encode();
            let slot_zero = codec::slot_zero_value(frontend, s.ids.len(), s.rev_nat, flags, 0);
            (codec::service_key(s.key, 0), slot_zero)
        }));
        names.clear();
        names.extend(staged.iter().map(|s| (s.rev_nat, codec::service_name(&self.frontends[&s.key].service_port))));
        report.writes += services.len() + names.len();
        let [a, b] = maps.write_lanes([&[Batch::Services(services)], &[Batch::Names(names)]]);
        let ((slot_zeros, e1), (named, e2)) = (written(a, services.len()), written(b, names.len()));
        for (s, (_, slot_zero)) in staged.iter().zip(&services[..slot_zeros]) {
            self.applied(s).slot_zero = Some(*slot_zero);
        }
        // A name written for a frontend whose slot 0 was not is recorded
        // all the same: the frontend is begun, and its name goes with it.
        for s in &staged[..named] {
            self.applied(s).name_written = true;
        }
        let both = slot_zeros.min(named);
        let len = staged.len();
        keep_written(staged, len, [both, 0], either(e1, e2))
    }

    fn applied(&mut self, s: &Staged) -> &mut AppliedFrontend {
        self.frontends.get_mut(&s.key).expect("staged")
    }

    /// Removes the slots of those of frontends `started` whose slot 0 was
    /// not written: in a full map they would take the room of frontends
    /// after them that fit, which `update_frontend`, writing one frontend
    /// at a time, programs.
    fn remove_slots_without_slot_zero(
        &mut self,
        maps: &mut impl ServiceMaps,
        started: &[FrontendKey],
        report: &mut Report,
    ) {
        for key in started {
            let fe = self.frontends.get_mut(key).expect("started");
            if fe.slot_zero.is_some() {
                continue;
            }
            // What a failed delete leaves stays recorded: `update_frontend`
            // writes it over.
            let _ = remove_slot_entries(maps, *key, &mut fe.slots, &mut self.backends, 0, &mut report.writes);
        }
    }
}

/// Reports frontend `s`, written whole, as added.
fn report_added(desired: &ServiceTable, s: &Staged, report: &mut Report) {
    let change = || {
        let frontend = &desired[&s.key];
        let after =
            frontend.backends.iter().map(|b| BackendAddr { addr: b.addr, port: b.port, protocol: s.key.protocol });
        let (port, after) = (frontend.service_port.clone(), (after.collect(), s.ids.len()));
        Change::new(port, s.key, s.rev_nat, ChangeKind::Added, Vec::new(), after)
    };
    report.record(change, s.key, true);
}

/// The backend ids `want` reserved for the new frontends of a
/// whole-table sync, each frontend's in slot order: what `stage` would
/// otherwise look up again by address, a large part of a big start. One
/// list for all (a list each would hold more), kept only until the bulk
/// write is done.
#[derive(Debug, Default)]
pub(super) struct WantedIds {
    /// Each frontend, in the order recorded, and where its ids start in
    /// `ids` (they end where the next one's start).
    starts: Vec<(FrontendKey, u32)>,
    ids: Vec<u32>,
}

impl WantedIds {
    /// Room for the ids of every frontend of `table` (a start).
    pub(super) fn for_table(table: &ServiceTable) -> Self {
        let slots = table.values().map(|f| f.backends.len()).sum();
        Self { starts: Vec::with_capacity(table.len()), ids: Vec::with_capacity(slots) }
    }

    /// Where the ids of `key` go: each id the caller adds before the next
    /// `start` is `key`'s. Keys come in order (the table's), so that `get`
    /// finds them: one out of order may not be found (`stage` then looks
    /// its backends up by address), and what is found is always its own.
    pub(super) fn start(&mut self, key: FrontendKey) -> &mut Vec<u32> {
        debug_assert!(self.starts.last().is_none_or(|(last, _)| *last < key), "keys in order");
        let at = u32::try_from(self.ids.len()).expect("fewer ids than u32::MAX");
        self.starts.push((key, at));
        &mut self.ids
    }

    /// The ids recorded for `key`.
    fn get(&self, key: FrontendKey) -> Option<&[u32]> {
        let at = self.starts.binary_search_by_key(&key, |(k, _)| *k).ok()?;
        let start = self.starts[at].1 as usize;
        let end = self.starts.get(at + 1).map_or(self.ids.len(), |(_, next)| *next as usize);
        Some(&self.ids[start..end])
    }
}

/// The lists of entries a chunk's batch writes are made in, kept from one
/// chunk to the next: made anew, the slots' (~160 KiB at 10 backends a
/// frontend, with the slots 0) and the names' (~150 KiB) were handed back
/// to the kernel after each chunk (observe/memory.rs) and faulted in again by the
/// next.
#[derive(Default)]
struct ChunkLists {
    /// Slots entries, then slots 0.
    services: Vec<(ServiceKey, ServiceValue)>,
    rev_nats: Vec<(RevNatId, RevNat)>,
    names: Vec<(RevNatId, ServiceName)>,
}

/// A frontend being written in bulk.
struct Staged {
    key: FrontendKey,
    /// Its backends' ids, in slot order.
    ids: Vec<u32>,
    rev_nat: RevNatId,
}

impl Staged {
    /// Its slots entries.
    fn entries(&self) -> usize {
        codec::slot_entries(self.ids.len())
    }
}

/// Where `staged` splits so that the frontends before take about `target`
/// of the entries `weight` gives each (at least `target`, or all of them).
fn split_at(staged: &[Staged], weight: impl Fn(&Staged) -> usize, target: usize) -> usize {
    let mut sum = 0;
    staged
        .iter()
        .position(|s| {
            if sum >= target {
                return true;
            }
            sum += weight(s);
            false
        })
        .unwrap_or(staged.len())
}

/// The failure of two lanes that decides what the rest of the sync does:
/// a full map's before another's.
fn either(e1: Option<MapError>, e2: Option<MapError>) -> Option<MapError> {
    match (e1, e2) {
        (Some(full @ MapError::Full { .. }), _) | (_, Some(full @ MapError::Full { .. })) => Some(full),
        (e1, e2) => e1.or(e2),
    }
}

/// Keeps the frontends of `staged` a two-lane write wrote whole,
/// `whole[0]` of those before `mid` and `whole[1]` of those from it (`mid`
/// = `staged.len()`: one list, `whole[0]` of it), when it failed with
/// `error`; whether a map was full. The rest is written one at a time,
/// which reports a failure that stays.
fn keep_written(staged: &mut Vec<Staged>, mid: usize, whole: [usize; 2], error: Option<MapError>) -> bool {
    let Some(error) = error else { return false };
    let stopped = if whole[0] < mid { whole[0] } else { mid + whole[1] };
    if let Some(s) = staged.get(stopped) {
        tracing::debug!(frontend = %s.key, %error, "a batch write of new frontends failed; writing the rest one at a time");
    }
    staged.truncate(mid + whole[1]);
    staged.drain(whole[0]..mid);
    matches!(error, MapError::Full { .. })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::model::Protocol;

    #[test]
    fn wanted_ids_are_found_by_frontend_each_with_its_own() {
        let key = |n: u8| FrontendKey::new(Ipv4Addr::new(10, 96, 0, n).into(), 80, Protocol::Tcp);
        let lists: [&[u32]; 4] = [&[1, 2], &[], &[3], &[4, 5, 6]];
        let mut wanted = WantedIds::default();
        for (n, ids) in (1..).zip(lists) {
            wanted.start(key(n)).extend_from_slice(ids);
        }
        for (n, ids) in (1..).zip(lists) {
            assert_eq!(wanted.get(key(n)), Some(ids), "frontend {n}");
        }
        assert_eq!(wanted.get(key(9)), None, "a frontend not recorded");
        assert_eq!(WantedIds::default().get(key(1)), None);
    }

    /// The first lane takes frontends until their entries reach the
    /// target: then both lanes write about as many (the first also has
    /// the rev-NAT entries).
    #[test]
    fn a_chunk_splits_where_the_first_lane_reaches_its_share() {
        let staged: Vec<Staged> = (0..4)
            .map(|n| Staged {
                key: FrontendKey::new(Ipv4Addr::new(10, 96, 0, n).into(), 80, Protocol::Tcp),
                ids: vec![1; usize::from(n) * 4 + 4],
                rev_nat: u32::from(n) + 1,
            })
            .collect();
        let entries = Staged::entries;
        // Entries 1, 2, 3, 4 (10 in all).
        let cases = [(0, 0), (1, 1), (2, 2), (3, 2), (4, 3), (6, 3), (7, 4), (10, 4), (100, 4)];
        for (target, mid) in cases {
            assert_eq!(split_at(&staged, entries, target), mid, "target {target}");
        }
        // Four rev-NAT entries and ten slots entries: 3 slots entries
        // beside the rev-NATs (7 in the first lane), 7 in the second.
        assert_eq!(split_at(&staged, entries, (10 - 4) / 2), 2);
        assert_eq!(split_at(&[], entries, 3), 0);
    }

    #[test]
    fn a_full_map_decides_over_another_failure() {
        let full = || Some(MapError::Full { map: super::super::MapName::Services });
        let other = || {
            let source = std::io::Error::other("injected");
            Some(MapError::Syscall { map: super::super::MapName::Names, op: "test", source })
        };
        assert!(matches!(either(other(), full()), Some(MapError::Full { .. })));
        assert!(matches!(either(full(), other()), Some(MapError::Full { .. })));
        assert!(matches!(either(other(), None), Some(MapError::Syscall { .. })));
        assert!(either(None, None).is_none());
    }
}
