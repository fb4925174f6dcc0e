//! `SERVICE_NAMES`: rev-NAT id -> the service port of the frontend, pinned
//! beside the other maps so `ebpf-proxy service` names services with the
//! agent stopped. The programs never read it: the agent creates and pins
//! it itself (it is not in the eBPF object). `codec` encodes and decodes
//! the values.
use std::path::Path;

use aya::maps::{HashMap, Map, MapData};
use proxy_common::{RevNatId, ServiceName, map_names};

use super::maps::{MapError, MapName};

/// `BPF_MAP_TYPE_HASH` and `BPF_F_NO_PREALLOC` (linux/bpf.h).
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_F_NO_PREALLOC: u32 = 1;

/// The map pinned at `path`, made (of `size` entries) and pinned first when
/// there is none; a pin of another key or value size is refused.
pub(crate) fn open_or_create(path: &Path, size: u32) -> Result<HashMap<MapData, RevNatId, ServiceName>, MapError> {
    let open_err = |source| MapError::Open { path: path.display().to_string(), source };
    let map = if path.exists() {
        MapData::from_pin(path).map_err(open_err)?
    } else {
        let map = create(size)?;
        map.pin(path).map_err(|e| {
            open_err(aya::maps::MapError::PinError { name: Some(map_names::SERVICE_NAMES.into()), error: e })
        })?;
        map
    };
    typed(map, path)
}

/// The map pinned at `path` for a reader (`service list`, `status`,
/// `explain`), which must not pin anything: with no pin (maps left by an
/// agent stopped before it made this one) an empty unpinned map, so every
/// service shows without its name.
pub(crate) fn open_for_reading(path: &Path) -> Result<HashMap<MapData, RevNatId, ServiceName>, MapError> {
    let map = if path.exists() {
        MapData::from_pin(path).map_err(|source| MapError::Open { path: path.display().to_string(), source })?
    } else {
        create(1)?
    };
    typed(map, path)
}

/// A new, unpinned `SERVICE_NAMES` of `size` entries.
fn create(size: u32) -> Result<MapData, MapError> {
    let obj = aya_obj::Map::new_from_params(
        BPF_MAP_TYPE_HASH,
        u32::try_from(size_of::<RevNatId>()).expect("small"),
        u32::try_from(size_of::<ServiceName>()).expect("small"),
        size,
        BPF_F_NO_PREALLOC,
    );
    MapData::create(obj, map_names::SERVICE_NAMES, None).map_err(|source| MapError::Aya { map: MapName::Names, source })
}

fn typed(map: MapData, path: &Path) -> Result<HashMap<MapData, RevNatId, ServiceName>, MapError> {
    // aya checks the key and value sizes against the types here.
    HashMap::try_from(Map::HashMap(map)).map_err(|source| MapError::Open { path: path.display().to_string(), source })
}
