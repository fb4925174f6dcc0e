//! Per-frontend new-connection counters the programs keep (`CONNECTIONS`,
//! a per-CPU array indexed by rev-NAT id).
use proxy_common::RevNatId;
use std::{
    io,
    os::fd::{AsFd as _, OwnedFd},
};

use aya::{
    maps::{Map, MapData, MapError as AyaMapError, PerCpuArray, PerCpuValues},
    sys::SyscallError,
};

use super::maps::MapError;

pub struct ConnCounters {
    map: PerCpuArray<MapData, u64>,
    /// A second descriptor of the map, for batch writes (which aya lacks).
    fd: OwnedFd,
    /// Possible CPUs: values per id.
    cpus: usize,
    /// Every count is zero: the map was made by this load and no frontend
    /// has been handed an id since (`take_zeroed`).
    zeroed: bool,
}

impl std::fmt::Debug for ConnCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnCounters")
    }
}

impl ConnCounters {
    /// The counters in `map`; `zeroed`: the map was just made (not found
    /// pinned), so every count is zero.
    pub fn from_map(map: Map, zeroed: bool) -> Result<Self, MapError> {
        let session = |source| MapError::Session { map: "CONNECTIONS", source };
        let syscall = |call, io_error| session(AyaMapError::SyscallError(SyscallError { call, io_error }));
        let fd = match &map {
            Map::PerCpuArray(data) => Some(data.fd().as_fd().try_clone_to_owned()),
            _ => None,
        };
        // Fails on a map of another type.
        let map = PerCpuArray::try_from(map).map_err(session)?;
        let fd = fd.expect("a per-CPU array").map_err(|e| syscall("dup", e))?;
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| syscall("nr_cpus", e))?;
        Ok(Self { map, fd, cpus, zeroed })
    }

    /// Whether every count is still zero (the map was made by this load),
    /// which holds only until the first ids are handed out: the caller
    /// labels frontends with ids after asking.
    pub const fn take_zeroed(&mut self) -> bool {
        std::mem::replace(&mut self.zeroed, false)
    }

    /// The count of frontend `id`, summed over CPUs.
    pub fn read(&self, id: RevNatId) -> io::Result<u64> {
        Ok(self.map.get(&id, 0).map_err(io::Error::other)?.iter().sum())
    }

    /// Zeroes the count of `id` (a rev-NAT id given to a new frontend).
    pub fn reset(&mut self, id: RevNatId) -> io::Result<()> {
        let zeros = PerCpuValues::try_from(vec![0u64; self.cpus]).map_err(io::Error::other)?;
        self.map.set(id, zeros, 0).map_err(io::Error::other)
    }

    /// Zeroes the counts of `ids`, in batches (a whole table's frontends
    /// at a start: 100,000 writes one by one held the sync loop ~0.1 s).
    /// Where a batch stops (a kernel without batch writes, before 5.6; an
    /// id the map refuses) the rest are zeroed one by one, each failure
    /// skipped; the first error is returned.
    pub fn reset_all(&mut self, ids: &[RevNatId]) -> io::Result<()> {
        const BATCH: usize = 4096;
        let zeros = vec![0u64; ids.len().min(BATCH) * self.cpus];
        for (n, chunk) in ids.chunks(BATCH).enumerate() {
            let values = &zeros[..chunk.len() * self.cpus];
            if let (done, Err(err)) = super::sys::map_update_batch_per_cpu(self.fd.as_fd(), chunk, values, self.cpus) {
                let mut first = Some(err);
                for id in &ids[n * BATCH + done..] {
                    if let Err(err) = self.reset(*id) {
                        first.get_or_insert(err);
                    }
                }
                return first.map_or(Ok(()), Err);
            }
        }
        Ok(())
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
