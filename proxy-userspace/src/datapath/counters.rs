//! Per-frontend new-connection counters the programs keep (`CONNECTIONS`,
//! a per-CPU array indexed by rev-NAT id).
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
    pub fn read(&self, id: u16) -> io::Result<u64> {
        Ok(self.map.get(&u32::from(id), 0).map_err(io::Error::other)?.iter().sum())
    }

    /// Zeroes the count of `id` (a rev-NAT id given to a new frontend).
    pub fn reset(&mut self, id: u16) -> io::Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        let zeros = PerCpuValues::try_from(vec![0u64; cpus]).map_err(io::Error::other)?;
        self.map.set(u32::from(id), zeros, 0).map_err(io::Error::other)
    }
}
