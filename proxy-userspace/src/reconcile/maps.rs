//! The service maps the reconciler writes, behind a trait: the kernel
//! implementation is `crate::datapath::maps::KernelMaps`, a fake one
//! (`fake_maps`) serves the reconciler's tests. Every operation is
//! idempotent: writing the same value twice or deleting a missing key is
//! success.
use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use proxy_common::{Backend as BackendValue, RevNat, RevNatId, ServiceKey, ServiceName, ServiceValue};

pub use super::map_error::{MapError, MapName};

/// Every entry of the maps the reconciler writes, for recovery and
/// inspection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dump {
    /// `SERVICES` entries.
    pub services: BTreeMap<ServiceKey, ServiceValue>,
    /// `BACKENDS` entries, by id.
    pub backends: BTreeMap<u32, BackendValue>,
    /// `REVNAT` entries, by rev-NAT id.
    pub rev_nat: BTreeMap<RevNatId, RevNat>,
    /// Maglev tables by id.
    pub maglev: BTreeMap<u16, Vec<u32>>,
    /// loadBalancerSourceRanges: (rev-NAT id, source network).
    pub source_ranges: BTreeSet<(RevNatId, IpNet)>,
    /// The service port of each frontend, by rev-NAT id.
    pub names: BTreeMap<RevNatId, ServiceName>,
}

/// A batch write of one map, in a lane of `ServiceMaps::write_lanes`.
#[derive(Clone, Copy, Debug)]
pub enum Batch<'a> {
    Services(&'a [(ServiceKey, ServiceValue)]),
    RevNats(&'a [(RevNatId, RevNat)]),
    Names(&'a [(RevNatId, ServiceName)]),
}

impl Batch<'_> {
    #[must_use]
    pub(crate) const fn len(&self) -> usize {
        match self {
            Self::Services(entries) => entries.len(),
            Self::RevNats(entries) => entries.len(),
            Self::Names(entries) => entries.len(),
        }
    }

    pub(crate) const fn map(&self) -> MapName {
        match self {
            Self::Services(_) => MapName::Services,
            Self::RevNats(_) => MapName::RevNat,
            Self::Names(_) => MapName::Names,
        }
    }
}

/// Entries in all of `lane`'s batches.
pub(crate) fn lane_len(lane: &[Batch<'_>]) -> usize {
    lane.iter().map(Batch::len).sum()
}

/// The maps the reconciler writes: the kernel's, or a fake for tests.
pub trait ServiceMaps {
    /// Writes backend `id`.
    fn set_backend(&mut self, id: u32, value: &BackendValue) -> Result<(), MapError>;
    /// Writes `entries` in order (in one call where the kernel can);
    /// stops at the first that fails and says which: `Err((index, error))`,
    /// the ones before it written, the ones after not tried.
    fn set_backends(&mut self, entries: &[(u32, BackendValue)]) -> Result<(), (usize, MapError)> {
        one_by_one(entries, |id, value| self.set_backend(id, value))
    }
    /// As `set_backends`, for backends new to the map at their ids (no
    /// reader holds them as live backends): an implementation may write
    /// them in steps a reader holding a stale id never sees half done
    /// and several at once (then, on `Err((i, _))`, entries after `i` may
    /// have been written empty: the state a removal leaves).
    fn add_backends(&mut self, entries: &[(u32, BackendValue)]) -> Result<(), (usize, MapError)> {
        self.set_backends(entries)
    }
    /// Removes backend `id`, whose entry holds `held` (the reconciler's
    /// record of it, or what a dump read).
    fn remove_backend(&mut self, id: u32, held: &BackendValue) -> Result<(), MapError>;
    /// Writes a `SERVICES` entry (slot 0 or a slots entry).
    fn set_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError>;
    /// As `set_backends`, for service entries.
    fn set_services(&mut self, entries: &[(ServiceKey, ServiceValue)]) -> Result<(), (usize, MapError)> {
        one_by_one(entries, |key, value| self.set_service(&key, value))
    }
    /// Writes two lanes of batches that share no key: each lane's batches
    /// in order, up to the lane's first failure (each result counts its
    /// own lane's entries, across its batches). An implementation may
    /// write the lanes at once, so that a failure in one says nothing of
    /// the other. A start writes ~600,000 hash entries at 100,000 services
    /// of 10 endpoints (slots entries, slots 0, rev-NAT entries, names),
    /// and the kernel's hash inserts are much of its first sync.
    fn write_lanes(&mut self, lanes: [&[Batch<'_>]; 2]) -> [Result<(), (usize, MapError)>; 2] {
        [self.write_lane(lanes[0]), self.write_lane(lanes[1])]
    }
    /// The batches of one lane of `write_lanes`, in order.
    fn write_lane(&mut self, lane: &[Batch<'_>]) -> Result<(), (usize, MapError)> {
        let mut done = 0;
        for batch in lane {
            let result = match batch {
                Batch::Services(entries) => self.set_services(entries),
                Batch::RevNats(entries) => self.set_rev_nats(entries),
                Batch::Names(entries) => self.set_names(entries),
            };
            result.map_err(|(n, error)| (done + n, error))?;
            done += batch.len();
        }
        Ok(())
    }
    /// Deletes a `SERVICES` entry.
    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), MapError>;
    /// Writes the rev-NAT entry of id `id`.
    fn set_rev_nat(&mut self, id: RevNatId, value: &RevNat) -> Result<(), MapError>;
    /// As `set_backends`, for rev-NAT entries.
    fn set_rev_nats(&mut self, entries: &[(RevNatId, RevNat)]) -> Result<(), (usize, MapError)> {
        one_by_one(entries, |id, value| self.set_rev_nat(id, value))
    }
    /// Deletes the rev-NAT entry of id `id`.
    fn remove_rev_nat(&mut self, id: RevNatId) -> Result<(), MapError>;
    /// Entries of every Maglev table.
    fn maglev_size(&self) -> usize;
    /// Writes Maglev table `id`.
    fn set_maglev(&mut self, id: u16, table: &[u32]) -> Result<(), MapError>;
    /// Deletes Maglev table `id`.
    fn remove_maglev(&mut self, id: u16) -> Result<(), MapError>;
    /// Adds a loadBalancerSourceRange of frontend `rev_nat`.
    fn set_source_range(&mut self, rev_nat: RevNatId, net: IpNet) -> Result<(), MapError>;
    /// Deletes a loadBalancerSourceRange of frontend `rev_nat`.
    fn remove_source_range(&mut self, rev_nat: RevNatId, net: IpNet) -> Result<(), MapError>;
    /// Writes the service port name of frontend `rev_nat`.
    fn set_name(&mut self, rev_nat: RevNatId, name: &ServiceName) -> Result<(), MapError>;
    /// As `set_backends`, for names.
    fn set_names(&mut self, entries: &[(RevNatId, ServiceName)]) -> Result<(), (usize, MapError)> {
        one_by_one(entries, |id, name| self.set_name(id, name))
    }
    /// Deletes the name of frontend `rev_nat`.
    fn remove_name(&mut self, rev_nat: RevNatId) -> Result<(), MapError>;
    /// Every entry of the maps.
    fn dump(&self) -> Result<Dump, MapError>;
}

/// Writes `entries` one at a time through `one`, in order, up to the first
/// that fails: `Err((index, error))`.
pub(crate) fn one_by_one<K: Copy, V>(
    entries: &[(K, V)],
    mut one: impl FnMut(K, &V) -> Result<(), MapError>,
) -> Result<(), (usize, MapError)> {
    for (i, (key, value)) in entries.iter().enumerate() {
        one(*key, value).map_err(|e| (i, e))?;
    }
    Ok(())
}
