//! The service maps behind a trait: the kernel implementation here, a fake
//! one for the reconciler's tests. Every operation is idempotent: writing
//! the same value twice or deleting a missing key is success.
use std::{collections::BTreeMap, io, path::Path};

use aya::maps::{HashMap, Map, MapData, MapError as AyaMapError};
use proxy_common::{Backend as BackendValue, RevNat, ServiceKey, ServiceValue, map_names};

/// Which map an operation was on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapName {
    Services,
    Backends,
    RevNat,
}

impl MapName {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Services => map_names::SERVICES,
            Self::Backends => map_names::BACKENDS,
            Self::RevNat => map_names::REVNAT,
        }
    }
}

impl std::fmt::Display for MapName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("map {map} is full; raise its size (see --help) or reduce the services")]
    Full { map: MapName },
    #[error("{op} on map {map} failed: {source}")]
    Syscall { map: MapName, op: &'static str, source: io::Error },
    #[error("map {map}: {source}")]
    Aya { map: MapName, source: AyaMapError },
    #[error("session map {map}: {source}")]
    Session { map: &'static str, source: AyaMapError },
    #[error("pinned map {path} cannot be opened: {source}; is the agent's --bpffs-dir right?")]
    Open { path: String, source: AyaMapError },
}

/// Every entry of the three maps, for recovery and inspection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dump {
    pub services: BTreeMap<ServiceKey, ServiceValue>,
    pub backends: BTreeMap<u32, BackendValue>,
    pub rev_nat: BTreeMap<u16, RevNat>,
}

pub trait ServiceMaps {
    fn set_backend(&mut self, id: u32, value: &BackendValue) -> Result<(), MapError>;
    fn remove_backend(&mut self, id: u32) -> Result<(), MapError>;
    fn set_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError>;
    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), MapError>;
    fn set_rev_nat(&mut self, id: u16, value: &RevNat) -> Result<(), MapError>;
    fn remove_rev_nat(&mut self, id: u16) -> Result<(), MapError>;
    fn dump(&self) -> Result<Dump, MapError>;
}

/// The maps in the kernel, through aya.
pub struct KernelMaps {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: HashMap<MapData, u32, BackendValue>,
    rev_nat: HashMap<MapData, u16, RevNat>,
}

impl KernelMaps {
    /// Takes the maps out of a loaded object.
    pub fn from_maps(services: Map, backends: Map, rev_nat: Map) -> Result<Self, MapError> {
        Ok(Self {
            services: HashMap::try_from(services).map_err(|source| MapError::Aya { map: MapName::Services, source })?,
            backends: HashMap::try_from(backends).map_err(|source| MapError::Aya { map: MapName::Backends, source })?,
            rev_nat: HashMap::try_from(rev_nat).map_err(|source| MapError::Aya { map: MapName::RevNat, source })?,
        })
    }

    /// Opens the maps pinned in `dir` (the agent need not be running).
    pub fn open_pinned(dir: &Path) -> Result<Self, MapError> {
        let open = |name: &str| {
            let path = dir.join(name);
            MapData::from_pin(&path)
                .map(Map::HashMap)
                .map_err(|source| MapError::Open { path: path.display().to_string(), source })
        };
        Self::from_maps(open(map_names::SERVICES)?, open(map_names::BACKENDS)?, open(map_names::REVNAT)?)
    }
}

fn update_error(map: MapName, err: AyaMapError) -> MapError {
    match err {
        AyaMapError::SyscallError(e) if e.io_error.raw_os_error() == Some(libc::E2BIG) => MapError::Full { map },
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

fn collect<K: Ord, V>(
    map: MapName,
    iter: impl Iterator<Item = Result<(K, V), AyaMapError>>,
) -> Result<BTreeMap<K, V>, MapError> {
    iter.collect::<Result<_, _>>().map_err(|source| MapError::Aya { map, source })
}

impl ServiceMaps for KernelMaps {
    fn set_backend(&mut self, id: u32, value: &BackendValue) -> Result<(), MapError> {
        self.backends.insert(id, value, 0).map_err(|e| update_error(MapName::Backends, e))
    }

    fn remove_backend(&mut self, id: u32) -> Result<(), MapError> {
        delete_result(MapName::Backends, self.backends.remove(&id))
    }

    fn set_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError> {
        self.services.insert(key, value, 0).map_err(|e| update_error(MapName::Services, e))
    }

    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), MapError> {
        delete_result(MapName::Services, self.services.remove(key))
    }

    fn set_rev_nat(&mut self, id: u16, value: &RevNat) -> Result<(), MapError> {
        self.rev_nat.insert(id, value, 0).map_err(|e| update_error(MapName::RevNat, e))
    }

    fn remove_rev_nat(&mut self, id: u16) -> Result<(), MapError> {
        delete_result(MapName::RevNat, self.rev_nat.remove(&id))
    }

    fn dump(&self) -> Result<Dump, MapError> {
        Ok(Dump {
            services: collect(MapName::Services, self.services.iter())?,
            backends: collect(MapName::Backends, self.backends.iter())?,
            rev_nat: collect(MapName::RevNat, self.rev_nat.iter())?,
        })
    }
}
