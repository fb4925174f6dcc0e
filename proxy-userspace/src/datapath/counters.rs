//! Per-frontend new-connection counters the programs keep (`CONNECTIONS`,
//! a per-CPU array indexed by rev-NAT id).
use proxy_common::RevNatId;
use std::io;

use aya::maps::{Map, MapData, PerCpuArray, PerCpuValues};

use super::maps::MapError;

pub struct ConnCounters {
    map: PerCpuArray<MapData, u64>,
}

impl std::fmt::Debug for ConnCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnCounters")
    }
}

impl ConnCounters {
    pub fn from_map(map: Map) -> Result<Self, MapError> {
        let map = PerCpuArray::try_from(map).map_err(|source| MapError::Session { map: "CONNECTIONS", source })?;
        Ok(Self { map })
    }

    /// The count of frontend `id`, summed over CPUs.
    pub fn read(&self, id: RevNatId) -> io::Result<u64> {
        Ok(self.map.get(&id, 0).map_err(io::Error::other)?.iter().sum())
    }

    /// Zeroes the count of `id` (a rev-NAT id given to a new frontend).
    pub fn reset(&mut self, id: RevNatId) -> io::Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        let zeros = PerCpuValues::try_from(vec![0u64; cpus]).map_err(io::Error::other)?;
        self.map.set(id, zeros, 0).map_err(io::Error::other)
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
