//! A read of the `AFFINITY` map for `ebpf-proxy explain --from`: which
//! backend a client (its network namespace cookie, as the socket programs
//! key it) keeps for a frontend (its rev-NAT id), and since when.
use std::{path::Path, time::Duration};

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use proxy_common::{AffinityKey, AffinityValue, RevNatId, map_names};

use super::maps::MapError;

/// One entry of `AFFINITY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AffinityEntry {
    /// The client's network namespace cookie.
    pub(crate) client: u64,
    pub(crate) backend_id: u32,
    /// Since the last connection that used it.
    pub(crate) idle: Duration,
}

/// The entries of frontend `rev_nat` in the `AFFINITY` map pinned in
/// `maps_dir` (an expired entry stays until the LRU evicts it or the next
/// connection replaces it: see `AffinityEntry::idle`).
pub(crate) fn entries(maps_dir: &Path, rev_nat: RevNatId) -> Result<Vec<AffinityEntry>, MapError> {
    let path = maps_dir.join(map_names::AFFINITY);
    let data =
        MapData::from_pin(&path).map_err(|source| MapError::Open { path: path.display().to_string(), source })?;
    let map: BpfHashMap<MapData, AffinityKey, AffinityValue> = BpfHashMap::try_from(Map::LruHashMap(data))
        .map_err(|source| MapError::Session { map: map_names::AFFINITY, source })?;
    let now = monotonic_ns();
    Ok(map
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, _)| k.rev_nat == rev_nat)
        .map(|(k, v)| AffinityEntry {
            client: k.client,
            backend_id: v.backend_id,
            idle: Duration::from_nanos(now.saturating_sub(v.last_used_ns)),
        })
        .collect())
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    let _ = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}
