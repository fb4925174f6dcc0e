//! Per-frontend new-connection counters the programs keep (`CONNECTIONS`,
//! an array with a region of `stride` counters per CPU, indexed by rev-NAT
//! id: see `proxy-ebpf/src/maps.rs`).
use proxy_common::RevNatId;
use std::{
    io,
    os::fd::{AsFd as _, OwnedFd},
};

use aya::{
    maps::{Array, Map, MapData, MapError as AyaMapError, PerCpuArray},
    sys::SyscallError,
};

use super::maps::MapError;

pub struct ConnCounters {
    map: Array<MapData, u64>,
    /// A second descriptor of the map, for batch writes (which aya lacks).
    fd: OwnedFd,
    /// Possible CPUs: regions of the array.
    cpus: u32,
    /// Counters per region (the array holds `cpus * stride`).
    stride: u32,
    /// Every count is zero: the map was made by this load and no frontend
    /// has been handed an id since (`take_zeroed`).
    zeroed: bool,
}

impl std::fmt::Debug for ConnCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnCounters")
    }
}

/// Entries of a counters array with `stride` counters for each of `cpus`
/// CPUs; `None` past what an array can index.
#[must_use]
pub fn array_size(stride: u32, cpus: u32) -> Option<u32> {
    stride.checked_mul(cpus)
}

/// The possible CPUs (regions of `CONNECTIONS`).
pub fn possible_cpus() -> io::Result<u32> {
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
    u32::try_from(cpus).map_err(io::Error::other)
}

impl ConnCounters {
    /// The counters in `map`, an array of `possible_cpus()` regions;
    /// `zeroed`: the map was just made (not found pinned), so every count
    /// is zero.
    pub fn from_map(map: Map, zeroed: bool) -> Result<Self, MapError> {
        let session = |source| MapError::Session { map: "CONNECTIONS", source };
        let syscall = |call, io_error| session(AyaMapError::SyscallError(SyscallError { call, io_error }));
        let fd = match &map {
            Map::Array(data) => Some(data.fd().as_fd().try_clone_to_owned()),
            _ => None,
        };
        // Fails on a map of another type.
        let map = Array::try_from(map).map_err(session)?;
        let fd = fd.expect("an array").map_err(|e| syscall("dup", e))?;
        let cpus = possible_cpus().map_err(|e| syscall("nr_cpus", e))?;
        let stride = map.len() / cpus;
        Ok(Self { map, fd, cpus, stride, zeroed })
    }

    /// Whether every count is still zero (the map was made by this load),
    /// which holds only until the first ids are handed out: the caller
    /// labels frontends with ids after asking.
    pub const fn take_zeroed(&mut self) -> bool {
        std::mem::replace(&mut self.zeroed, false)
    }

    /// The index of frontend `id`'s counter on each CPU; an error for an
    /// id past the regions' end.
    fn indexes(&self, id: RevNatId) -> io::Result<impl Iterator<Item = u32> + use<>> {
        let stride = self.stride;
        if id >= stride {
            return Err(io::Error::other(format!("frontend id {id} is past the connection counters' end ({stride})")));
        }
        Ok((0..self.cpus).map(move |cpu| cpu * stride + id))
    }

    /// The count of frontend `id`, summed over CPUs.
    pub fn read(&self, id: RevNatId) -> io::Result<u64> {
        self.indexes(id)?.map(|i| self.map.get(&i, 0).map_err(io::Error::other)).sum()
    }

    /// Zeroes the count of `id` (a rev-NAT id given to a new frontend).
    pub fn reset(&mut self, id: RevNatId) -> io::Result<()> {
        for i in self.indexes(id)? {
            self.map.set(i, 0, 0).map_err(io::Error::other)?;
        }
        Ok(())
    }

    /// Zeroes the counts of `ids`, in batches (a whole table's frontends
    /// at a start: 100,000 writes one by one held the sync loop ~0.1 s).
    /// An id past the end is skipped; where a batch stops (a kernel
    /// without batch writes, before 5.6) the rest are zeroed one by one,
    /// each failure skipped. The first error is returned.
    pub fn reset_all(&mut self, ids: &[RevNatId]) -> io::Result<()> {
        const BATCH: usize = 4096;
        let mut first = None;
        let mut indexes = Vec::with_capacity(ids.len() * self.cpus as usize);
        for id in ids {
            match self.indexes(*id) {
                Ok(each) => indexes.extend(each),
                Err(err) => _ = first.get_or_insert(err),
            }
        }
        let zeros = vec![0u64; indexes.len().min(BATCH)];
        for (n, chunk) in indexes.chunks(BATCH).enumerate() {
            if let (done, Err(err)) = super::sys::map_update_batch(self.fd.as_fd(), chunk, &zeros[..chunk.len()]) {
                first.get_or_insert(err);
                for i in &indexes[n * BATCH + done..] {
                    if let Err(err) = self.map.set(*i, 0, 0) {
                        first.get_or_insert(io::Error::other(err));
                    }
                }
                break;
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// What the TC programs did with traffic from outside (`EXTERNAL_STATS`, a
/// per-CPU array indexed by `external_stat`).
pub struct ExternalStats {
    map: PerCpuArray<MapData, u64>,
}

impl std::fmt::Debug for ExternalStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExternalStats")
    }
}

impl ExternalStats {
    pub fn from_map(map: Map) -> Result<Self, MapError> {
        let map = PerCpuArray::try_from(map).map_err(|source| MapError::Session { map: "EXTERNAL_STATS", source })?;
        Ok(Self { map })
    }

    /// Opens the counters pinned at `path` (the agent need not be running).
    pub fn open_pinned(path: &std::path::Path) -> Result<Self, MapError> {
        let data =
            MapData::from_pin(path).map_err(|source| MapError::Open { path: path.display().to_string(), source })?;
        Self::from_map(Map::PerCpuArray(data))
    }

    /// Each counter by name (`external_stat::NAMES`), summed over CPUs.
    pub fn read(&self) -> io::Result<Vec<(&'static str, u64)>> {
        proxy_common::external_stat::NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let index = u32::try_from(i).expect("a few counters");
                Ok((*name, self.map.get(&index, 0).map_err(io::Error::other)?.iter().sum()))
            })
            .collect()
    }
}
