//! The error of a map operation, and which map it was on: shared by the
//! service maps (`maps`) and the Maglev map (`maglev_map`), which each
//! other use, so neither owns it.
use std::io;

use aya::maps::MapError as AyaMapError;
use proxy_common::map_names;

/// Which map an operation was on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapName {
    /// `SERVICES`.
    Services,
    /// `BACKENDS`.
    Backends,
    /// `REVNAT`.
    RevNat,
    /// `MAGLEV`.
    Maglev,
    /// `SOURCE_RANGES`.
    SourceRanges,
    /// `SERVICE_NAMES`.
    Names,
    /// `ACTIVE_CONNS`.
    ActiveConns,
    /// `CT`.
    Ct,
}

impl MapName {
    #[must_use]
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Services => map_names::SERVICES,
            Self::Backends => map_names::BACKENDS,
            Self::RevNat => map_names::REVNAT,
            Self::Maglev => map_names::MAGLEV,
            Self::SourceRanges => map_names::SOURCE_RANGES,
            Self::Names => map_names::SERVICE_NAMES,
            Self::ActiveConns => map_names::ACTIVE_CONNS,
            Self::Ct => map_names::CT,
        }
    }
}

impl std::fmt::Display for MapName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl MapError {
    /// The map the operation was on, by its name.
    #[must_use]
    pub(crate) const fn map_name(&self) -> &'static str {
        match self {
            Self::Full { map } | Self::Syscall { map, .. } | Self::Aya { map, .. } => map.as_str(),
            Self::Session { map, .. } => map,
            Self::Open { .. } => "(pinned map)",
        }
    }
}

/// A map operation that failed.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs, reason = "each field is named in its variant's #[error] message")]
pub enum MapError {
    /// The map is full.
    #[error("map {map} is full; raise its size (see --help) or reduce the services")]
    Full { map: MapName },
    /// A syscall on the map failed.
    #[error("{op} on map {map} failed: {source}")]
    Syscall { map: MapName, op: &'static str, source: io::Error },
    /// aya refused the operation.
    #[error("map {map}: {source}")]
    Aya { map: MapName, source: AyaMapError },
    /// An operation on a session map failed.
    #[error("session map {map}: {source}")]
    Session { map: &'static str, source: AyaMapError },
    /// A pinned map cannot be opened.
    #[error("pinned map {path} cannot be opened: {source}; is the agent's --bpffs-dir right?")]
    Open { path: String, source: AyaMapError },
}
