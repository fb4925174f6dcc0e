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

impl Dump {
    /// Adds one entry read back.
    pub fn insert(&mut self, entry: Entry<'_>) {
        match entry {
            Entry::Service(key, value) => {
                self.services.insert(key, value);
            }
            Entry::Backend(id, value) => {
                self.backends.insert(id, value);
            }
            Entry::RevNat(id, value) => {
                self.rev_nat.insert(id, value);
            }
            Entry::Maglev(id, table) => {
                self.maglev.insert(id, table.to_vec());
            }
            Entry::SourceRange(id, net) => {
                self.source_ranges.insert((id, net));
            }
            Entry::Name(id, name) => {
                self.names.insert(id, *name);
            }
        }
    }

    /// Hands every entry of `map` to `each`, as `ServiceMaps::read` does.
    pub fn read(&self, map: MapName, each: &mut dyn FnMut(Entry<'_>)) {
        self.read_in(map, false, each);
    }

    /// As `read`, in key order or (`reversed`) the reverse of it.
    pub(crate) fn read_in(&self, map: MapName, reversed: bool, each: &mut dyn FnMut(Entry<'_>)) {
        fn each_of<T>(items: impl DoubleEndedIterator<Item = T>, reversed: bool, mut f: impl FnMut(T)) {
            if reversed {
                items.rev().for_each(&mut f);
            } else {
                items.for_each(&mut f);
            }
        }
        match map {
            MapName::Services => each_of(self.services.iter(), reversed, |(k, v)| each(Entry::Service(*k, *v))),
            MapName::Backends => each_of(self.backends.iter(), reversed, |(id, v)| each(Entry::Backend(*id, *v))),
            MapName::RevNat => each_of(self.rev_nat.iter(), reversed, |(id, v)| each(Entry::RevNat(*id, *v))),
            MapName::Maglev => each_of(self.maglev.iter(), reversed, |(id, t)| each(Entry::Maglev(*id, t))),
            MapName::SourceRanges => {
                each_of(self.source_ranges.iter(), reversed, |(id, net)| each(Entry::SourceRange(*id, *net)));
            }
            MapName::Names => each_of(self.names.iter(), reversed, |(id, name)| each(Entry::Name(*id, name))),
            MapName::ActiveConns | MapName::Ct => {}
        }
    }
}

/// One entry of the maps, as `ServiceMaps::read` hands it over.
#[derive(Clone, Copy, Debug)]
pub enum Entry<'a> {
    /// A `SERVICES` entry.
    Service(ServiceKey, ServiceValue),
    /// A `BACKENDS` entry that is not empty.
    Backend(u32, BackendValue),
    /// A `REVNAT` entry.
    RevNat(RevNatId, RevNat),
    /// A Maglev table.
    Maglev(u16, &'a [u32]),
    /// A loadBalancerSourceRange: (rev-NAT id, source network).
    SourceRange(RevNatId, IpNet),
    /// A service port's name, by rev-NAT id.
    Name(RevNatId, &'a ServiceName),
}

/// The maps `ServiceMaps::read` reads: those the reconciler writes.
pub const READ_MAPS: [MapName; 6] =
    [MapName::Services, MapName::Backends, MapName::RevNat, MapName::Maglev, MapName::SourceRanges, MapName::Names];

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
    /// Hands every entry of `map` (one of `READ_MAPS`; another has none
    /// here) to `each`, one at a time, in no set order: a restart reads
    /// the maps back through this into its reconciler (at 100,000 services
    /// 1,600,000 entries) without holding them all at once.
    fn read(&self, map: MapName, each: &mut dyn FnMut(Entry<'_>)) -> Result<(), MapError>;
    /// The most entries `map` holds (`None`: not known): a read-back makes
    /// room for `BACKENDS`' ids at once rather than growing its records
    /// while they arrive.
    fn capacity(&self, map: MapName) -> Option<usize> {
        let _ = map;
        None
    }
    /// Every entry of the maps, held at once (`ebpf-proxy service`, the
    /// drift audit, tests).
    fn dump(&self) -> Result<Dump, MapError> {
        let mut dump = Dump::default();
        for map in READ_MAPS {
            self.read(map, &mut |entry| dump.insert(entry))?;
        }
        Ok(dump)
    }
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
