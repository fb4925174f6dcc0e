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

/// Counters one batch call reads or zeroes.
const BATCH: usize = 4096;

/// The per-frontend connection counters (`CONNECTIONS`), per CPU.
pub struct ConnCounters {
    map: Array<MapData, u64>,
    /// A second descriptor of the map, for batch reads and writes (which
    /// aya lacks).
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
        let cpus = possible_cpus().map_err(|e| syscall("possible CPUs", e))?;
        if map.len() % cpus != 0 {
            let error = io::Error::other(format!("{} counters are not a region for each of {cpus} CPUs", map.len()));
            return Err(syscall("open", error));
        }
        let stride = map.len() / cpus;
        Ok(Self { map, fd, cpus, stride, zeroed })
    }

    /// Whether every count is still zero (the map was made by this load),
    /// which holds only until the first ids are handed out: the caller
    /// labels frontends with ids after asking.
    pub(crate) const fn take_zeroed(&mut self) -> bool {
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

    /// The counts of `ids`, summed over CPUs: each
    /// CPU's region is read over the ids' range, a batch call per 4,096
    /// counters, where one call per id and CPU made a scrape of 1,000
    /// frontends on 96 CPUs 96,000 system calls. `None` for an id past the
    /// end, or when a read fails.
    #[must_use]
    pub fn read_all(&self, ids: &[RevNatId]) -> Vec<Option<u64>> {
        let inside = || ids.iter().copied().filter(|id| *id < self.stride);
        let (Some(first), Some(last)) = (inside().min(), inside().max()) else {
            return vec![None; ids.len()];
        };
        let mut sums = vec![0u64; (last - first) as usize + 1];
        let mut region = vec![0u64; BATCH.min(sums.len())];
        for cpu in 0..self.cpus {
            for (n, part) in sums.chunks_mut(BATCH).enumerate() {
                let start = cpu * self.stride + first + u32::try_from(n * BATCH).expect("below the stride");
                let values = &mut region[..part.len()];
                if !matches!(super::sys::read_u64_range(self.fd.as_fd(), start, values), Ok(true)) {
                    // No batch reads (before 5.6), or a failure: one at a time.
                    return ids.iter().map(|id| self.read(*id).ok()).collect();
                }
                part.iter_mut().zip(values.iter()).for_each(|(sum, v)| *sum += v);
            }
        }
        ids.iter().map(|id| (first..=last).contains(id).then(|| sums[(id - first) as usize])).collect()
    }

    /// Zeroes the counts of `ids`, in batches of 4,096 counters (a whole
    /// table's frontends at a start: one write each would hold the sync
    /// loop, and the next change with it). An id past the end is skipped; where a batch
    /// stops its counters are zeroed one by one, each failure skipped, and
    /// on a kernel without batch writes (before 5.6) all are. The first
    /// error is returned.
    pub fn reset_all(&mut self, ids: &[RevNatId]) -> io::Result<()> {
        let per_batch = (BATCH / self.cpus as usize).max(1);
        let zeros = vec![0u64; per_batch * self.cpus as usize];
        let mut indexes = Vec::with_capacity(zeros.len());
        let mut first = None;
        let mut batches = true;
        for chunk in ids.chunks(per_batch) {
            indexes.clear();
            for id in chunk {
                match self.indexes(*id) {
                    Ok(each) => indexes.extend(each),
                    Err(err) => _ = first.get_or_insert(err),
                }
            }
            if indexes.is_empty() {
                continue;
            }
            // How many the batch zeroed (the rest go one at a time).
            let mut done = 0;
            if batches {
                match super::sys::map_update_batch(self.fd.as_fd(), &indexes, &zeros[..indexes.len()]) {
                    (_, Ok(())) => continue,
                    // No batch writes here: one at a time from now on.
                    (0, Err(err)) if err.raw_os_error() == Some(libc::EINVAL) => batches = false,
                    (n, Err(err)) => {
                        done = n;
                        first.get_or_insert(err);
                    }
                }
            }
            for i in &indexes[done..] {
                if let Err(err) = self.map.set(*i, 0, 0) {
                    first.get_or_insert(io::Error::other(err));
                }
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
    pub(crate) fn from_map(map: Map) -> Result<Self, MapError> {
        let map = PerCpuArray::try_from(map).map_err(|source| MapError::Session { map: "EXTERNAL_STATS", source })?;
        Ok(Self { map })
    }

    /// Opens the counters pinned at `path` (the agent need not be running).
    pub fn open_pinned(path: &std::path::Path) -> Result<Self, MapError> {
        let data =
            MapData::from_pin(path).map_err(|source| MapError::Open { path: path.display().to_string(), source })?;
        Self::from_map(Map::PerCpuArray(data))
    }

    /// Each counter of traffic from outside by name
    /// (`external_stat::NAMES`), summed over CPUs.
    pub fn read(&self) -> io::Result<Vec<(&'static str, u64)>> {
        self.read_from(0)
    }

    /// The same counters for the pods' own traffic, translated per packet
    /// on pod-facing devices (`external_stat::POD_BASE`).
    pub fn read_pods(&self) -> io::Result<Vec<(&'static str, u64)>> {
        self.read_from(proxy_common::external_stat::POD_BASE)
    }

    fn read_from(&self, base: u32) -> io::Result<Vec<(&'static str, u64)>> {
        proxy_common::external_stat::NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let index = base + u32::try_from(i).expect("a few counters");
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
