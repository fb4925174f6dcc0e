//! Active connections per backend (`ACTIVE_CONNS`, indexed by backend id),
//! which the programs count for `lb-algorithm: least-connections`
//! (`proxy-ebpf/src/balance.rs`; docs/design.md, "Balancing by load").
//!
//! The array is mapped into the agent's memory (the map is made
//! `BPF_F_MMAPABLE`): the programs add to a count atomically on other
//! CPUs, and a read-modify-write through the bpf syscall would lose such
//! an add, so the agent changes a count only with atomic operations on the
//! same memory. It clears a backend's count when its id is freed or handed
//! to a new backend, and takes back the counts of flows from outside whose
//! `CT` entries ended without a packet to see it (`sweep_ended_flows`).
use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    path::Path,
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use aya::maps::{Map, MapData};
use proxy_common::{Backend, CtKey, CtValue, ct_dir, ct_flags, ct_lifetime};

use super::maps::{MapError, MapName};

/// How often the agent takes back the counts of flows from outside whose
/// entries expired unseen: the longest a finished flow stays counted past
/// its entry's lifetime (`ct_lifetime`).
pub(crate) const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// The agent's mapping of `ACTIVE_CONNS`.
pub struct ActiveConns {
    counts: NonNull<AtomicU64>,
    len: u32,
    /// The mapping's length in bytes (whole pages).
    mapped: usize,
    /// The map itself, kept: the programs' instructions name its
    /// descriptor until they are loaded (on a thread, later), so it must
    /// stay open and never be reused for another map meanwhile.
    _map: Map,
}

// SAFETY: the mapping is shared memory that is only read and written with
// atomic operations, from any thread.
unsafe impl Send for ActiveConns {}
// SAFETY: as above.
unsafe impl Sync for ActiveConns {}

impl std::fmt::Debug for ActiveConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveConns").field("len", &self.len).finish_non_exhaustive()
    }
}

fn syscall(op: &'static str, source: io::Error) -> MapError {
    MapError::Syscall { map: MapName::ActiveConns, op, source }
}

impl ActiveConns {
    /// Maps the array `map` (the programs' `ACTIVE_CONNS`), and keeps it.
    pub(crate) fn from_map(map: Map) -> Result<Self, MapError> {
        let Map::Array(data) = &map else {
            return Err(syscall("open", io::Error::other("not an array; is the eBPF object from this build?")));
        };
        let info = data.info().map_err(|e| syscall("info", io::Error::other(e)))?;
        if info.value_size() != 8 {
            return Err(syscall("open", io::Error::other("values are not 8-byte counts")));
        }
        let len = info.max_entries();
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| usize::try_from(p).ok())
            .unwrap_or(4096);
        let mapped = (len as usize * 8).div_ceil(page).max(1) * page;
        let counts = map_shared(data.fd().as_fd(), mapped).map_err(|e| syscall("mmap", e))?;
        Ok(Self { counts, len, mapped, _map: map })
    }

    /// Maps the array pinned at `path` (`ebpf-proxy service`, tests).
    pub fn open_pinned(path: &Path) -> Result<Self, MapError> {
        let data =
            MapData::from_pin(path).map_err(|source| MapError::Open { path: path.display().to_string(), source })?;
        Self::from_map(Map::Array(data))
    }

    fn at(&self, id: u32) -> Option<&AtomicU64> {
        // SAFETY: within the mapping (id below the array's length), which
        // lives as long as `self`; the kernel aligns each value to 8 bytes.
        (id < self.len).then(|| unsafe { self.counts.add(id as usize).as_ref() })
    }

    /// Backend `id`'s active connections (0 past the array).
    #[must_use]
    pub fn get(&self, id: u32) -> u64 {
        self.at(id).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Forgets backend `id`'s count: its id is freed, or handed to a new
    /// backend (whose count starts at 0).
    pub(crate) fn clear(&self, id: u32) {
        if let Some(c) = self.at(id) {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Takes back one active connection of backend `id`, never below zero.
    pub(crate) fn take_back(&self, id: u32) {
        if let Some(c) = self.at(id) {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// Takes back the counts of flows from outside that ended unseen: each
    /// original-direction `CT` entry still marked `COUNTED` and past its
    /// lifetime at `now_ns` (CLOCK_MONOTONIC) is deleted with its value
    /// read in the same call (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`), so a count
    /// is taken back once, by the agent or by the programs (which clear
    /// the flag when they meet the expired entry first), never by both.
    /// `backend` reads `BACKENDS`: a count is taken back only from the
    /// backend the flow went to. An entry found renewed meanwhile (a new
    /// flow on the tuple) is put back. Returns how many were taken back,
    /// and how many entries `CT` held (`crate::observe::ct_fill`).
    pub(crate) fn sweep_ended_flows(
        &self,
        ct: BorrowedFd<'_>,
        backend: impl Fn(u32) -> Option<Backend>,
        now_ns: u64,
    ) -> Result<Sweep, MapError> {
        let Some(entries) = super::sys::read_hash_map::<CtKey, CtValue>(ct, 1024).map_err(|e| syscall("read CT", e))?
        else {
            return Ok(Sweep::default());
        };
        let ct_entries = entries.len();
        let mut taken = 0;
        for (key, value) in entries {
            if key.dir != ct_dir::ORIGINAL || !ended_counted(&key, &value, now_ns) {
                continue;
            }
            let Some(held) = super::sys::map_lookup_and_delete::<CtKey, CtValue>(ct, &key)
                .map_err(|e| syscall("lookup and delete CT", e))?
            else {
                continue;
            };
            if !ended_counted(&key, &held, now_ns) {
                // Renewed since the read: not ours to take.
                let _ = super::sys::map_insert_new(ct, &key, &held);
                continue;
            }
            if backend(held.backend_id).is_some_and(|b| b.addr == held.addr && b.port == held.port) {
                self.take_back(held.backend_id);
                taken += 1;
            }
        }
        Ok(Sweep { taken, ct_entries })
    }
}

/// What a sweep did and saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sweep {
    /// Active connections taken back.
    pub taken: usize,
    /// Entries `CT` held when it was read.
    pub(crate) ct_entries: usize,
}

/// What the metrics endpoint reads: the counts, and `BACKENDS` to name
/// each backend (`ebpf_proxy_backend_active_connections`).
pub(crate) struct ActiveSeries {
    counts: std::sync::Arc<ActiveConns>,
    backends: aya::maps::Array<MapData, Backend>,
}

impl std::fmt::Debug for ActiveSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveSeries").field("counts", &self.counts).finish_non_exhaustive()
    }
}

impl ActiveSeries {
    /// The counts, with `backends`, a descriptor of this set's `BACKENDS`.
    pub(crate) fn new(counts: std::sync::Arc<ActiveConns>, backends: OwnedFd) -> Result<Self, MapError> {
        let aya = |source| MapError::Aya { map: MapName::Backends, source };
        let backends = aya::maps::Array::try_from(Map::Array(MapData::from_fd(backends).map_err(aya)?)).map_err(aya)?;
        Ok(Self { counts, backends })
    }

    /// `(ADDR:PORT/PROTO, active connections)` of the live backends with
    /// the lowest ids, at most `max` (of `live` there are): ids are handed
    /// out lowest first, so this reads about `max` entries, not the array.
    #[must_use]
    pub(crate) fn series(&self, max: usize, live: usize) -> Vec<(String, u64)> {
        let want = max.min(live);
        let mut out = Vec::with_capacity(want);
        for id in 1..self.counts.len.min(self.backends.len()) {
            if out.len() >= want {
                break;
            }
            let Ok(backend) = self.backends.get(&id, 0) else { continue };
            // An empty entry (protocol 0) names no backend.
            if let Ok(protocol) = crate::reconcile::codec::protocol_of(backend.proto) {
                let (addr, port) = crate::reconcile::codec::endpoint_of(&backend.addr, backend.port);
                let name = std::net::SocketAddr::new(addr, port).to_string();
                out.push((format!("{name}/{protocol}"), self.counts.get(id)));
            }
        }
        out
    }
}

/// Whether a flow's original entry still counts an active connection
/// though it is past its lifetime (the programs' `ct::live`).
fn ended_counted(key: &CtKey, value: &CtValue, now_ns: u64) -> bool {
    value.flags & ct_flags::COUNTED != 0
        && now_ns.saturating_sub(value.last_seen_ns) >= ct_lifetime::of(key.proto, value.flags) * 1_000_000_000
}

impl Drop for ActiveConns {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `from_data`, of this length, unused
        // once `self` goes.
        unsafe { libc::munmap(self.counts.as_ptr().cast(), self.mapped) };
    }
}

/// `mmap(MAP_SHARED, PROT_READ | PROT_WRITE)` of `len` bytes of `fd`.
fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<AtomicU64>> {
    // SAFETY: a new shared mapping of the map's memory at an address the
    // kernel picks; nothing else is touched.
    let ptr = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

#[cfg(test)]
mod tests {
    use proxy_common::{CtKey, CtValue, ct_dir, ct_flags, proto};

    use super::ended_counted;

    const SEC: u64 = 1_000_000_000;

    fn key(protocol: u8) -> CtKey {
        CtKey {
            src: proxy_common::Addr::default(),
            dst: proxy_common::Addr::default(),
            sport: 1,
            dport: 2,
            proto: protocol,
            dir: ct_dir::ORIGINAL,
            pad: [0; 2],
        }
    }

    /// The sweep takes back a counted entry past its lifetime (the
    /// programs' `ct::live`, by protocol and closing state), and nothing
    /// else.
    #[test]
    fn only_counted_entries_past_their_lifetime_have_ended() {
        let at = |flags: u8, last_seen_s: u64| CtValue { flags, last_seen_ns: last_seen_s * SEC, ..CtValue::default() };
        let now = 100_000 * SEC;
        let counted = ct_flags::COUNTED;
        let closing = ct_flags::COUNTED | ct_flags::CLOSING;
        for (protocol, value, ended) in [
            (proto::TCP, at(counted, 100_000 - 21_599), false),
            (proto::TCP, at(counted, 100_000 - 21_600), true),
            (proto::TCP, at(closing, 100_000 - 9), false),
            (proto::TCP, at(closing, 100_000 - 10), true),
            (proto::UDP, at(counted, 100_000 - 59), false),
            (proto::UDP, at(counted, 100_000 - 60), true),
            (proto::UDP, at(0, 0), false),
            (proto::TCP, at(ct_flags::CLOSING, 0), false),
        ] {
            assert_eq!(ended_counted(&key(protocol), &value, now), ended, "{protocol} {value:?}");
        }
    }
}
