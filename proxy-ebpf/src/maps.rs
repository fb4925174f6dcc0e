//! The maps, pinned by name so that a restarted agent finds them again.
//! Addresses are 16 bytes for both families (IPv4 as IPv4-mapped IPv6).
use aya_ebpf::{
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use proxy_common::{
    AffinityKey, AffinityValue, Backend, RevNat, ServiceKey, ServiceValue, SockBackendKey, SockRevNat, SockRevNatKey,
    map_sizes,
};

#[map]
pub static SERVICES: HashMap<ServiceKey, ServiceValue> = HashMap::pinned(map_sizes::SERVICES, 0);

#[map]
pub static BACKENDS: HashMap<u32, Backend> = HashMap::pinned(map_sizes::BACKENDS, 0);

#[map]
pub static REVNAT: HashMap<u16, RevNat> = HashMap::pinned(map_sizes::REVNAT, 0);

#[map]
pub static SOCK_REVNAT: LruHashMap<SockRevNatKey, SockRevNat> = LruHashMap::pinned(map_sizes::SOCK_REVNAT, 0);

#[map]
pub static SOCK_BACKEND: LruHashMap<SockBackendKey, u32> = LruHashMap::pinned(map_sizes::SOCK_BACKEND, 0);

#[map]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(map_sizes::AFFINITY, 0);

/// New connections (and first datagrams of unconnected UDP sockets) per
/// frontend, indexed by its rev-NAT id; per CPU, so no atomics.
#[map]
pub static CONNECTIONS: PerCpuArray<u64> = PerCpuArray::pinned(map_sizes::CONNECTIONS, 0);

#[inline(always)]
pub fn count_connection(rev_nat: u16) {
    if let Some(counter) = CONNECTIONS.get_ptr_mut(u32::from(rev_nat)) {
        // SAFETY: this CPU's slot of a per-CPU array; a program runs to its
        // end on one CPU, so nothing else writes it meanwhile.
        unsafe { *counter += 1 };
    }
}

// SAFETY (all lookups below): values are copied out at once; a concurrent
// update can at worst give a torn read of plain integers, never a dangling
// reference. Inserts fail only when a non-LRU map is full; then the
// translation goes on without the memo, which is what the caller wants.

#[inline(always)]
pub fn service(key: &ServiceKey) -> Option<ServiceValue> {
    unsafe { SERVICES.get(key) }.copied()
}

#[inline(always)]
pub fn backend(id: u32) -> Option<Backend> {
    unsafe { BACKENDS.get(id) }.copied()
}

#[inline(always)]
pub fn sock_revnat(key: &SockRevNatKey) -> Option<SockRevNat> {
    unsafe { SOCK_REVNAT.get(key) }.copied()
}

#[inline(always)]
pub fn remember_sock_revnat(key: &SockRevNatKey, value: &SockRevNat) {
    let _ = SOCK_REVNAT.insert(key, value, 0);
}

#[inline(always)]
pub fn sock_backend(key: &SockBackendKey) -> Option<u32> {
    unsafe { SOCK_BACKEND.get(key) }.copied()
}

#[inline(always)]
pub fn remember_sock_backend(key: &SockBackendKey, backend_id: u32) {
    let _ = SOCK_BACKEND.insert(key, &backend_id, 0);
}

#[inline(always)]
pub fn affinity(key: &AffinityKey) -> Option<AffinityValue> {
    unsafe { AFFINITY.get(key) }.copied()
}

#[inline(always)]
pub fn remember_affinity(key: &AffinityKey, value: &AffinityValue) {
    let _ = AFFINITY.insert(key, value, 0);
}
