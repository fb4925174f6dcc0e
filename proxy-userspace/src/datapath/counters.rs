//! Per-frontend new-connection counters the programs keep (`CONNECTIONS`,
//! an array with a region of `stride` counters per CPU, indexed by rev-NAT
//! id: see `proxy-ebpf/src/maps.rs`), mapped into the agent's memory: a
//! scrape reads them and a new frontend's are zeroed with no system call.
use proxy_common::RevNatId;
use std::{io, sync::atomic::Ordering};

use aya::{
    maps::{Map, MapData, MapError as AyaMapError, PerCpuArray},
    sys::SyscallError,
};

use super::{mapped::MappedU64s, maps::MapError};

pub struct ConnCounters {
    counts: MappedU64s,
    /// The map itself, held with its mapping.
    _map: Map,
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

/// Regions of `CONNECTIONS`: the highest possible CPU's number plus one
/// (`bpf_get_smp_processor_id` is below it; the possible CPUs may leave
/// gaps).
pub fn possible_cpus() -> io::Result<u32> {
    cpus_in(&std::fs::read_to_string("/sys/devices/system/cpu/possible")?)
}

/// The highest CPU of a kernel CPU list (`0-3,8-11`) plus one.
fn cpus_in(list: &str) -> io::Result<u32> {
    let bad = || io::Error::other(format!("not a CPU list: {list:?}"));
    let mut highest = None;
    for range in list.trim().split(',') {
        let end = range.rsplit('-').next().ok_or_else(bad)?;
        let end: u32 = end.parse().map_err(|_| bad())?;
        highest = highest.max(Some(end));
    }
    highest.and_then(|h| h.checked_add(1)).ok_or_else(bad)
}

impl ConnCounters {
    /// The counters in `map`, a mmapable array of `possible_cpus()`
    /// regions; `zeroed`: the map was just made (not found pinned), so
    /// every count is zero.
    pub fn from_map(map: Map, zeroed: bool) -> Result<Self, MapError> {
        let session = |source| MapError::Session { map: "CONNECTIONS", source };
        let syscall = |call, io_error| session(AyaMapError::SyscallError(SyscallError { call, io_error }));
        let Map::Array(data) = &map else {
            return Err(syscall("open", io::Error::other("not an array; is the eBPF object from this build?")));
        };
        let len = data.info().map_err(session)?.max_entries();
        let cpus = possible_cpus().map_err(|e| syscall("possible CPUs", e))?;
        if len % cpus != 0 {
            return Err(syscall(
                "open",
                io::Error::other(format!("{len} counters are not a region for each of {cpus} CPUs")),
            ));
        }
        let counts = MappedU64s::map(data.fd(), len as usize).map_err(|e| syscall("mmap", e))?;
        Ok(Self { counts, _map: map, cpus, stride: len / cpus, zeroed })
    }

    /// Whether every count is still zero (the map was made by this load),
    /// which holds only until the first ids are handed out: the caller
    /// labels frontends with ids after asking.
    pub const fn take_zeroed(&mut self) -> bool {
        std::mem::replace(&mut self.zeroed, false)
    }

    /// Frontend `id`'s counter on each CPU; an error for an id past the
    /// regions' end.
    fn each_cpu(&self, id: RevNatId) -> io::Result<impl Iterator<Item = &std::sync::atomic::AtomicU64>> {
        let stride = self.stride;
        if id >= stride {
            return Err(io::Error::other(format!("frontend id {id} is past the connection counters' end ({stride})")));
        }
        let counts = self.counts.as_slice();
        Ok((0..self.cpus).map(move |cpu| &counts[(cpu * stride + id) as usize]))
    }

    /// The count of frontend `id`, summed over CPUs.
    pub fn read(&self, id: RevNatId) -> io::Result<u64> {
        Ok(self.each_cpu(id)?.map(|c| c.load(Ordering::Relaxed)).sum())
    }

    /// Zeroes the count of `id` (a rev-NAT id given to a new frontend).
    /// A program counting at that instant may keep its increment or lose
    /// it, as with any write of the map.
    pub fn reset(&mut self, id: RevNatId) -> io::Result<()> {
        self.each_cpu(id)?.for_each(|c| c.store(0, Ordering::Relaxed));
        Ok(())
    }

    /// Zeroes the counts of `ids` (a whole table's frontends at a start);
    /// an id past the end is skipped, and the first such error returned.
    pub fn reset_all(&mut self, ids: &[RevNatId]) -> io::Result<()> {
        let mut first = None;
        for id in ids {
            if let Err(err) = self.reset(*id) {
                first.get_or_insert(err);
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

#[cfg(test)]
mod tests {
    use super::cpus_in;

    #[test]
    fn regions_reach_the_highest_possible_cpu() {
        for (list, cpus) in [("0", 1), ("0-1\n", 2), ("0-3,8-11", 12), ("0,2", 3)] {
            assert_eq!(cpus_in(list).unwrap(), cpus, "{list:?}");
        }
        for list in ["", "a-b", "0-"] {
            assert!(cpus_in(list).is_err(), "{list:?}");
        }
    }
}
