//! The maps, pinned by name so that a restarted agent finds them again.
use aya_ebpf::{
    macros::map,
    maps::{HashMap, LruHashMap},
};
use proxy_common::{
    AffinityKey, AffinityValue, BackendV4, RevNatV4, ServiceKeyV4, ServiceValue, SockBackendKeyV4, SockRevNatKeyV4,
    SockRevNatV4, map_sizes,
};

#[map]
pub static SERVICES_V4: HashMap<ServiceKeyV4, ServiceValue> = HashMap::pinned(map_sizes::SERVICES, 0);

#[map]
pub static BACKENDS_V4: HashMap<u32, BackendV4> = HashMap::pinned(map_sizes::BACKENDS, 0);

#[map]
pub static REVNAT_V4: HashMap<u16, RevNatV4> = HashMap::pinned(map_sizes::REVNAT, 0);

#[map]
pub static SOCK_REVNAT_V4: LruHashMap<SockRevNatKeyV4, SockRevNatV4> = LruHashMap::pinned(map_sizes::SOCK_REVNAT, 0);

#[map]
pub static SOCK_BACKEND_V4: LruHashMap<SockBackendKeyV4, u32> = LruHashMap::pinned(map_sizes::SOCK_BACKEND, 0);

#[map]
pub static AFFINITY_V4: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(map_sizes::AFFINITY, 0);

// SAFETY (all lookups below): values are copied out at once; a concurrent
// update can at worst give a torn read of plain integers, never a dangling
// reference. Inserts fail only when a non-LRU map is full; then the
// translation goes on without the memo, which is what the caller wants.

#[inline(always)]
pub fn service_v4(key: &ServiceKeyV4) -> Option<ServiceValue> {
    unsafe { SERVICES_V4.get(key) }.copied()
}

#[inline(always)]
pub fn backend_v4(id: u32) -> Option<BackendV4> {
    unsafe { BACKENDS_V4.get(id) }.copied()
}

#[inline(always)]
pub fn sock_revnat_v4(key: &SockRevNatKeyV4) -> Option<SockRevNatV4> {
    unsafe { SOCK_REVNAT_V4.get(key) }.copied()
}

#[inline(always)]
pub fn remember_sock_revnat_v4(key: &SockRevNatKeyV4, value: &SockRevNatV4) {
    let _ = SOCK_REVNAT_V4.insert(key, value, 0);
}

#[inline(always)]
pub fn sock_backend_v4(key: &SockBackendKeyV4) -> Option<u32> {
    unsafe { SOCK_BACKEND_V4.get(key) }.copied()
}

#[inline(always)]
pub fn remember_sock_backend_v4(key: &SockBackendKeyV4, backend_id: u32) {
    let _ = SOCK_BACKEND_V4.insert(key, &backend_id, 0);
}

#[inline(always)]
pub fn affinity_v4(key: &AffinityKey) -> Option<AffinityValue> {
    unsafe { AFFINITY_V4.get(key) }.copied()
}

#[inline(always)]
pub fn remember_affinity_v4(key: &AffinityKey, value: &AffinityValue) {
    let _ = AFFINITY_V4.insert(key, value, 0);
}
