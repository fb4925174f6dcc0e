//! The Maglev tables (`MAGLEV`): table id -> `size` backend ids, one value
//! per table. Its value size (`size * 4`) is chosen at run time, so the
//! agent creates and pins the map before the programs load (they take the
//! pinned map), and reads and writes whole tables with raw calls.
use std::{os::fd::AsFd as _, path::Path};

use aya::maps::MapData;
use proxy_common::map_sizes;

use super::{
    maps::{MapError, MapName},
    sys,
};

/// `BPF_MAP_TYPE_HASH` and `BPF_F_NO_PREALLOC` (linux/bpf.h): tables are
/// allocated as they are written, and replacing one swaps it whole.
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_F_NO_PREALLOC: u32 = 1;

pub(crate) struct MaglevMap {
    map: MapData,
    size: usize,
}

impl std::fmt::Debug for MaglevMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaglevMap").field("size", &self.size).finish_non_exhaustive()
    }
}

fn syscall(op: &'static str) -> impl Fn(std::io::Error) -> MapError {
    move |source| MapError::Syscall { map: MapName::Maglev, op, source }
}

impl MaglevMap {
    /// The map pinned at `path`, made and pinned first when there is none.
    pub(crate) fn open_or_create(path: &Path, size: usize) -> Result<Self, MapError> {
        if path.exists() {
            let this = Self::open(path)?;
            if this.size != size {
                return Err(MapError::Open {
                    path: path.display().to_string(),
                    source: aya::maps::MapError::InvalidValueSize { size: size * 4, expected: this.size * 4 },
                });
            }
            return Ok(this);
        }
        let value_size = u32::try_from(size * 4).expect("table sizes are small");
        let obj = aya_obj::Map::new_from_params(BPF_MAP_TYPE_HASH, 4, value_size, map_sizes::MAGLEV, BPF_F_NO_PREALLOC);
        let map = MapData::create(obj, proxy_common::map_names::MAGLEV, None)
            .map_err(|source| MapError::Aya { map: MapName::Maglev, source })?;
        map.pin(path).map_err(|e| MapError::Open {
            path: path.display().to_string(),
            source: aya::maps::MapError::PinError { name: Some("MAGLEV".into()), error: e },
        })?;
        Ok(Self { map, size })
    }

    /// The map pinned at `path`; its table size is read from the kernel.
    pub(crate) fn open(path: &Path) -> Result<Self, MapError> {
        let open_err = |source| MapError::Open { path: path.display().to_string(), source };
        let map = MapData::from_pin(path).map_err(open_err)?;
        let info = map.info().map_err(open_err)?;
        Ok(Self { map, size: info.value_size() as usize / 4 })
    }

    /// Entries of each table.
    #[must_use]
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Writes table `id` (exactly `size` entries); readers see the old
    /// table or the new one, never a mix.
    pub(crate) fn set(&mut self, id: u16, table: &[u32]) -> Result<(), MapError> {
        assert_eq!(table.len(), self.size, "a Maglev table of the map's size");
        let value: Vec<u8> = table.iter().flat_map(|e| e.to_ne_bytes()).collect();
        sys::map_update(self.map.fd().as_fd(), &u32::from(id).to_ne_bytes(), &value).map_err(|source| {
            if source.raw_os_error() == Some(libc::E2BIG) || source.raw_os_error() == Some(libc::ENOMEM) {
                MapError::Full { map: MapName::Maglev }
            } else {
                syscall("update")(source)
            }
        })
    }

    /// Deletes table `id` (a missing one is success).
    pub(crate) fn remove(&mut self, id: u16) -> Result<(), MapError> {
        sys::map_delete(self.map.fd().as_fd(), &u32::from(id).to_ne_bytes()).map_err(syscall("delete"))
    }

    /// Hands every table to `each`, one at a time (only one is held).
    pub(crate) fn for_each_table(&self, mut each: impl FnMut(u16, &[u32])) -> Result<(), MapError> {
        let fd = self.map.fd().as_fd();
        let mut key = [0u8; 4];
        let mut value = vec![0u8; self.size * 4];
        let mut table = Vec::with_capacity(self.size);
        let mut first = true;
        loop {
            let mut next = [0u8; 4];
            let more = sys::map_next_key(fd, (!first).then_some(&key[..]), &mut next).map_err(syscall("next key"))?;
            if !more {
                return Ok(());
            }
            first = false;
            key = next;
            if sys::map_lookup(fd, &key, &mut value).map_err(syscall("lookup"))? {
                table.clear();
                table.extend(value.chunks_exact(4).map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])));
                if let Ok(id) = u16::try_from(u32::from_ne_bytes(key)) {
                    each(id, &table);
                }
            }
        }
    }
}
