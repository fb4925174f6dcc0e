//! The service maps in the kernel: the implementation of the reconciler's
//! `crate::reconcile::maps::ServiceMaps` that writes through aya and raw
//! batch syscalls.
use std::{
    io,
    os::fd::{AsFd as _, OwnedFd},
    path::Path,
};

use aya::maps::{Array, HashMap, LpmTrie, Map, MapData, MapError as AyaMapError, lpm_trie::Key as LpmKey};
use ipnet::IpNet;
use proxy_common::{
    Backend as BackendValue, RevNat, RevNatId, ServiceKey, ServiceName, ServiceValue, SourceRange, map_names,
};

use super::maglev_map::MaglevMap;
pub(crate) use crate::reconcile::maps::{Batch, Dump, Entry, MapError, MapName, ServiceMaps};
use crate::reconcile::maps::{lane_len, one_by_one};

/// The maps in the kernel, through aya (and raw batch writes, which aya
/// 0.14 lacks: a first sync at 10,000 services writes 220,000 entries).
pub struct KernelMaps {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    /// An array indexed by id; an entry of protocol 0 is empty (the
    /// programs' `backend` reads it so), and a removal clears the
    /// protocol (`remove_backend`, `add_backends`).
    backends: Array<MapData, BackendValue>,
    /// The same maps (and `rev_nat`, `names`), for batch writes.
    services_fd: OwnedFd,
    backends_fd: OwnedFd,
    rev_nat_fd: OwnedFd,
    names_fd: OwnedFd,
    /// False once the kernel refused a batch write (before 5.6).
    batches: bool,
    /// Ids of the backends' array at or above this were never written
    /// (all zeros): 0 for an array this load made, until the first write;
    /// `u32::MAX` for one found pinned. A read of an array never written
    /// need not go through its empty entries (2,097,152 of them at
    /// 1,000,000 backends), and a never-written id needs no two-step write
    /// (`add_backends`).
    backends_fresh_from: u32,
    rev_nat: HashMap<MapData, RevNatId, RevNat>,
    maglev: MaglevMap,
    source_ranges: LpmTrie<MapData, SourceRange, u8>,
    names: HashMap<MapData, RevNatId, ServiceName>,
    /// `ACTIVE_CONNS`: a backend's count goes with its id (`set_active`).
    active: Option<std::sync::Arc<super::active::ActiveConns>>,
}

/// The LPM key of a source range of frontend `rev_nat`.
fn source_range_key(rev_nat: RevNatId, net: IpNet) -> LpmKey<SourceRange> {
    let (prefix_len, key) = crate::reconcile::codec::source_range(rev_nat, net);
    LpmKey::new(prefix_len, key)
}

/// The frontend and network of an LPM key (`None`: not one we write).
fn source_range_of(key: &LpmKey<SourceRange>) -> Option<(RevNatId, IpNet)> {
    crate::reconcile::codec::source_range_of(key.prefix_len(), &key.data())
}

impl KernelMaps {
    /// Takes the maps out of a loaded object, with the Maglev and names
    /// maps the loader made.
    pub(crate) fn from_maps(
        services: Map,
        backends: Map,
        rev_nat: Map,
        source_ranges: Map,
        maglev: MaglevMap,
        names: HashMap<MapData, RevNatId, ServiceName>,
    ) -> Result<Self, MapError> {
        let services_fd = dup_fd(&services, MapName::Services)?;
        let backends_fd = dup_fd(&backends, MapName::Backends)?;
        let rev_nat_fd = dup_fd(&rev_nat, MapName::RevNat)?;
        let names_fd = dup_data_fd(aya::maps::IterableMap::map(&names), MapName::Names)?;
        Ok(Self {
            services: HashMap::try_from(services).map_err(|source| MapError::Aya { map: MapName::Services, source })?,
            backends: Array::try_from(backends).map_err(|source| MapError::Aya { map: MapName::Backends, source })?,
            services_fd,
            backends_fd,
            rev_nat_fd,
            names_fd,
            batches: true,
            backends_fresh_from: u32::MAX,
            rev_nat: HashMap::try_from(rev_nat).map_err(|source| MapError::Aya { map: MapName::RevNat, source })?,
            source_ranges: LpmTrie::try_from(source_ranges)
                .map_err(|source| MapError::Aya { map: MapName::SourceRanges, source })?,
            maglev,
            names,
            active: None,
        })
    }

    /// Opens the maps pinned in `dir` (the agent need not be running).
    pub fn open_pinned(dir: &Path) -> Result<Self, MapError> {
        let open = |name: &str, wrap: fn(MapData) -> Map| {
            let path = dir.join(name);
            MapData::from_pin(&path)
                .map(wrap)
                .map_err(|source| MapError::Open { path: path.display().to_string(), source })
        };
        Self::from_maps(
            open(map_names::SERVICES, Map::HashMap)?,
            open(map_names::BACKENDS, Map::Array)?,
            open(map_names::REVNAT, Map::HashMap)?,
            open(map_names::SOURCE_RANGES, Map::LpmTrie)?,
            MaglevMap::open(&dir.join(map_names::MAGLEV))?,
            super::names::open_for_reading(&dir.join(map_names::SERVICE_NAMES))?,
        )
    }
}

impl KernelMaps {
    /// The active connection counts of this set's backends: cleared when a
    /// backend is removed and when its id is handed to a new backend, so a
    /// count never outlives its backend (docs/design.md, "Balancing by
    /// load").
    pub(crate) fn set_active(&mut self, active: std::sync::Arc<super::active::ActiveConns>) {
        self.active = Some(active);
    }

    /// A second descriptor of `BACKENDS`, for readers beside the
    /// reconciler (the metrics endpoint).
    pub(crate) fn backends_fd(&self) -> Result<OwnedFd, MapError> {
        self.backends_fd.try_clone().map_err(|source| MapError::Syscall { map: MapName::Backends, op: "dup", source })
    }

    /// Slot 0's flags of the frontend at `addr`:`port` (host order) of IP
    /// protocol `proto`, scope `All` (`None`: no such frontend).
    #[must_use]
    pub(crate) fn frontend_flags(&self, addr: std::net::IpAddr, port: u16, proto: u8) -> Option<u16> {
        let key = ServiceKey::new(proxy_common::net::encode(addr), port.to_be(), proto, 0);
        self.services.get(&key, 0).ok().map(|v| v.flags)
    }

    /// What `BACKENDS` holds at `id` (`None`: empty or past the array).
    #[must_use]
    pub(crate) fn backend_value(&self, id: u32) -> Option<BackendValue> {
        self.backends.get(&id, 0).ok().filter(|b| b.proto != 0)
    }

    fn clear_active(&self, ids: impl Iterator<Item = u32>) {
        if let Some(active) = &self.active {
            ids.for_each(|id| active.clear(id));
        }
    }

    /// Says the backends' array was made just now (so holds nothing).
    pub(crate) fn backends_made_empty(&mut self) {
        self.backends_fresh_from = 0;
    }

    /// Notes that `ids` were written (the array's never-written ids are
    /// above them).
    fn backends_written(&mut self, ids: impl Iterator<Item = u32>) {
        if self.backends_fresh_from != u32::MAX {
            let above = ids.map(|id| id.saturating_add(1)).max().unwrap_or(0);
            self.backends_fresh_from = self.backends_fresh_from.max(above);
        }
    }

    /// `set_backends` without noting the ids written.
    fn write_backend_entries(&mut self, entries: &[(u32, BackendValue)]) -> Result<(), (usize, MapError)> {
        let Self { batches, backends_fd, backends, .. } = self;
        write_all(batches, backends_fd, MapName::Backends, entries, |id, value| {
            backends.set(id, value, 0).map_err(|e| update_error(MapName::Backends, e))
        })
    }

    /// `write_backend_entries` of new backends, the second half on a
    /// thread of its own when both halves are long enough (a start writes
    /// 1,000,000 at 100,000 services; each entry costs the kernel two
    /// checked copies). After a failure in the first half, what the second
    /// wrote is emptied again (`ServiceMaps::add_backends`).
    fn write_backend_entries_two(&mut self, entries: &[(u32, BackendValue)]) -> Result<(), (usize, MapError)> {
        if !self.batches || entries.len() / 2 < TWO_THREADS_FROM {
            return self.write_backend_entries(entries);
        }
        let (first, second) = entries.split_at(entries.len() / 2);
        let [a, b] = write_batches_two(&self.backends_fd, MapName::Backends, [first, second]);
        match (a, b) {
            (Ok(true), Ok(true)) => Ok(()),
            (Ok(true), Err((n, error))) => Err((first.len() + n, error)),
            (Err(failed), second_result) => {
                // What went in of the second half is written back empty
                // (the state a removal leaves): after a failure the
                // reconciler writes those ids again, or frees them.
                let done = match second_result {
                    Ok(true) => second.len(),
                    Ok(false) => 0,
                    Err((n, _)) => n,
                };
                let empty: Vec<(u32, BackendValue)> =
                    second[..done].iter().map(|(id, value)| (*id, emptied(value))).collect();
                if let Err((n, error)) = self.write_backend_entries(&empty) {
                    tracing::warn!(%error, left = done - n, "new backends after a failed write could not be emptied again; no slot names them, and a restart's read-back removes them");
                }
                Err(failed)
            }
            // The kernel has no batch writes (what was written is written
            // again, one at a time).
            _ => {
                self.batches = false;
                self.write_backend_entries(entries)
            }
        }
    }

    /// Hands each backend of the array to `each`, leaving out the empty
    /// entries (`backends_fresh_from`: none in an array never written).
    fn read_backends(&self, each: &mut dyn FnMut(Entry<'_>)) -> Result<(), MapError> {
        if self.backends_fresh_from == 0 {
            return Ok(());
        }
        let mut one = |id: u32, value: BackendValue| {
            if !is_empty_backend(&value) {
                each(Entry::Backend(id, value));
            }
        };
        match super::sys::for_each_entry(self.backends_fd.as_fd(), READ_BATCH, &mut one) {
            Ok(true) => Ok(()),
            Ok(false) => {
                for (id, value) in (0..).zip(self.backends.iter()) {
                    one(id, value.map_err(|source| MapError::Aya { map: MapName::Backends, source })?);
                }
                Ok(())
            }
            Err(source) => Err(MapError::Syscall { map: MapName::Backends, op: "bpf_map_lookup_batch", source }),
        }
    }

    /// `max_entries` of the services and backends maps, as the kernel
    /// reports them.
    pub(crate) fn sizes(&self) -> Result<(u32, u32), MapError> {
        let size = |fd: &OwnedFd, map: MapName| {
            let fd = fd.try_clone().map_err(|source| MapError::Syscall { map, op: "dup", source })?;
            MapData::from_fd(fd)
                .and_then(|m| m.info())
                .map(|i| i.max_entries())
                .map_err(|source| MapError::Aya { map, source })
        };
        Ok((size(&self.services_fd, MapName::Services)?, size(&self.backends_fd, MapName::Backends)?))
    }
}

/// A second descriptor of a hash map or an array (the typed handle made
/// beside it checks which).
fn dup_fd(map: &Map, name: MapName) -> Result<OwnedFd, MapError> {
    let (Map::HashMap(data) | Map::Array(data)) = map else {
        return Err(MapError::Syscall {
            map: name,
            op: "open",
            source: io::Error::other("not a hash map or array; is the eBPF object from this build?"),
        });
    };
    dup_data_fd(data, name)
}

/// A second descriptor of a map.
fn dup_data_fd(data: &MapData, name: MapName) -> Result<OwnedFd, MapError> {
    data.fd().as_fd().try_clone_to_owned().map_err(|source| MapError::Syscall { map: name, op: "dup", source })
}

/// A backend entry as a removal leaves it: its protocol cleared (the
/// programs read an entry of protocol 0 as empty), its address kept, so a
/// reader holding the id sees it empty or whole, never half written.
fn emptied(value: &BackendValue) -> BackendValue {
    BackendValue { proto: 0, ..*value }
}

/// Most entries one batch write carries.
const BATCH: usize = 4096;

/// Most bytes of keys, or of values, one batch write carries: the two lists
/// `write_batches` copies batches into stay within what the allocator
/// keeps per thread for reuse (jemalloc's `tcache_max`, 32 KiB). Larger
/// lists were handed back to the kernel as each write ended (observe/memory.rs)
/// and faulted in again by the next: ~16,000 page faults of a 100,000
/// start's ~130,000 during its first sync. (The second writer of
/// `write_batches_two` and `write_lanes` is a new thread each time, whose
/// cache goes with it: this spares the main thread's.)
const BATCH_BYTES: usize = 32 * 1024;

/// Entries of `K` and `V` one batch write carries.
fn batch_of<K, V>() -> usize {
    (BATCH_BYTES / size_of::<K>().max(size_of::<V>()).max(1)).clamp(1, BATCH)
}

/// Entries of each list from which `write_lanes` (and a write of new
/// backends, `add_backends`) writes the second on a thread of its own (a
/// thread costs tens of microseconds, an insert about one).
const TWO_THREADS_FROM: usize = 256;

/// Writes `entries` to map `fd` in batches; `Ok(false)`: the kernel has no
/// batch writes (nothing was written).
fn write_batches<K, V>(fd: &OwnedFd, map: MapName, entries: &[(K, V)]) -> Result<bool, (usize, MapError)>
where
    K: Copy,
    V: Copy,
{
    let batch = batch_of::<K, V>();
    let mut keys = Vec::with_capacity(entries.len().min(batch));
    let mut values = Vec::with_capacity(entries.len().min(batch));
    for (n, chunk) in entries.chunks(batch).enumerate() {
        let mut start = 0;
        let mut pauses = ENOMEM_PAUSES.iter();
        loop {
            keys.clear();
            values.clear();
            keys.extend(chunk[start..].iter().map(|(k, _)| *k));
            values.extend(chunk[start..].iter().map(|(_, v)| *v));
            let (done, result) = super::sys::map_update_batch(fd.as_fd(), &keys, &values);
            match result {
                Ok(()) => break,
                Err(err) if n == 0 && start == 0 && done == 0 && err.raw_os_error() == Some(libc::EINVAL) => {
                    return Ok(false);
                }
                Err(err) if err.raw_os_error() == Some(libc::ENOMEM) && pauses.len() > 0 => {
                    // A map without preallocation takes its elements from a
                    // per-CPU cache the kernel refills in the background
                    // (GFP_NOWAIT): a burst of inserts can find it empty
                    // for a moment. Go on from where it stopped.
                    let pause = pauses.next().copied().unwrap_or_default();
                    tracing::debug!(map = %map, written = n * batch + start + done, ?pause, "map out of memory for a moment; writing the rest again");
                    start += done;
                    std::thread::sleep(pause);
                }
                Err(err) => {
                    let error = if is_full(&err) {
                        MapError::Full { map }
                    } else {
                        MapError::Syscall { map, op: "bpf_map_update_batch", source: err }
                    };
                    return Err((n * batch + start + done, error));
                }
            }
        }
    }
    Ok(true)
}

/// Runs `first` here and `second` on a thread of its own at once (or
/// after `first` when no thread can be started).
fn at_once<T: Send>(first: impl FnOnce() -> T, second: impl Fn() -> T + Sync) -> [T; 2] {
    std::thread::scope(|scope| {
        let other = std::thread::Builder::new().name("map-writer".into()).spawn_scoped(scope, &second);
        let first = first();
        let second = match other {
            Ok(other) => other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => second(),
        };
        [first, second]
    })
}

/// `write_batches` of two lists at once (`at_once`).
fn write_batches_two<K, V>(
    fd: &OwnedFd,
    map: MapName,
    [first, second]: [&[(K, V)]; 2],
) -> [Result<bool, (usize, MapError)>; 2]
where
    K: Copy + Sync,
    V: Copy + Sync,
{
    at_once(|| write_batches(fd, map, first), || write_batches(fd, map, second))
}

/// The maps a lane of `write_lanes` writes, by descriptor.
struct LaneFds<'a> {
    services: &'a OwnedFd,
    rev_nat: &'a OwnedFd,
    names: &'a OwnedFd,
}

/// `write_batches` of each batch of `lane` in order; `Ok(false)`: the
/// kernel has no batch writes (found at the first, nothing was written:
/// the three maps are hash maps, which take batches on the same kernels).
fn write_lane_batches(fds: &LaneFds<'_>, lane: &[Batch<'_>]) -> Result<bool, (usize, MapError)> {
    let mut done = 0;
    for batch in lane {
        let result = match batch {
            Batch::Services(entries) => write_batches(fds.services, MapName::Services, entries),
            Batch::RevNats(entries) => write_batches(fds.rev_nat, MapName::RevNat, entries),
            Batch::Names(entries) => write_batches(fds.names, MapName::Names, entries),
        };
        match result {
            Ok(true) => done += batch.len(),
            Ok(false) if done == 0 => return Ok(false),
            Ok(false) => {
                let source = io::Error::from_raw_os_error(libc::EINVAL);
                return Err((done, MapError::Syscall { map: batch.map(), op: "bpf_map_update_batch", source }));
            }
            Err((n, error)) => return Err((done + n, error)),
        }
    }
    Ok(true)
}

/// Writes `entries` to map `fd` in batches, or one at a time through `one`
/// on a kernel without batch writes (found at the first batch, then
/// remembered in `batches`); as `ServiceMaps::set_backends`.
fn write_all<K: Copy, V: Copy>(
    batches: &mut bool,
    fd: &OwnedFd,
    map: MapName,
    entries: &[(K, V)],
    one: impl FnMut(K, &V) -> Result<(), MapError>,
) -> Result<(), (usize, MapError)> {
    if *batches && entries.len() > 1 {
        if write_batches(fd, map, entries)? {
            return Ok(());
        }
        *batches = false;
    }
    one_by_one(entries, one)
}

/// Pauses before writing the rest of a batch again after ENOMEM; the
/// failure stands after the last (and the reconciler retries later).
const ENOMEM_PAUSES: [std::time::Duration; 3] =
    [std::time::Duration::from_millis(1), std::time::Duration::from_millis(5), std::time::Duration::from_millis(25)];

/// Entries one batch read asks for at first (grown when a bucket is
/// larger).
const READ_BATCH: usize = 4096;

/// Hands every entry of the hash map `fd` to `each`, read in batches,
/// falling back to `fallback` (one entry at a time through aya) on a
/// kernel without batch reads.
fn read_batched<K: aya::Pod, V: aya::Pod, I: Iterator<Item = Result<(K, V), AyaMapError>>>(
    map: MapName,
    fd: &OwnedFd,
    mut each: impl FnMut(K, V),
    fallback: impl FnOnce() -> I,
) -> Result<(), MapError> {
    match super::sys::for_each_entry::<K, V>(fd.as_fd(), READ_BATCH, &mut each) {
        Ok(true) => Ok(()),
        Ok(false) => {
            for entry in fallback() {
                let (k, v) = entry.map_err(|source| MapError::Aya { map, source })?;
                each(k, v);
            }
            Ok(())
        }
        Err(source) => Err(MapError::Syscall { map, op: "bpf_map_lookup_batch", source }),
    }
}

/// Whether a `BACKENDS` entry is the empty one (protocol 0: a backend
/// always has one).
const fn is_empty_backend(value: &BackendValue) -> bool {
    value.proto == 0
}

/// Whether a write failed because the map holds `max_entries` already
/// (E2BIG from a hash map, and from an array for an index past its end;
/// ENOSPC from some other map types).
fn is_full(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::E2BIG | libc::ENOSPC))
}

fn update_error(map: MapName, err: AyaMapError) -> MapError {
    match err {
        // aya checks an array's index before the kernel does: ids are
        // handed out lowest first, so an id past the end means the array
        // holds as many backends as it can.
        AyaMapError::OutOfBounds { .. } => MapError::Full { map },
        AyaMapError::SyscallError(e) if is_full(&e.io_error) => MapError::Full { map },
        AyaMapError::SyscallError(e) => MapError::Syscall { map, op: e.call, source: e.io_error },
        source => MapError::Aya { map, source },
    }
}

fn delete_result(map: MapName, result: Result<(), AyaMapError>) -> Result<(), MapError> {
    match result {
        Ok(()) | Err(AyaMapError::KeyNotFound | AyaMapError::ElementNotFound) => Ok(()),
        Err(AyaMapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(update_error(map, e)),
    }
}

impl ServiceMaps for KernelMaps {
    fn set_backend(&mut self, id: u32, value: &BackendValue) -> Result<(), MapError> {
        self.backends_written(std::iter::once(id));
        self.backends.set(id, value, 0).map_err(|e| update_error(MapName::Backends, e))
    }

    fn set_backends(&mut self, entries: &[(u32, BackendValue)]) -> Result<(), (usize, MapError)> {
        self.backends_written(entries.iter().map(|(id, _)| *id));
        self.write_backend_entries(entries)
    }

    /// An id that was written before may be named by a reader that has
    /// not let go of a removed backend (a socket memo, a `CT` entry): its
    /// entry is written in two steps, first the new address with protocol
    /// 0 (still empty to a reader), then the protocol alone changes. So a
    /// reader sees the entry empty or whole, never half an address (the
    /// kernel copies an array's value in place, in no set order).
    fn add_backends(&mut self, entries: &[(u32, BackendValue)]) -> Result<(), (usize, MapError)> {
        let fresh_from = self.backends_fresh_from;
        let (at, empty): (Vec<usize>, Vec<(u32, BackendValue)>) = entries
            .iter()
            .enumerate()
            .filter(|(_, (id, _))| *id < fresh_from)
            .map(|(n, (id, value))| (n, (*id, emptied(value))))
            .unzip();
        self.backends_written(entries.iter().map(|(id, _)| *id));
        // A new backend's count starts at 0, whatever its id counted before
        // (a removal clears it too; this covers a count a reader added in
        // between).
        self.clear_active(at.iter().map(|n| entries[*n].0));
        // Up to the first that fails in the first step, written whole.
        let failed = self.write_backend_entries(&empty).err().map(|(i, error)| (at[i], error));
        let upto = failed.as_ref().map_or(entries.len(), |(n, _)| *n);
        self.write_backend_entries_two(&entries[..upto])?;
        failed.map_or(Ok(()), Err)
    }

    /// Clears the entry's protocol and leaves its address (a reader still
    /// holding the id sees it empty, never half written); an id past the
    /// array's end is not there to remove.
    fn remove_backend(&mut self, id: u32, held: &BackendValue) -> Result<(), MapError> {
        if id >= self.backends.len() {
            return Ok(());
        }
        self.backends.set(id, emptied(held), 0).map_err(|e| update_error(MapName::Backends, e))?;
        self.clear_active(std::iter::once(id));
        Ok(())
    }

    fn set_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError> {
        self.services.insert(key, value, 0).map_err(|e| update_error(MapName::Services, e))
    }

    fn set_services(&mut self, entries: &[(ServiceKey, ServiceValue)]) -> Result<(), (usize, MapError)> {
        let Self { batches, services_fd, services, .. } = self;
        write_all(batches, services_fd, MapName::Services, entries, |key, value| {
            services.insert(key, value, 0).map_err(|e| update_error(MapName::Services, e))
        })
    }

    /// Each lane in batches, the second on a thread of its own when both
    /// are long enough to be worth one: the kernel's hash maps take inserts
    /// on several CPUs at once (a lock per bucket, free elements per CPU).
    fn write_lanes(&mut self, lanes: [&[Batch<'_>]; 2]) -> [Result<(), (usize, MapError)>; 2] {
        if !self.batches || lane_len(lanes[0]).min(lane_len(lanes[1])) < TWO_THREADS_FROM {
            return [self.write_lane(lanes[0]), self.write_lane(lanes[1])];
        }
        let fds = LaneFds { services: &self.services_fd, rev_nat: &self.rev_nat_fd, names: &self.names_fd };
        let results = at_once(|| write_lane_batches(&fds, lanes[0]), || write_lane_batches(&fds, lanes[1]));
        // `Ok(false)`: the kernel has no batch writes (nothing written).
        let mut out = [Ok(()), Ok(())];
        for (i, result) in results.into_iter().enumerate() {
            out[i] = match result {
                Ok(true) => Ok(()),
                Ok(false) => {
                    self.batches = false;
                    self.write_lane(lanes[i])
                }
                Err(failed) => Err(failed),
            };
        }
        out
    }

    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), MapError> {
        delete_result(MapName::Services, self.services.remove(key))
    }

    fn set_rev_nat(&mut self, id: RevNatId, value: &RevNat) -> Result<(), MapError> {
        self.rev_nat.insert(id, value, 0).map_err(|e| update_error(MapName::RevNat, e))
    }

    fn set_rev_nats(&mut self, entries: &[(RevNatId, RevNat)]) -> Result<(), (usize, MapError)> {
        let Self { batches, rev_nat_fd, rev_nat, .. } = self;
        write_all(batches, rev_nat_fd, MapName::RevNat, entries, |id, value| {
            rev_nat.insert(id, value, 0).map_err(|e| update_error(MapName::RevNat, e))
        })
    }

    fn remove_rev_nat(&mut self, id: RevNatId) -> Result<(), MapError> {
        delete_result(MapName::RevNat, self.rev_nat.remove(&id))
    }

    fn maglev_size(&self) -> usize {
        self.maglev.size()
    }

    fn set_maglev(&mut self, id: u16, table: &[u32]) -> Result<(), MapError> {
        self.maglev.set(id, table)
    }

    fn remove_maglev(&mut self, id: u16) -> Result<(), MapError> {
        self.maglev.remove(id)
    }

    fn set_source_range(&mut self, rev_nat: RevNatId, net: IpNet) -> Result<(), MapError> {
        self.source_ranges
            .insert(&source_range_key(rev_nat, net), 1, 0)
            .map_err(|e| update_error(MapName::SourceRanges, e))
    }

    fn remove_source_range(&mut self, rev_nat: RevNatId, net: IpNet) -> Result<(), MapError> {
        delete_result(MapName::SourceRanges, self.source_ranges.remove(&source_range_key(rev_nat, net)))
    }

    fn set_name(&mut self, rev_nat: RevNatId, name: &ServiceName) -> Result<(), MapError> {
        self.names.insert(rev_nat, name, 0).map_err(|e| update_error(MapName::Names, e))
    }

    fn set_names(&mut self, entries: &[(RevNatId, ServiceName)]) -> Result<(), (usize, MapError)> {
        let Self { batches, names_fd, names, .. } = self;
        write_all(batches, names_fd, MapName::Names, entries, |id, name| {
            names.insert(id, name, 0).map_err(|e| update_error(MapName::Names, e))
        })
    }

    fn remove_name(&mut self, rev_nat: RevNatId) -> Result<(), MapError> {
        delete_result(MapName::Names, self.names.remove(&rev_nat))
    }

    fn read(&self, map: MapName, each: &mut dyn FnMut(Entry<'_>)) -> Result<(), MapError> {
        match map {
            MapName::Services => read_batched(
                map,
                &self.services_fd,
                |key, value| each(Entry::Service(key, value)),
                || self.services.iter(),
            ),
            MapName::Backends => self.read_backends(each),
            MapName::RevNat => {
                read_batched(map, &self.rev_nat_fd, |id, value| each(Entry::RevNat(id, value)), || self.rev_nat.iter())
            }
            MapName::Names => read_batched(
                map,
                &self.names_fd,
                |id, name: ServiceName| each(Entry::Name(id, &name)),
                || self.names.iter(),
            ),
            MapName::Maglev => self.maglev.for_each_table(|id, table| each(Entry::Maglev(id, table))),
            MapName::SourceRanges => {
                for key in self.source_ranges.keys() {
                    let key = key.map_err(|source| MapError::Aya { map, source })?;
                    if let Some((id, net)) = source_range_of(&key) {
                        each(Entry::SourceRange(id, net));
                    }
                }
                Ok(())
            }
            MapName::ActiveConns | MapName::Ct => Ok(()),
        }
    }

    fn capacity(&self, map: MapName) -> Option<usize> {
        let (services, backends) = self.sizes().ok()?;
        match map {
            MapName::Services => usize::try_from(services).ok(),
            MapName::Backends => usize::try_from(backends).ok(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_copied_into_lists_the_allocator_keeps_for_reuse() {
        /// The most bytes of keys or of values a batch of `K`, `V` copies.
        fn copied<K, V>() -> usize {
            batch_of::<K, V>() * size_of::<K>().max(size_of::<V>())
        }
        // Every kind of entry written in batches.
        for (map, bytes) in [
            ("SERVICES", copied::<ServiceKey, ServiceValue>()),
            ("BACKENDS", copied::<u32, BackendValue>()),
            ("REV_NAT", copied::<RevNatId, RevNat>()),
            ("NAMES", copied::<RevNatId, ServiceName>()),
        ] {
            assert!(bytes <= BATCH_BYTES, "{map}: {bytes} bytes");
            assert!(bytes > BATCH_BYTES / 2, "{map}: batches no smaller than they need be");
        }
        assert_eq!(batch_of::<ServiceKey, ServiceValue>(), 1365, "SERVICES: 24-byte keys, 32 KiB of them");
        assert_eq!(batch_of::<RevNatId, ServiceName>(), 227, "NAMES: 144-byte values, 32 KiB of them");
        assert_eq!(batch_of::<u32, u8>(), BATCH, "small entries: the most a batch carries");
        assert_eq!(batch_of::<[u8; 40_000], u8>(), 1, "an entry larger than the bound: one at a time");
    }
}
