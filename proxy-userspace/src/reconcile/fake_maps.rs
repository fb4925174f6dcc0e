//! In-memory maps, for the tests of the reconciler and the pipeline (they
//! need no kernel). After every single write they
//! check what a reader in the kernel relies on, and they can fail a chosen
//! write or refuse entries past a capacity, as a full kernel map does.
use std::collections::BTreeMap;

use ipnet::IpNet;
use proxy_common::{Backend as BackendValue, RevNat, RevNatId, ServiceKey, ServiceName, ServiceValue};

use super::{
    codec,
    maps::{Batch, Dump, Entry, MapError, MapName, ServiceMaps, one_by_one},
};
use crate::model::Scope;

/// Service maps in memory, for tests: they check what a reader would see after every write.
#[derive(Default)]
pub struct FakeMaps {
    /// Every entry held.
    pub state: Dump,
    /// Fail the write with this index (0-based, counting every call).
    pub fail_at: Option<usize>,
    /// Most entries per map (like a kernel map's max_entries).
    pub capacity: Option<usize>,
    /// Writes and deletes done.
    pub ops: usize,
    /// Rev-NAT entries and names written through the batch methods
    /// (`write_lanes`, `set_rev_nats`, `set_names`: only new frontends
    /// written in bulk).
    pub batched: usize,
    /// Entries of each Maglev table (0 means the smallest size, 251).
    pub maglev_size: usize,
    /// The order `write_lanes` writes its two lanes in (and `add_backends`
    /// its halves): two threads finish in either order, or take turns.
    pub two_lists: TwoLists,
}

/// How the in-memory maps write two lists the kernel maps may write at
/// once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TwoLists {
    /// The first, then the second.
    #[default]
    InOrder,
    /// The second, then the first: a failure can stop the first list
    /// while the second is written whole.
    SecondFirst,
    /// An entry of each in turn: a full map stops both part way.
    Alternating,
}

impl TwoLists {
    #[cfg(test)]
    pub(crate) const ALL: [Self; 3] = [Self::InOrder, Self::SecondFirst, Self::Alternating];

    /// Writes `lists` through `one` in this order, each list up to its
    /// first failure: what each wrote, counted in its own items.
    fn write<T>(
        self,
        [first, second]: [&[T]; 2],
        mut one: impl FnMut(&T) -> Result<(), MapError>,
    ) -> [Result<(), (usize, MapError)>; 2] {
        let mut in_order = |list: &[T]| -> Result<(), (usize, MapError)> {
            list.iter().enumerate().try_for_each(|(i, item)| one(item).map_err(|e| (i, e)))
        };
        match self {
            Self::InOrder => [in_order(first), in_order(second)],
            Self::SecondFirst => {
                let second = in_order(second);
                [in_order(first), second]
            }
            Self::Alternating => {
                let lists = [first, second];
                let mut results = [Ok(()), Ok(())];
                for i in 0..first.len().max(second.len()) {
                    for (list, result) in lists.iter().zip(&mut results) {
                        if let (Some(item), Ok(())) = (list.get(i), &result) {
                            *result = one(item).map_err(|e| (i, e));
                        }
                    }
                }
                results
            }
        }
    }
}

/// One entry of a lane of `write_lanes`.
enum LaneEntry<'a> {
    Service(&'a (ServiceKey, ServiceValue)),
    RevNat(&'a (RevNatId, RevNat)),
    Name(&'a (RevNatId, ServiceName)),
}

/// A lane's entries, across its batches, in order.
fn lane_entries<'a>(lane: &[Batch<'a>]) -> Vec<LaneEntry<'a>> {
    lane.iter()
        .flat_map(|batch| -> Box<dyn Iterator<Item = LaneEntry<'a>>> {
            match *batch {
                Batch::Services(entries) => Box::new(entries.iter().map(LaneEntry::Service)),
                Batch::RevNats(entries) => Box::new(entries.iter().map(LaneEntry::RevNat)),
                Batch::Names(entries) => Box::new(entries.iter().map(LaneEntry::Name)),
            }
        })
        .collect()
}

impl FakeMaps {
    fn step(&mut self, map: MapName) -> Result<(), MapError> {
        let n = self.ops;
        self.ops += 1;
        if self.fail_at == Some(n) {
            return Err(MapError::Syscall { map, op: "injected", source: std::io::Error::other("injected fault") });
        }
        Ok(())
    }

    fn insert<K: Ord, V>(
        map: &mut BTreeMap<K, V>,
        cap: Option<usize>,
        name: MapName,
        k: K,
        v: V,
    ) -> Result<(), MapError> {
        if !map.contains_key(&k) && cap.is_some_and(|c| map.len() >= c) {
            return Err(MapError::Full { map: name });
        }
        map.insert(k, v);
        Ok(())
    }

    /// Panics if a reader could find a slot 0 whose count reaches an
    /// unwritten slot, a slot naming a missing backend, no rev-NAT entry, a
    /// Maglev table that is missing or names a missing backend, or a
    /// `TWO_SCOPES` flag without the external twin.
    pub(crate) fn check_reader_view(&self) {
        for (key, slot_zero) in self.state.services.iter().filter(|(k, _)| k.slot == 0) {
            assert!(
                self.state.rev_nat.contains_key(&slot_zero.rev_nat),
                "rev-NAT {} of {key:?} missing",
                slot_zero.rev_nat
            );
            if slot_zero.maglev != 0 {
                let table = self
                    .state
                    .maglev
                    .get(&slot_zero.maglev)
                    .unwrap_or_else(|| panic!("{key:?}: Maglev table {} missing", slot_zero.maglev));
                assert_eq!(table.len(), self.maglev_size(), "{key:?}: a Maglev table of another size");
                for id in table {
                    assert!(self.state.backends.contains_key(id), "{key:?}: Maglev table names missing backend {id}");
                }
            }
            if codec::says_two_scopes(slot_zero.flags) {
                let twin = ServiceKey { scope: codec::scope_number(Scope::External), ..*key };
                assert!(self.state.services.contains_key(&twin), "{key:?} says TWO_SCOPES without its external twin");
            }
            for index in 0..slot_zero.count {
                let entry = self.state.services.get(&key.slots_of(index)).unwrap_or_else(|| {
                    panic!("{key:?}: the entry of slot {} of {} missing", index + 1, slot_zero.count)
                });
                let id = entry.slot_id(index);
                assert!(self.state.backends.contains_key(&id), "{key:?} slot {}: backend {id} missing", index + 1);
            }
        }
    }
}

impl ServiceMaps for FakeMaps {
    /// `BACKENDS` is an array: an id at or past `capacity` does not fit.
    fn set_backend(&mut self, id: u32, value: &BackendValue) -> Result<(), MapError> {
        self.step(MapName::Backends)?;
        if self.capacity.is_some_and(|c| usize::try_from(id).is_ok_and(|id| id >= c)) {
            return Err(MapError::Full { map: MapName::Backends });
        }
        // The kernel's array is written in place: only a backend's state
        // and flags may change under a reader (docs/design.md, "Map
        // layout"); a new address takes a removed (or never used) id.
        if let Some(old) = self.state.backends.get(&id) {
            assert!(
                (old.addr, old.port, old.proto) == (value.addr, value.port, value.proto),
                "backend {id} rewritten in place with another address: {old:?} -> {value:?}"
            );
        }
        self.state.backends.insert(id, *value);
        self.check_reader_view();
        Ok(())
    }

    /// New backends: none may be in the map at its id (the kernel's two
    /// steps would clear a live backend's protocol first).
    fn add_backends(&mut self, entries: &[(u32, BackendValue)]) -> Result<(), (usize, MapError)> {
        for (id, _) in entries {
            assert!(!self.state.backends.contains_key(id), "backend {id} added over a live one");
        }
        if self.two_lists == TwoLists::InOrder {
            return one_by_one(entries, |id, value| self.set_backend(id, value));
        }
        // As the kernel maps may: the halves at once (the second on a
        // thread of its own), and after a failure in the first half what
        // the second wrote emptied again.
        let (first, second) = entries.split_at(entries.len() / 2);
        let order = self.two_lists;
        let [first_result, second_result] = order.write([first, second], |(id, value)| self.set_backend(*id, value));
        match first_result {
            Ok(()) => second_result.map_err(|(n, error)| (first.len() + n, error)),
            Err(failed) => {
                let done = second_result.err().map_or(second.len(), |(n, _)| n);
                for (id, _) in &second[..done] {
                    self.state.backends.remove(id);
                }
                Err(failed)
            }
        }
    }

    /// `held` must be what the map holds there (the kernel's removal
    /// writes it back without its protocol).
    fn remove_backend(&mut self, id: u32, held: &BackendValue) -> Result<(), MapError> {
        self.step(MapName::Backends)?;
        if let Some(value) = self.state.backends.get(&id) {
            assert_eq!(value, held, "backend {id}: the value held is not the map's");
        }
        self.state.backends.remove(&id);
        self.check_reader_view();
        Ok(())
    }

    fn set_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError> {
        self.step(MapName::Services)?;
        Self::insert(&mut self.state.services, self.capacity, MapName::Services, *key, *value)?;
        self.check_reader_view();
        Ok(())
    }

    /// Entry by entry, in the order `two_lists` says (rev-NAT entries and
    /// names counted as `batched`, as `set_rev_nats` and `set_names` do).
    fn write_lanes(&mut self, lanes: [&[Batch<'_>]; 2]) -> [Result<(), (usize, MapError)>; 2] {
        let [first, second] = lanes.map(lane_entries);
        let order = self.two_lists;
        order.write([&first, &second], |entry| match entry {
            LaneEntry::Service((key, value)) => self.set_service(key, value),
            LaneEntry::RevNat((id, value)) => {
                self.batched += 1;
                self.set_rev_nat(*id, value)
            }
            LaneEntry::Name((id, name)) => {
                self.batched += 1;
                self.set_name(*id, name)
            }
        })
    }

    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), MapError> {
        self.step(MapName::Services)?;
        self.state.services.remove(key);
        self.check_reader_view();
        Ok(())
    }

    fn set_rev_nat(&mut self, id: RevNatId, value: &RevNat) -> Result<(), MapError> {
        self.step(MapName::RevNat)?;
        Self::insert(&mut self.state.rev_nat, self.capacity, MapName::RevNat, id, *value)?;
        self.check_reader_view();
        Ok(())
    }

    fn set_rev_nats(&mut self, entries: &[(RevNatId, RevNat)]) -> Result<(), (usize, MapError)> {
        self.batched += entries.len();
        one_by_one(entries, |id, value| self.set_rev_nat(id, value))
    }

    fn remove_rev_nat(&mut self, id: RevNatId) -> Result<(), MapError> {
        self.step(MapName::RevNat)?;
        self.state.rev_nat.remove(&id);
        self.check_reader_view();
        Ok(())
    }

    fn maglev_size(&self) -> usize {
        if self.maglev_size == 0 { crate::reconcile::maglev::SIZES[0] } else { self.maglev_size }
    }

    fn set_maglev(&mut self, id: u16, table: &[u32]) -> Result<(), MapError> {
        self.step(MapName::Maglev)?;
        assert_eq!(table.len(), self.maglev_size(), "a table of the map's size");
        Self::insert(&mut self.state.maglev, self.capacity, MapName::Maglev, id, table.to_vec())?;
        self.check_reader_view();
        Ok(())
    }

    fn remove_maglev(&mut self, id: u16) -> Result<(), MapError> {
        self.step(MapName::Maglev)?;
        self.state.maglev.remove(&id);
        self.check_reader_view();
        Ok(())
    }

    fn set_source_range(&mut self, rev_nat: RevNatId, net: IpNet) -> Result<(), MapError> {
        self.step(MapName::SourceRanges)?;
        if !self.state.source_ranges.contains(&(rev_nat, net))
            && self.capacity.is_some_and(|c| self.state.source_ranges.len() >= c)
        {
            return Err(MapError::Full { map: MapName::SourceRanges });
        }
        self.state.source_ranges.insert((rev_nat, net));
        self.check_reader_view();
        Ok(())
    }

    fn remove_source_range(&mut self, rev_nat: RevNatId, net: IpNet) -> Result<(), MapError> {
        self.step(MapName::SourceRanges)?;
        self.state.source_ranges.remove(&(rev_nat, net));
        self.check_reader_view();
        Ok(())
    }

    fn set_name(&mut self, rev_nat: RevNatId, name: &ServiceName) -> Result<(), MapError> {
        self.step(MapName::Names)?;
        Self::insert(&mut self.state.names, self.capacity, MapName::Names, rev_nat, *name)?;
        self.check_reader_view();
        Ok(())
    }

    fn set_names(&mut self, entries: &[(RevNatId, ServiceName)]) -> Result<(), (usize, MapError)> {
        self.batched += entries.len();
        one_by_one(entries, |id, name| self.set_name(id, name))
    }

    fn remove_name(&mut self, rev_nat: RevNatId) -> Result<(), MapError> {
        self.step(MapName::Names)?;
        self.state.names.remove(&rev_nat);
        self.check_reader_view();
        Ok(())
    }

    fn read(&self, map: MapName, each: &mut dyn FnMut(Entry<'_>)) -> Result<(), MapError> {
        self.state.read(map, each);
        Ok(())
    }

    fn capacity(&self, map: MapName) -> Option<usize> {
        let _ = map;
        self.capacity
    }

    fn dump(&self) -> Result<Dump, MapError> {
        Ok(self.state.clone())
    }
}
