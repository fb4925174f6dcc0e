//! The Maglev tables of the frontends traffic from outside reaches: one per
//! distinct backend list, shared by every frontend with that list (the
//! NodePort on each node address and the LoadBalancer IP of one service
//! port use one table). A table is written before a slot 0 names it and
//! deleted once none does; the backends it names stay in `BACKENDS` while
//! it exists.
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::{
    ids::IdPool,
    maps::{MapError, ServiceMaps},
    reconcile::BackendAddr,
};

#[derive(Debug, Default)]
pub struct MaglevTables {
    /// Table id by the backend ids (slot order) it was built from.
    by_list: HashMap<Vec<u32>, u16>,
    tables: BTreeMap<u16, Table>,
    pool: IdPool<u16>,
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
pub fn identity(b: &BackendAddr) -> Vec<u8> {
    let mut out = proxy_common::net::encode(b.addr).0.to_vec();
    out.extend_from_slice(&b.port.to_be_bytes());
    out.push(b.protocol.number());
    out
}

/// The table for `list` (backend ids in slot order, with their addresses
/// in `addrs`): entry `i` holds the id of the backend flows hashing to `i`
/// go to.
#[must_use]
pub fn build(list: &[u32], addrs: &BTreeMap<u32, BackendAddr>, size: usize) -> Option<Vec<u32>> {
    let identities: Vec<Vec<u8>> = list.iter().map(|id| addrs.get(id).map(identity)).collect::<Option<_>>()?;
    Some(crate::maglev::table(&identities, size).into_iter().map(|i| list[i as usize]).collect())
}

impl MaglevTables {
    /// The tables found in the maps. `lists` names, per table id, the
    /// backend list of a frontend whose slot 0 names it: a table built from
    /// that list can be reused by frontends with the same list.
    pub fn recover(
        found: &BTreeMap<u16, Vec<u32>>,
        lists: &BTreeMap<u16, Vec<u32>>,
        addrs: &BTreeMap<u32, BackendAddr>,
        size: usize,
    ) -> Self {
        let mut this = Self { pool: IdPool::with_used(found.keys().copied()), ..Self::default() };
        for (id, content) in found {
            let list = lists
                .get(id)
                .filter(|list| content.len() == size && build(list, addrs, size).as_ref() == Some(content))
                .cloned();
            if let Some(list) = &list {
                this.by_list.entry(list.clone()).or_insert(*id);
            }
            this.tables.insert(*id, Table { ids: content.iter().copied().collect(), list });
        }
        this
    }

    /// The id of the table for `list`, written first if there is none.
    pub fn get_or_write(
        &mut self,
        maps: &mut impl ServiceMaps,
        list: &[u32],
        addrs: &BTreeMap<u32, BackendAddr>,
        writes: &mut usize,
    ) -> Result<u16, MapError> {
        if let Some(id) = self.by_list.get(list) {
            return Ok(*id);
        }
        let content = build(list, addrs, maps.maglev_size()).expect("every listed backend is in the map");
        let id = self.pool.allocate().ok_or(MapError::Full { map: super::maps::MapName::Maglev })?;
        *writes += 1;
        if let Err(err) = maps.set_maglev(id, &content) {
            self.pool.release(id);
            return Err(err);
        }
        self.by_list.insert(list.to_vec(), id);
        self.tables.insert(id, Table { ids: list.iter().copied().collect(), list: Some(list.to_vec()) });
        Ok(id)
    }

    /// Deletes the tables no slot 0 in `used` names; failures are returned
    /// (the table stays, and is deleted by a later call).
    pub fn remove_unused(
        &mut self,
        maps: &mut impl ServiceMaps,
        used: &HashSet<u16>,
        writes: &mut usize,
    ) -> Vec<(u16, MapError)> {
        let unused: Vec<u16> = self.tables.keys().filter(|id| !used.contains(id)).copied().collect();
        let mut failures = Vec::new();
        for id in unused {
            *writes += 1;
            match maps.remove_maglev(id) {
                Ok(()) => {
                    if let Some(Table { list: Some(list), .. }) = self.tables.remove(&id) {
                        self.by_list.remove(&list);
                    }
                    self.pool.release(id);
                }
                Err(err) => failures.push((id, err)),
            }
        }
        failures
    }

    /// Backend ids some table names (they must stay in `BACKENDS`).
    pub fn backend_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.tables.values().flat_map(|t| t.ids.iter().copied())
    }

    /// Number of tables.
    #[must_use]
    pub fn count(&self) -> usize {
        self.tables.len()
    }
}
