//! The maps, pinned by name so that a restarted agent finds them again.
//! Addresses are 16 bytes for both families (IPv4 as IPv4-mapped IPv6).
//! The programs reach them only through the thin accessors below, which
//! hold the `unsafe` of map access (with `access.rs`, the only `unsafe`
//! code): lookups copy the value out, in-place updates go through
//! `ct_update`.
use aya_ebpf::{
    bindings::{BPF_EXIST, BPF_F_MMAPABLE, BPF_F_NO_PREALLOC, BPF_NOEXIST},
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray, lpm_trie::Key},
    programs::TcContext,
};
use proxy_common::{
    AffinityKey, AffinityValue, Backend, CtKey, CtValue, OutsideHandover, RevNat, RevNatId, SOURCE_RANGE_ID_BITS,
    ServiceKey, ServiceValue, SockBackendKey, SockConn, SockRevNat, SockRevNatKey, SourceRange, external_stat,
    map_sizes,
};

/// Entries are allocated as they are written (BPF_F_NO_PREALLOC): the
/// size is a ceiling, not memory taken up front.
#[map]
pub static SERVICES: HashMap<ServiceKey, ServiceValue> = HashMap::pinned(map_sizes::SERVICES, BPF_F_NO_PREALLOC);

/// Indexed by backend id (the agent hands ids out lowest first, so they
/// are dense): an array takes a write at a fraction of a hash insert's
/// cost and its lookups are inlined. An entry with protocol 0 is empty
/// (`backend`): the agent clears the protocol where it would delete, and
/// writes an entry so that a reader sees it empty or whole (docs/design.md,
/// "Map layout").
#[map]
pub static BACKENDS: Array<Backend> = Array::pinned(map_sizes::BACKENDS, 0);

/// Allocated as used, like `SERVICES`.
#[map]
pub static REVNAT: HashMap<RevNatId, RevNat> = HashMap::pinned(map_sizes::REVNAT, BPF_F_NO_PREALLOC);

#[map]
pub static SOCK_REVNAT: LruHashMap<SockRevNatKey, SockRevNat> = LruHashMap::pinned(map_sizes::SOCK_REVNAT, 0);

#[map]
pub static SOCK_BACKEND: LruHashMap<SockBackendKey, u32> = LruHashMap::pinned(map_sizes::SOCK_BACKEND, 0);

#[map]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(map_sizes::AFFINITY, 0);

/// New connections (and first datagrams of unconnected UDP sockets) per
/// frontend: a region of `CONNECTIONS_STRIDE` counters per CPU, indexed
/// by rev-NAT id (`count_connection`); each CPU writes its own region, so
/// no atomics, and CPUs share a cache line only at a region's edge. A
/// plain array, not a per-CPU one:
/// the kernel makes it in one allocation, where a per-CPU array allocates
/// each element's per-CPU memory alone, on the first sync's path.
#[map]
pub static CONNECTIONS: Array<u64> = Array::pinned(map_sizes::CONNECTIONS, 0);

/// Connection tracking of traffic from outside the node (TC programs).
#[map]
pub static CT: LruHashMap<CtKey, CtValue> = LruHashMap::pinned(map_sizes::CT, 0);

/// Maglev tables by id: `MAGLEV_SIZE` backend ids each. The agent creates
/// and pins this map before loading (its value size is `MAGLEV_SIZE * 4`,
/// which only the agent knows), so the value type here is a placeholder.
#[map]
pub static MAGLEV: HashMap<u32, u32> = HashMap::with_max_entries(map_sizes::MAGLEV, BPF_F_NO_PREALLOC);

/// loadBalancerSourceRanges: (rev-NAT id, source prefix) -> 1.
#[map]
pub static SOURCE_RANGES: LpmTrie<SourceRange, u8> = LpmTrie::pinned(map_sizes::SOURCE_RANGES, BPF_F_NO_PREALLOC);

/// What the TC programs did with traffic from outside, and with the pods'
/// own traffic from `external_stat::POD_BASE` on (`external_stat`).
#[map]
pub static EXTERNAL_STATS: PerCpuArray<u64> = PerCpuArray::pinned(external_stat::LEN, 0);

/// How traffic from outside is shared with netfilter while the agent takes
/// over from kube-proxy (`handover_mode`): one entry, written by the agent.
/// Pinned, so an operator (or a test) can read and set it; the agent writes
/// it at every start (`--outside-handover`).
#[map]
static OUTSIDE_HANDOVER: Array<OutsideHandover> = Array::pinned(1, 0);

/// Active connections per backend id (docs/design.md, "Balancing by
/// load"): sockets counted while open (`SOCK_CONN`), flows from outside
/// while their `CT` entry lives (`ct_flags::COUNTED`). Sized like
/// `BACKENDS` by the agent. Mmapable: the agent takes back the counts of
/// flows whose entries expired unseen with an atomic subtraction on the
/// same memory, never a read-modify-write through the syscall that could
/// lose a program's increment.
#[map]
pub static ACTIVE_CONNS: Array<u64> = Array::pinned(map_sizes::BACKENDS, BPF_F_MMAPABLE);

/// The backend each open translated socket is counted towards, by socket
/// cookie; `sock_release` takes the count back. Not an LRU: an evicted
/// entry would leave its count up for good; when it is full a socket is
/// translated uncounted instead.
#[map]
pub static SOCK_CONN: HashMap<u64, SockConn> = HashMap::pinned(map_sizes::SOCK_CONN, BPF_F_NO_PREALLOC);

/// The handover mode now in force (`handover_mode`): `HANDOVER` past its
/// end counts as `OFF`.
#[inline(always)]
pub fn outside_handover_mode(now_ns: u64) -> u32 {
    let Some(config) = OUTSIDE_HANDOVER.get(0) else { return proxy_common::handover_mode::OFF };
    if config.mode == proxy_common::handover_mode::HANDOVER
        && config.handover_until_ns != 0
        && now_ns >= config.handover_until_ns
    {
        return proxy_common::handover_mode::OFF;
    }
    config.mode
}

/// This CPU's budget of rejections (`reject.rs`): a token bucket per CPU,
/// so no atomics. Not pinned: a restarted agent starts with full buckets.
#[map]
static REJECT_BUDGET: PerCpuArray<RejectBudget> = PerCpuArray::with_max_entries(1, 0);

/// The outer header of the IPIP packet being taken apart on this CPU
/// (`encap::take_outer`), kept off the stack: the frames below it reach
/// the verifier's bound.
#[map]
static OUTER_HEADER: PerCpuArray<OuterHeader> = PerCpuArray::with_max_entries(1, 0);

/// An outer IP header as it came: its length (20 or 40), its destination
/// and its bytes.
#[repr(C)]
pub struct OuterHeader {
    pub len: u32,
    pub dst: proxy_common::Addr,
    pub bytes: [u8; 40],
}

/// This CPU's `OUTER_HEADER`.
#[inline(always)]
pub fn outer_header() -> Option<&'static mut OuterHeader> {
    let ptr = OUTER_HEADER.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU array, used by this program
    // alone while it runs (as `reject_budget`).
    Some(unsafe { &mut *ptr })
}

/// A token bucket counted in nanoseconds of credit.
#[repr(C)]
pub struct RejectBudget {
    pub credit_ns: u64,
    /// `bpf_ktime_get_ns()` of the last update.
    pub last_ns: u64,
}

/// Runs `f` on this CPU's `REJECT_BUDGET`; `None` if the map has no slot.
#[inline(always)]
pub fn reject_budget<R>(f: impl FnOnce(&mut RejectBudget) -> R) -> Option<R> {
    let ptr = REJECT_BUDGET.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU array, written by this program
    // alone while it runs (as in `count_connection`).
    Some(f(unsafe { &mut *ptr }))
}

#[inline(always)]
pub fn count_external(stat: u32) {
    if let Some(counter) = EXTERNAL_STATS.get_ptr_mut(stat) {
        // SAFETY: as in `count_connection`.
        unsafe { *counter += 1 };
    }
}

#[inline(always)]
pub fn count_connection(rev_nat: RevNatId) {
    let stride = crate::CONNECTIONS_STRIDE.load();
    if rev_nat >= stride {
        return;
    }
    let index = crate::access::cpu().wrapping_mul(stride).wrapping_add(rev_nat);
    if let Some(counter) = CONNECTIONS.get_ptr_mut(index) {
        // SAFETY: this CPU's counter (its region of the array), a plain
        // integer: a program runs to its end on one CPU, and a TC program
        // that interrupts a socket program there (softirq) can at worst
        // make one increment of the two count once.
        unsafe { *counter += 1 };
    }
}

/// Backend `id`'s active connections.
#[inline(always)]
pub fn active_connections(id: u32) -> u64 {
    ACTIVE_CONNS.get(id).copied().unwrap_or(0)
}

/// Adds `n` (wrapping) to `*ptr` atomically; the result is unused, so on
/// the bpf target it is one atomic add (BPF_ATOMIC `BPF_ADD`, cpu v1).
/// The bpf target has no compare-and-swap before cpu v3, so core's
/// `AtomicU64` offers no `fetch_add` there: the intrinsic behind it is
/// called instead.
///
/// # Safety
/// `ptr` is a valid, aligned `u64` that others change only atomically.
#[inline(always)]
unsafe fn atomic_add(ptr: *mut u64, n: u64) {
    #[cfg(target_arch = "bpf")]
    // SAFETY: as the caller promises.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(ptr, n);
    }
    #[cfg(not(target_arch = "bpf"))]
    // SAFETY: as the caller promises.
    unsafe {
        core::sync::atomic::AtomicU64::from_ptr(ptr).fetch_add(n, core::sync::atomic::Ordering::Relaxed);
    }
}

/// Counts one more active connection of backend `id`.
#[inline(always)]
fn count_active(id: u32) {
    if let Some(ptr) = ACTIVE_CONNS.get_ptr_mut(id) {
        // SAFETY: an aligned u64 inside the array's value memory, valid
        // while the program runs; other CPUs and the agent only change it
        // atomically.
        unsafe { atomic_add(ptr, 1) };
    }
}

/// Takes back one active connection of backend `id`, if the backend at
/// that id is still the one at `addr`:`port` (an id freed and handed out
/// again has its count cleared: docs/design.md, "Balancing by load"),
/// never below zero.
#[inline(always)]
pub fn uncount_active(id: u32, addr: &proxy_common::Addr, port: u16) {
    // Compared in place, not copied out: callers sit on deep call chains.
    let Some(b) = BACKENDS.get(id) else { return };
    if b.proto == 0 || b.addr != *addr || b.port != port {
        return;
    }
    if let Some(ptr) = ACTIVE_CONNS.get_ptr_mut(id) {
        // SAFETY: as in `count_active`. Read, then subtract: two takers
        // of the last count at once could both pass the test, but each
        // count has one taker (whoever deletes its memo or clears its
        // flag), so only a stale one could race (docs/design.md).
        unsafe {
            // A volatile load: an aligned word is read whole, and BPF before
            // cpu v3 has no atomic load instruction to select.
            if ptr.read_volatile() != 0 {
                atomic_add(ptr, u64::MAX);
            }
        }
    }
}

/// Counts a new flow from outside towards its backend.
#[inline(always)]
pub fn count_flow(backend_id: u32) {
    count_active(backend_id);
}

/// Counts the socket `cookie` towards backend `id` at `target` (one count
/// per socket: a socket translated again, a UDP socket that connects
/// elsewhere or sends to another service, moves its count). Counted only
/// when the memo is written, so that `sock_release` takes back exactly
/// what was counted. The maps take the key and value by reference here:
/// moved in by value (as clippy would have them), they are copied onto
/// the frame of `connect6`, which then passes the verifier's stack bound.
#[inline(always)]
#[expect(clippy::needless_borrows_for_generic_args, reason = "see above")]
pub fn count_socket(cookie: u64, id: u32, target: &Backend) {
    let conn = SockConn { addr: target.addr, port: target.port, pad: 0, backend_id: id };
    // SAFETY: as for the lookups below.
    if let Some(old) = unsafe { SOCK_CONN.get(&cookie) }.copied() {
        if old == conn {
            return;
        }
        if SOCK_CONN.insert(&cookie, &conn, u64::from(BPF_EXIST)).is_ok() {
            count_active(id);
            uncount_active(old.backend_id, &old.addr, old.port);
        }
        return;
    }
    if SOCK_CONN.insert(&cookie, &conn, u64::from(BPF_NOEXIST)).is_ok() {
        count_active(id);
    }
}

/// The socket `cookie` is released: its count, if any, is taken back by
/// whoever deletes its memo (once).
#[inline(always)]
#[expect(clippy::needless_borrows_for_generic_args, reason = "as in `count_socket`")]
pub fn uncount_socket(cookie: u64) {
    // SAFETY: as for the lookups below.
    let Some(conn) = (unsafe { SOCK_CONN.get(&cookie) }).copied() else { return };
    if SOCK_CONN.remove(&cookie).is_ok() {
        uncount_active(conn.backend_id, &conn.addr, conn.port);
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
    BACKENDS.get(id).copied().filter(|b| b.proto != 0)
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
    let _ = SOCK_BACKEND.insert(key, backend_id, 0);
}

#[inline(always)]
pub fn affinity(key: &AffinityKey) -> Option<AffinityValue> {
    unsafe { AFFINITY.get(key) }.copied()
}

#[inline(always)]
pub fn remember_affinity(key: &AffinityKey, value: &AffinityValue) {
    let _ = AFFINITY.insert(key, value, 0);
}

/// The `CT` entry of `key`, to read and refresh in place (not copied to
/// the stack); `None` when there is none. It must not be kept past the
/// program's run.
#[inline(always)]
pub fn ct_entry(key: &CtKey) -> Option<&'static mut CtValue> {
    let ptr = CT.get_ptr_mut(key)?;
    // SAFETY: a pointer into the map's value, valid while the program runs
    // (the callers drop it before they return); concurrent writers (other
    // CPUs) only store whole integers.
    Some(unsafe { &mut *ptr })
}

/// Runs `f` on the `CT` entry of `key` in place (`ct_entry`); `None` when
/// there is none.
#[inline(always)]
pub fn ct_update<R>(key: &CtKey, f: impl FnOnce(&mut CtValue) -> R) -> Option<R> {
    ct_entry(key).map(f)
}

/// Inserts or replaces a `CT` entry.
#[inline(always)]
pub fn ct_insert(key: &CtKey, value: &CtValue) -> bool {
    CT.insert(key, value, 0).is_ok()
}

/// Removes a `CT` entry, if there is one.
#[inline(always)]
pub fn ct_remove(key: &CtKey) {
    let _ = CT.remove(key);
}

/// Programs the TC ingress program hands a packet to (`tail_call`
/// indexes), each verified with a budget of its own. Pinned: the kernel
/// empties a program array once no file or pin holds it, and the
/// programs outlive the agent.
#[map]
static TAIL_CALLS: ProgramArray = ProgramArray::pinned(proxy_common::tail_call::LEN, 0);

/// Runs program `index` of `TAIL_CALLS` on `ctx` in place of the caller;
/// returns only when there is none (the agent has not set it yet).
#[inline(always)]
pub fn tail_call(ctx: &TcContext, index: u32) {
    // SAFETY: control goes to a program of the same type on the same
    // context, or stays here; nothing of the caller's is used after it.
    unsafe { TAIL_CALLS.tail_call(ctx, index) }
}

/// Entry `index` of Maglev table `id`, whose tables have `size` entries.
#[inline(always)]
pub fn maglev_entry(id: u16, index: u32, size: u32) -> Option<u32> {
    // The compiler cannot prove this (it does not know `size`), so it stays
    // and gives the verifier the exact bound of the read below.
    if index >= size {
        return None;
    }
    let table = MAGLEV.get_ptr(u32::from(id))?;
    // SAFETY: the agent created MAGLEV with values of `size` u32s (the
    // MAGLEV_SIZE it loaded the programs with) and `index` is below it.
    Some(unsafe { table.add(index as usize).read() })
}

/// Whether `src` may reach frontend `rev_nat` (loadBalancerSourceRanges).
#[inline(always)]
pub fn source_allowed(rev_nat: RevNatId, src: &proxy_common::Addr) -> bool {
    let key = Key::new(SOURCE_RANGE_ID_BITS + 128, SourceRange { rev_nat: rev_nat.to_be(), addr: *src });
    SOURCE_RANGES.get(&key).is_some()
}
