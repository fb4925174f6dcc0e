//! The reconciler's record of `BACKENDS`, one small record per id: the
//! value the map holds, how many slots name the id, and how many frontends
//! of the desired table want it (docs/design.md, "Reconciler": the
//! backends themselves are the model's; this is what the model lacks).
//!
//! Records live in a `Vec` indexed by id: ids are handed out lowest first
//! (`IdPool`), so the `Vec` is as long as the most backends held at once,
//! and a record costs 40 bytes where a tree or hash map entry keyed by id
//! and address cost several times that. The index by address holds ids
//! only (4 bytes each), hashing the address in the id's record.
#[cfg(test)]
use std::collections::BTreeMap;
use std::{hash::BuildHasher, num::NonZeroU32};

use hashbrown::HashTable;
use proxy_common::Backend as BackendValue;

use super::{
    codec::{self, BackendAddr, BackendEntry},
    ids::IdPool,
};
use crate::model::BackendState;

/// Ids at or above this were not handed out by this agent (its ids stay
/// below the size of `BACKENDS`): found in the maps, they are stale.
const MAX_ID: u32 = 1 << 24;

/// A backend as one frontend of the table wants it: its state, and whether
/// it is on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub(crate) state: BackendState,
    pub(crate) local: bool,
}

/// How many frontends of the desired table want a backend: in all, as
/// active, and as on this node. The best of what they want is active when
/// any wants it active, local when any wants it local. Counts, not the
/// frontends themselves: a list per backend would cost far more memory at
/// 1,000,000 backends.
#[derive(Clone, Copy, Debug, Default)]
struct WantCounts {
    all: u32,
    active: u32,
    local: u32,
}

impl WantCounts {
    fn add(&mut self, w: Wanted) {
        self.all += 1;
        self.active += u32::from(w.state == BackendState::Active);
        self.local += u32::from(w.local);
    }

    /// Takes back what `add(w)` counted.
    fn remove(&mut self, w: Wanted) {
        self.all = self.all.saturating_sub(1);
        self.active = self.active.saturating_sub(u32::from(w.state == BackendState::Active));
        self.local = self.local.saturating_sub(u32::from(w.local));
    }

    const fn is_empty(&self) -> bool {
        self.all == 0
    }

    /// The best of what the frontends want (`None`: none wants it).
    fn best(&self) -> Option<Wanted> {
        let state = if self.active > 0 { BackendState::Active } else { BackendState::Terminating };
        (!self.is_empty()).then_some(Wanted { state, local: self.local > 0 })
    }
}

/// How many slots name a backend (it stays in `BACKENDS` while any does)
/// and whether it is in the map, in one word that is never zero: so a
/// missing record (`Option<Record>`) takes no room besides the record's 40
/// bytes (a flag of its own would take a word more per backend).
#[derive(Clone, Copy, Debug)]
struct Uses(NonZeroU32);

impl Uses {
    const PRESENT: u32 = 1 << 31;
    const WRITTEN: u32 = 1 << 30;
    /// Slots stay far below this (2^30 - 1): each is an entry of
    /// `SERVICES`, whose size the flags cap far lower.
    const SLOTS: u32 = Self::WRITTEN - 1;

    const fn written(self) -> bool {
        self.0.get() & Self::WRITTEN != 0
    }

    const fn slots(self) -> u32 {
        self.0.get() & Self::SLOTS
    }

    fn of(written: bool, slots: u32) -> Self {
        debug_assert!(slots <= Self::SLOTS, "{slots} slots name one backend");
        let bits = Self::PRESENT | if written { Self::WRITTEN } else { 0 } | slots.min(Self::SLOTS);
        Self(NonZeroU32::new(bits).expect("PRESENT is set"))
    }
}

#[derive(Clone, Copy, Debug)]
struct Record {
    /// The value in the map; for an id reserved and not written yet, one
    /// with the backend's address (a slot found naming an id the map
    /// lacks: the default, of no address).
    value: BackendValue,
    uses: Uses,
    wants: WantCounts,
}

impl Record {
    fn new(value: BackendValue, written: bool) -> Self {
        Self { value, uses: Uses::of(written, 0), wants: WantCounts::default() }
    }

    const fn written(&self) -> bool {
        self.uses.written()
    }
}

#[derive(Debug, Default)]
pub(crate) struct BackendTable {
    by_id: Vec<Option<Record>>,
    /// The id of each address (the lowest, should the maps hold two),
    /// written or reserved.
    ids: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    pool: IdPool<u32>,
    /// Records written to the map.
    written: usize,
    /// The records were read back and `ids` is not made yet
    /// (`index_recovered`).
    unindexed: bool,
    /// Records of an address `ids` knows by a lower id (the maps held it
    /// twice, left by a crash, until the first sync deletes them). While
    /// there are any, an id found at a frontend's slot is not trusted to be
    /// its address's (`reserve_at`).
    duplicates: usize,
}

impl BackendTable {
    /// The backends found in the map; returns the ids to delete: those of
    /// no backend (an unknown protocol, id 0 or too large).
    #[cfg(test)]
    pub(crate) fn recover_all(found: &BTreeMap<u32, BackendValue>) -> (Self, Vec<u32>) {
        let mut this = Self::recovering(None);
        let stale = found.iter().filter(|(id, value)| !this.recover(**id, **value)).map(|(id, _)| *id).collect();
        this.index_recovered();
        (this, stale)
    }

    /// A table to take the backends of a map back into, one at a time
    /// (`recover`), then `index_recovered`; room for the ids of a map of
    /// `capacity` entries is made at once (the pages of ids never read are
    /// never touched).
    pub(crate) fn recovering(capacity: Option<usize>) -> Self {
        let mut this = Self { unindexed: true, ..Self::default() };
        if let Some(capacity) = capacity {
            let ids = usize::try_from(MAX_ID).expect("u32 fits usize");
            this.by_id.reserve_exact(capacity.min(ids) + 1);
        }
        this
    }

    /// Takes backend `id` found in the map; false when it is no backend
    /// (an unknown protocol, id 0 or too large): the caller deletes it.
    pub(crate) fn recover(&mut self, id: u32, value: BackendValue) -> bool {
        if codec::backend_addr(&value).is_err() || !(1..MAX_ID).contains(&id) {
            return false;
        }
        *self.slot(id) = Some(Record::new(value, true));
        self.written += 1;
        true
    }

    /// Indexes the backends `recover` took by address (the index made at
    /// once, not grown), before the first lookup: a restart makes it once
    /// the lists are translated, not beside them. An address the map holds
    /// at two ids is known by the lower. (The id pool is built by
    /// `reserve_recovered`, once the slots naming ids are read too.)
    pub(crate) fn index_recovered(&mut self) {
        if !std::mem::take(&mut self.unindexed) {
            return;
        }
        let Self { by_id, ids, hasher, written, .. } = self;
        let rehash = |id: &u32| record_addr(by_id, *id).map_or(0, |a| hasher.hash_one(a));
        ids.reserve(*written, rehash);
        // One probe an id (found, or the place to insert it): ids go up,
        // so an address found already has its lower id there.
        for id in 0..by_id.len() {
            let id = to_id(id);
            let Some(addr) = record_addr(by_id, id) else { continue };
            let same = |other: &u32| record_addr(by_id, *other).as_ref() == Some(&addr);
            match ids.entry(hasher.hash_one(addr), same, rehash) {
                hashbrown::hash_table::Entry::Vacant(place) => {
                    place.insert(id);
                }
                hashbrown::hash_table::Entry::Occupied(_) => self.duplicates += 1,
            }
        }
    }

    fn ids_in_use(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_id.iter().enumerate().filter(|(_, r)| r.is_some()).map(|(id, _)| to_id(id))
    }

    fn slot(&mut self, id: u32) -> &mut Option<Record> {
        let i = usize::try_from(id).expect("u32 fits usize");
        if self.by_id.len() <= i {
            // Grown by an eighth, not doubled: ids are dense, and the
            // table is about as large as it will stay (a whole table's
            // room is made at once: `reserve_for`).
            if self.by_id.capacity() <= i {
                let more = (i + 1 - self.by_id.len()).max(self.by_id.len() / 8);
                self.by_id.reserve_exact(more);
            }
            self.by_id.resize(i + 1, None);
        }
        &mut self.by_id[i]
    }

    /// Room for `backends` backends in all, made at once: a big start
    /// otherwise grows the index many times (each growth hashing every
    /// address again, read from its record) and the records many times by
    /// an eighth (`slot`). The records get an eighth more, as `slot` grows
    /// them: made exactly, the first new backend after the start would
    /// move all of them, inside that one change.
    pub(crate) fn reserve_for(&mut self, backends: usize) {
        let Self { by_id, ids, hasher, .. } = self;
        ids.reserve(backends.saturating_sub(ids.len()), |id| record_addr(by_id, *id).map_or(0, |a| hasher.hash_one(a)));
        // Ids start at 1.
        by_id.reserve_exact((backends + 1 + backends / 8).saturating_sub(by_id.len()));
    }

    /// Whether `id` is the id `addr` is indexed by, known from its record
    /// alone: a record holds one address, and while no address has two
    /// records the index names every record by its own.
    fn indexed_as(&self, id: u32, addr: &BackendAddr) -> bool {
        self.duplicates == 0 && !self.unindexed && record_addr(&self.by_id, id).as_ref() == Some(addr)
    }

    /// The id `addr` is indexed by.
    fn lookup(&self, addr: &BackendAddr) -> Option<u32> {
        debug_assert!(!self.unindexed, "a lookup before `index_recovered`");
        let by_id = &self.by_id;
        self.ids.find(self.hasher.hash_one(addr), |id| record_addr(by_id, *id).as_ref() == Some(addr)).copied()
    }

    /// Indexes `id` by the address in its record.
    fn index(&mut self, id: u32) {
        let Self { by_id, ids, hasher, .. } = self;
        let Some(addr) = record_addr(by_id, id) else { return };
        ids.insert_unique(hasher.hash_one(addr), id, |id| record_addr(by_id, *id).map_or(0, |a| hasher.hash_one(a)));
    }

    fn get(&self, id: u32) -> Option<&Record> {
        self.by_id.get(usize::try_from(id).ok()?)?.as_ref()
    }

    fn get_mut(&mut self, id: u32) -> Option<&mut Record> {
        self.by_id.get_mut(usize::try_from(id).ok()?)?.as_mut()
    }

    /// Number of backends in the map.
    pub(crate) const fn len(&self) -> usize {
        self.written
    }

    /// Every id with a record, in order.
    #[cfg(test)]
    pub(crate) fn all_ids(&self) -> Vec<u32> {
        self.ids_in_use().collect()
    }

    /// Every id with a record is below this: `1..bound()` goes over them
    /// in order without a list of them (a million at 100,000 services).
    pub(crate) fn bound(&self) -> u32 {
        to_id(self.by_id.len())
    }

    /// The id of `addr` in the map (`None`: not written).
    pub(crate) fn id(&self, addr: &BackendAddr) -> Option<u32> {
        self.lookup(addr).filter(|id| self.is_written(*id))
    }

    /// `id(addr)`, tried first at `hint` (the id a frontend's slot
    /// held at that place): a table that did not change there finds its ids
    /// in the records the frontend names, near one another, without a probe
    /// of the index for each (a million at a restart's first sync).
    pub(crate) fn id_at(&self, addr: &BackendAddr, hint: Option<u32>) -> Option<u32> {
        match hint {
            Some(id) if self.indexed_as(id, addr) => self.is_written(id).then_some(id),
            _ => self.id(addr),
        }
    }

    /// Whether backend `id` is in the map.
    pub(crate) fn is_written(&self, id: u32) -> bool {
        self.get(id).is_some_and(Record::written)
    }

    /// The value the map holds at `id` (`None`: not written).
    pub(crate) fn held(&self, id: u32) -> Option<BackendValue> {
        self.get(id).filter(|r| r.written()).map(|r| r.value)
    }

    /// The address of backend `id` (`None`: no such backend).
    pub(crate) fn addr(&self, id: u32) -> Option<BackendAddr> {
        codec::backend_addr(&self.get(id)?.value).ok()
    }

    /// The id of `addr`, reserving a free one when it has none (`None`:
    /// every id is taken).
    pub(crate) fn reserve(&mut self, addr: BackendAddr) -> Option<u32> {
        if let Some(id) = self.lookup(&addr) {
            return Some(id);
        }
        let id = self.pool.allocate()?;
        let value = codec::backend_value(BackendEntry { addr, state: BackendState::Active, local: false });
        *self.slot(id) = Some(Record::new(value, false));
        self.index(id);
        Some(id)
    }

    /// `reserve(addr)`, tried first at `hint` (as `id_at`).
    pub(crate) fn reserve_at(&mut self, addr: BackendAddr, hint: Option<u32>) -> Option<u32> {
        match hint {
            Some(id) if self.indexed_as(id, &addr) => Some(id),
            _ => self.reserve(addr),
        }
    }

    /// A frontend of the desired table wants backend `id` (`wanted`: a
    /// frontend no longer does).
    pub(crate) fn want(&mut self, id: u32, way: Wanted, wanted: bool) {
        if let Some(r) = self.get_mut(id) {
            if wanted {
                r.wants.add(way);
            } else {
                r.wants.remove(way);
            }
        }
    }

    /// Forgets every frontend's wants (before counting the table anew).
    pub(crate) fn clear_wants(&mut self) {
        for r in self.by_id.iter_mut().flatten() {
            r.wants = WantCounts::default();
        }
    }

    /// The value the desired table wants at `id` when it differs from the
    /// map's, and whether the id is new to the map.
    pub(crate) fn to_write(&self, id: u32) -> Option<(BackendValue, bool)> {
        let r = self.get(id)?;
        let best = r.wants.best()?;
        let addr = codec::backend_addr(&r.value).ok()?;
        let value = codec::backend_value(BackendEntry { addr, state: best.state, local: best.local });
        (!r.written() || r.value != value).then_some((value, !r.written()))
    }

    /// `value` is in the map at `id`.
    pub(crate) fn written(&mut self, id: u32, value: BackendValue) {
        let Some(r) = self.get_mut(id) else { return };
        let new = !r.written();
        r.value = value;
        r.uses = Uses::of(true, r.uses.slots());
        self.written += usize::from(new);
    }

    /// Whether `id` can go: no slot names it and the desired table does not
    /// want it there; `Some(true)` when it must be deleted from the map
    /// first (else it was never written).
    pub(crate) fn unused(&self, id: u32) -> Option<bool> {
        let r = self.get(id)?;
        (r.uses.slots() == 0 && r.wants.is_empty()).then_some(r.written())
    }

    /// Drops the record of `id` (deleted from the map, or never written)
    /// and frees the id.
    pub(crate) fn forget(&mut self, id: u32) {
        if let Some(addr) = record_addr(&self.by_id, id) {
            match self.ids.find_entry(self.hasher.hash_one(addr), |x| *x == id) {
                Ok(entry) => drop(entry.remove()),
                // Not indexed: a second id of its address (or a record
                // read back and not indexed yet).
                Err(_) if !self.unindexed => self.duplicates = self.duplicates.saturating_sub(1),
                Err(_) => {}
            }
        }
        let Some(r) = self.slot(id).take() else { return };
        if r.written() {
            self.written -= 1;
        }
        self.pool.release(id);
    }

    /// One more slot names `id` (one the map lacks, found on recovery,
    /// gets a record so that the id is not handed out while named).
    pub(crate) fn add_slot(&mut self, id: u32) {
        if id == 0 || id >= MAX_ID {
            return;
        }
        let r = self.slot(id).get_or_insert(Record::new(BackendValue::default(), false));
        r.uses = Uses::of(r.written(), r.uses.slots() + 1);
    }

    /// One slot fewer names `id`.
    pub(crate) fn remove_slot(&mut self, id: u32) {
        if let Some(r) = self.get_mut(id) {
            r.uses = Uses::of(r.written(), r.uses.slots().saturating_sub(1));
        }
    }

    /// Takes ids found named by slots into the pool's used ids (recovery,
    /// after the slots were read).
    pub(crate) fn reserve_recovered(&mut self) {
        self.pool = IdPool::with_used(self.ids_in_use());
    }
}

/// The address in the record of `id` (`None`: no record, or one of no
/// address).
fn record_addr(by_id: &[Option<Record>], id: u32) -> Option<BackendAddr> {
    let r = by_id.get(usize::try_from(id).ok()?)?.as_ref()?;
    codec::backend_addr(&r.value).ok()
}

fn to_id(i: usize) -> u32 {
    u32::try_from(i).expect("ids stay below MAX_ID")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    fn addr(n: u8) -> BackendAddr {
        BackendAddr { addr: [10, 0, 0, n].into(), port: 80, protocol: Protocol::Tcp }
    }

    const ACTIVE: Wanted = Wanted { state: BackendState::Active, local: false };
    const TERMINATING_LOCAL: Wanted = Wanted { state: BackendState::Terminating, local: true };

    #[test]
    fn a_backend_takes_the_best_of_what_its_frontends_want() {
        let mut t = BackendTable::default();
        let id = t.reserve(addr(1)).unwrap();
        assert_eq!(t.reserve(addr(1)), Some(id), "one id per address");
        assert_eq!(t.id(&addr(1)), None, "not written yet");
        t.want(id, TERMINATING_LOCAL, true);
        t.want(id, ACTIVE, true);
        let (value, new) = t.to_write(id).unwrap();
        assert!(new);
        let entry = codec::backend_entry(&value).unwrap();
        assert_eq!((entry.state, entry.local), (BackendState::Active, true));
        t.written(id, value);
        assert_eq!((t.id(&addr(1)), t.len(), t.to_write(id)), (Some(id), 1, None));
        t.want(id, ACTIVE, false);
        let entry = codec::backend_entry(&t.to_write(id).unwrap().0).unwrap();
        assert_eq!(entry.state, BackendState::Terminating);
    }

    /// The counts give what merging every frontend's view gives, for any
    /// mix of adds and removes of the four ways a frontend wants a backend.
    #[test]
    fn want_counts_give_the_best_of_the_views_held() {
        let ways = [
            ACTIVE,
            Wanted { state: BackendState::Active, local: true },
            Wanted { state: BackendState::Terminating, local: false },
            TERMINATING_LOCAL,
        ];
        let mut seed = 0x9e37_79b9_u32;
        for _ in 0..200 {
            let (mut counts, mut held) = (WantCounts::default(), Vec::new());
            for _ in 0..20 {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                let way = ways[(seed % 4) as usize];
                if seed.is_multiple_of(3) && !held.is_empty() {
                    let at = (seed as usize / 3) % held.len();
                    counts.remove(held.swap_remove(at));
                } else {
                    counts.add(way);
                    held.push(way);
                }
                // The best of two views: the better state, local if either is.
                let merge = |a: Wanted, b: Wanted| Wanted { state: a.state.min(b.state), local: a.local || b.local };
                assert_eq!(counts.best(), held.iter().copied().reduce(merge), "{held:?}");
                assert_eq!(counts.is_empty(), held.is_empty());
            }
        }
    }

    #[test]
    fn a_record_is_40_bytes_present_or_not() {
        assert_eq!(std::mem::size_of::<Option<Record>>(), 40, "a million of them at 100,000 services");
        let uses = Uses::of(false, 3);
        assert_eq!((uses.written(), uses.slots()), (false, 3));
        let uses = Uses::of(true, uses.slots() - 1);
        assert_eq!((uses.written(), uses.slots()), (true, 2));
    }

    #[test]
    fn a_backend_goes_once_no_slot_names_it_and_no_frontend_wants_it() {
        let mut t = BackendTable::default();
        let id = t.reserve(addr(1)).unwrap();
        t.want(id, ACTIVE, true);
        t.written(id, t.to_write(id).unwrap().0);
        t.add_slot(id);
        t.want(id, ACTIVE, false);
        assert_eq!(t.unused(id), None, "a slot names it");
        t.remove_slot(id);
        assert_eq!(t.unused(id), Some(true), "in the map: delete it first");
        t.forget(id);
        assert_eq!((t.len(), t.id(&addr(1)), t.addr(id)), (0, None, None));
        assert_eq!(t.reserve(addr(2)), Some(id), "the id is free again");
    }

    #[test]
    fn room_made_for_a_table_is_not_grown_while_it_is_written() {
        let mut t = BackendTable::default();
        let first = t.reserve(addr(0)).unwrap();
        t.reserve_for(250);
        let room = (t.ids.capacity(), t.by_id.capacity());
        assert!(room.0 >= 250 && room.1 > 250, "{room:?}");
        let ids: Vec<u32> = (1..250).map(|n| t.reserve(addr(u8::try_from(n).unwrap())).unwrap()).collect();
        assert_eq!((t.ids.capacity(), t.by_id.capacity()), room, "grown while reserving 250 backends");
        assert!(!ids.contains(&first) && ids.iter().all(|id| t.addr(*id).is_some()));
        assert_eq!(t.reserve(addr(7)), Some(ids[6]), "still one id per address");
        // A few backends more than the table had (the first changes after
        // a start) fit the room made too.
        for n in 250..=255 {
            t.reserve(addr(n)).unwrap();
        }
        assert_eq!((t.ids.capacity(), t.by_id.capacity()), room, "grown by the first new backends");
    }

    proptest::proptest! {
        /// A hint is taken only when the index would give the same id:
        /// maps read back with addresses at several ids (a crash's), then
        /// ids forgotten and addresses reserved, asked at every id.
        #[test]
        fn a_hint_is_taken_only_for_the_id_the_index_gives(
            found in proptest::collection::btree_map(1u32..40, 0u8..12, 0..30),
            forgotten in proptest::collection::vec(1u32..40, 0..10),
            reserved in proptest::collection::vec(0u8..16, 0..10),
        ) {
            let value = |n: u8| codec::backend_value(BackendEntry { addr: addr(n), state: BackendState::Active, local: false });
            let found: BTreeMap<u32, BackendValue> = found.into_iter().map(|(id, n)| (id, value(n))).collect();
            let (mut t, _) = BackendTable::recover_all(&found);
            t.reserve_recovered();
            for id in forgotten {
                t.forget(id);
            }
            for n in reserved {
                t.reserve(addr(n));
            }
            for n in 0..16 {
                for hint in (0..45).map(Some).chain([None]) {
                    proptest::prop_assert_eq!(t.id_at(&addr(n), hint), t.id(&addr(n)), "{} at {:?}", n, hint);
                    if hint.is_some_and(|id| t.indexed_as(id, &addr(n))) {
                        proptest::prop_assert_eq!(t.lookup(&addr(n)), hint);
                    }
                }
            }
        }
    }

    #[test]
    fn recovery_keeps_the_lowest_id_of_an_address_and_drops_bad_ids() {
        let value = codec::backend_value(BackendEntry { addr: addr(1), state: BackendState::Active, local: false });
        let found = BTreeMap::from([(0, value), (3, value), (5, value), (MAX_ID, value)]);
        let (mut t, stale) = BackendTable::recover_all(&found);
        assert_eq!(stale, vec![0, MAX_ID]);
        assert_eq!((t.len(), t.id(&addr(1)), t.all_ids()), (2, Some(3), vec![3, 5]));
        t.add_slot(7);
        t.reserve_recovered();
        let fresh: Vec<u32> = (2..6).filter_map(|n| t.reserve(addr(n))).collect();
        assert_eq!(fresh, vec![1, 2, 4, 6], "3 and 5 are in the map, 7 is named by a slot");
    }
}
