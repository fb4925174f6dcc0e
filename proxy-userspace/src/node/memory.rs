//! The node's memory, for the sizes that follow it: the connection
//! tracking map (`CT`) unless `--ct-map-size` sets it. Cilium sizes its
//! connection tracking and NAT maps the same way, from a share of the
//! node's memory (`bpf-map-dynamic-size-ratio`, 0.0025 by default), and an
//! explicit size beats the share there too.
use std::path::Path;

/// The share of memory `CT` may take: Cilium's default ratio.
const SHARE: f64 = 0.0025;
/// The kernel's bytes for one entry of `CT` (key, value and the LRU hash
/// table's element header), as `bpftool map show` reports a preallocated
/// map's memory over its entries.
const BYTES_PER_ENTRY: u64 = 160;
/// The bounds of the size from memory: a small node still keeps 32,768
/// flows from outside (two entries a flow); a large one stops at 640 MiB.
pub(crate) const MIN_ENTRIES: u32 = 65_536;
pub(crate) const MAX_ENTRIES: u32 = 4_194_304;

/// `CT`'s entries for `memory` bytes: the share at `BYTES_PER_ENTRY`,
/// down to a power of two (the size the kernel rounds a hash map's
/// buckets to), within `MIN_ENTRIES..=MAX_ENTRIES`.
#[must_use]
pub(crate) fn ct_entries(memory: u64) -> u32 {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a share of a memory size, clamped below"
    )]
    let fits = ((memory as f64 * SHARE) as u64) / BYTES_PER_ENTRY;
    let pow2 = fits.checked_ilog2().map_or(0, |bits| 1u64 << bits);
    u32::try_from(pow2.clamp(u64::from(MIN_ENTRIES), u64::from(MAX_ENTRIES))).unwrap_or(MAX_ENTRIES)
}

/// The memory the agent's maps may take: the node's (`/proc/meminfo`'s
/// `MemTotal`), or the agent's cgroup's limit (`memory.max`) when lower,
/// since the kernel charges a map's memory to the cgroup that makes it (a
/// DaemonSet's memory limit). `None` when neither can be read.
#[must_use]
pub(crate) fn available() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| mem_total(&m));
    let limit = cgroup_limit();
    match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

/// `CT`'s entries on this node (`ct_entries` of `available`; the fewest
/// when the memory cannot be read).
#[must_use]
pub(crate) fn ct_entries_here() -> u32 {
    available().map_or(MIN_ENTRIES, ct_entries)
}

/// `MemTotal` of `/proc/meminfo`'s text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The memory limit of the agent's own cgroup (cgroup v2's `memory.max`;
/// `None`: no limit, or no cgroup2 mount to read it from).
fn cgroup_limit() -> Option<u64> {
    let mounts = std::fs::read_to_string(crate::paths::MOUNTS).ok()?;
    let root = mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, path, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "cgroup2").then(|| path.to_owned())
    })?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let max = std::fs::read_to_string(Path::new(&root).join(path.trim_start_matches('/')).join("memory.max")).ok()?;
    max.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_follows_memory_in_powers_of_two_within_its_bounds() {
        const GIB: u64 = 1 << 30;
        for (memory, entries) in [
            (0, MIN_ENTRIES),
            (2 * GIB, 65_536),
            (8 * GIB, 131_072),
            (24 * GIB, 262_144),
            (64 * GIB, 1_048_576),
            (128 * GIB, 2_097_152),
            (4096 * GIB, MAX_ENTRIES),
        ] {
            assert_eq!(ct_entries(memory), entries, "{} GiB", memory / GIB);
        }
    }

    #[test]
    fn mem_total_is_read_in_kib() {
        let meminfo = "MemTotal:       24591156 kB\nMemFree:        1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_591_156 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn this_node_has_a_size() {
        let here = ct_entries_here();
        assert!(here.is_power_of_two() && (MIN_ENTRIES..=MAX_ENTRIES).contains(&here), "{here}");
    }
}
