//! The Maglev tables of the frontends traffic from outside reaches: one per
//! distinct backend list, shared by every frontend with that list (the
//! NodePort on each node address and the LoadBalancer IP of one service
//! port use one table). A table is written before a slot 0 names it and
//! deleted once none does; the backends it names stay in `BACKENDS` while
//! it exists.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{
    codec::BackendAddr,
    ids::IdPool,
    map_error::{MapError, MapName},
    maps::ServiceMaps,
};

#[derive(Debug, Default)]
pub(crate) struct MaglevTables {
    /// Table id by the backend ids (slot order) it was built from.
    by_list: HashMap<Vec<u32>, u16>,
    tables: BTreeMap<u16, Table>,
    pool: IdPool<u16>,
    /// How many slot 0s name each table.
    slot_zeros: HashMap<u16, usize>,
    /// How many tables hold each backend id.
    backends: HashMap<u32, usize>,
    /// Tables no slot 0 names (any more): deleted by `remove_unused`.
    unused: BTreeSet<u16>,
}

#[derive(Debug)]
struct Table {
    /// The backend ids in the table.
    ids: BTreeSet<u32>,
    /// The list it was built from; `None` for a table found in the maps
    /// that matches no frontend (not reused, deleted when unused).
    list: Option<Vec<u32>>,
}

/// The bytes that identify a backend in the Maglev permutation: the same
/// on every node (its address, port and protocol, not its local id), so
/// every node builds the same table and a flow picks the same backend.
#[must_use]
pub(crate) fn identity(b: &BackendAddr) -> Vec<u8> {
    let mut out = proxy_common::net::encode(b.addr).0.to_vec();
    out.extend_from_slice(&b.port.to_be_bytes());
    out.push(b.protocol.number());
    out
}

/// The table for `list` (backend ids in slot order, `addr` giving their
/// addresses): entry `i` holds the id of the backend flows hashing to `i`
/// go to.
#[must_use]
pub(crate) fn build(list: &[u32], addr: impl Fn(u32) -> Option<BackendAddr>, size: usize) -> Option<Vec<u32>> {
    let identities: Vec<Vec<u8>> = list.iter().map(|id| addr(*id).as_ref().map(identity)).collect::<Option<_>>()?;
    Some(crate::reconcile::maglev::table(&identities, size).into_iter().map(|i| list[i as usize]).collect())
}

impl MaglevTables {
    /// Takes table `id` found in the maps (`content`). `list` is the
    /// backend list of a frontend whose slot 0 names it (`addr` gives the
    /// addresses of the backends in the map): a table built from that list
    /// can be reused by frontends with the same list. Once every table is
    /// read, `recovered`.
    pub(crate) fn recover(
        &mut self,
        id: u16,
        content: &[u32],
        list: Option<&Vec<u32>>,
        addr: impl Fn(u32) -> Option<BackendAddr>,
        size: usize,
    ) {
        self.unused.insert(id);
        let list =
            list.filter(|list| content.len() == size && build(list, &addr, size).as_deref() == Some(content)).cloned();
        // Of two tables of one list, the lower id is reused, in whatever
        // order they are read.
        if let Some(list) = &list {
            self.by_list.entry(list.clone()).and_modify(|held| *held = (*held).min(id)).or_insert(id);
        }
        self.add(id, Table { ids: content.iter().copied().collect(), list });
    }

    /// Every table found is in: their ids are taken.
    pub(crate) fn recovered(&mut self) {
        self.pool = IdPool::with_used(self.tables.keys().copied());
    }

    fn add(&mut self, id: u16, table: Table) {
        for backend in &table.ids {
            *self.backends.entry(*backend).or_default() += 1;
        }
        self.tables.insert(id, table);
    }

    /// A slot 0 that named table `old` now names `new` (0: none).
    pub(crate) fn slot_zero_changed(&mut self, old: u16, new: u16) {
        if old == new {
            return;
        }
        if new != 0 {
            *self.slot_zeros.entry(new).or_default() += 1;
            self.unused.remove(&new);
        }
        if old != 0
            && let Some(n) = self.slot_zeros.get_mut(&old)
        {
            *n -= 1;
            if *n == 0 {
                self.slot_zeros.remove(&old);
                self.unused.insert(old);
            }
        }
    }

    /// Whether some table holds backend `id`.
    #[must_use]
    pub(crate) fn holds_backend(&self, id: u32) -> bool {
        self.backends.contains_key(&id)
    }

    /// The id of the table for `list`, written first if there is none.
    pub(crate) fn get_or_write(
        &mut self,
        maps: &mut impl ServiceMaps,
        list: &[u32],
        addrs: &BTreeMap<u32, BackendAddr>,
        writes: &mut usize,
    ) -> Result<u16, MapError> {
        if let Some(id) = self.by_list.get(list) {
            return Ok(*id);
        }
        let content =
            build(list, |id| addrs.get(&id).copied(), maps.maglev_size()).expect("every listed backend is in the map");
        let id = self.pool.allocate().ok_or(MapError::Full { map: MapName::Maglev })?;
        *writes += 1;
        if let Err(err) = maps.set_maglev(id, &content) {
            self.pool.release(id);
            return Err(err);
        }
        self.by_list.insert(list.to_vec(), id);
        // Unused until a slot 0 names it.
        self.unused.insert(id);
        self.add(id, Table { ids: list.iter().copied().collect(), list: Some(list.to_vec()) });
        Ok(id)
    }

    /// Deletes the tables no slot 0 names; failures are returned (the table
    /// stays, and is deleted by a later call).
    pub(crate) fn remove_unused(&mut self, maps: &mut impl ServiceMaps, writes: &mut usize) -> Vec<(u16, MapError)> {
        let mut failures = Vec::new();
        for id in std::mem::take(&mut self.unused) {
            *writes += 1;
            match maps.remove_maglev(id) {
                Ok(()) => {
                    if let Some(table) = self.tables.remove(&id) {
                        if let Some(list) = &table.list {
                            self.by_list.remove(list);
                        }
                        for backend in &table.ids {
                            if let Some(n) = self.backends.get_mut(backend) {
                                *n -= 1;
                                if *n == 0 {
                                    self.backends.remove(backend);
                                }
                            }
                        }
                    }
                    self.pool.release(id);
                }
                Err(err) => {
                    self.unused.insert(id);
                    failures.push((id, err));
                }
            }
        }
        failures
    }

    /// Number of tables.
    #[must_use]
    pub(crate) fn count(&self) -> usize {
        self.tables.len()
    }
}
