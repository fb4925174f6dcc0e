//! The maps, pinned by name so that a restarted agent finds them again.
use aya_ebpf::{macros::map, maps::HashMap};
use proxy_common::{BackendV4, RevNatV4, ServiceKeyV4, ServiceValue, map_sizes};

#[map]
pub static SERVICES_V4: HashMap<ServiceKeyV4, ServiceValue> = HashMap::pinned(map_sizes::SERVICES, 0);

#[map]
pub static BACKENDS_V4: HashMap<u32, BackendV4> = HashMap::pinned(map_sizes::BACKENDS, 0);

#[map]
pub static REVNAT_V4: HashMap<u16, RevNatV4> = HashMap::pinned(map_sizes::REVNAT, 0);

#[inline(always)]
pub fn service_v4(key: &ServiceKeyV4) -> Option<ServiceValue> {
    // SAFETY: the value is copied out at once; a concurrent update of the
    // entry can at worst give a torn read of plain integers, never a dangling
    // reference.
    unsafe { SERVICES_V4.get(key) }.copied()
}

#[inline(always)]
pub fn backend_v4(id: u32) -> Option<BackendV4> {
    // SAFETY: as in `service_v4`.
    unsafe { BACKENDS_V4.get(id) }.copied()
}
