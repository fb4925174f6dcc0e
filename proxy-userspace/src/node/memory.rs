//! The node's memory, for the sizes that follow it: the connection
//! tracking map (`CT`) unless `--ct-map-size` sets it. Cilium sizes its
//! connection tracking and NAT maps the same way, from a share of the
//! node's memory (`bpf-map-dynamic-size-ratio`, 0.0025 by default), and an
//! explicit size beats the share there too.
//!
//! A `CT` sized from memory is where it starts: the agent doubles it when
//! it fills up (`grown`; docs/design.md, "Growing `CT`"), as Calico grows
//! its conntrack map, up to `MAX_ENTRIES`. An explicit `--ct-map-size` is
//! the operator's choice of memory, so it stays as it is.
use std::path::{Path, PathBuf};

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

/// The size a `CT` sized from memory (`grows`) and now of `capacity`
/// entries grows to when it is nearly full: twice as big, up to
/// `MAX_ENTRIES`. `None`: it stays (an explicit size, or at the most).
/// Twice leaves a map that passed the mark (at most 90%,
/// `crate::observe::ct_fill`) under half full, well below the mark again,
/// so one filling makes one growth.
#[must_use]
pub(crate) fn grown(capacity: u32, grows: bool) -> Option<u32> {
    let next = capacity.saturating_mul(2).min(MAX_ENTRIES);
    (grows && next > capacity).then_some(next)
}

/// `CT`'s size at a start with `auto` from memory, when a previous agent
/// pinned one of `pinned` entries: a `CT` it grew (`grown`) keeps its
/// size, so a restart does not shrink it (and drop flows) for the
/// agent to grow it again. An explicit size is taken as it is
/// (`crate::datapath::ct_resize`).
#[must_use]
pub(crate) fn ct_entries_at_start(auto: u32, pinned: Option<u32>, grows: bool) -> u32 {
    pinned.filter(|p| grows && *p > auto && *p <= MAX_ENTRIES).unwrap_or(auto)
}

/// The memory the agent's maps may take: the node's (`/proc/meminfo`'s
/// `MemTotal`), or the agent's cgroup's limit when lower, since the kernel
/// charges a map's memory to the cgroup that makes it (a DaemonSet's
/// memory limit). `None` when neither can be read.
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

/// The memory limit of the agent's own cgroup (`None`: no limit, or
/// nothing to read it from). On a host with cgroup v2's memory controller
/// that is `memory.max`; on one that keeps the memory controller in a v1
/// hierarchy (a hybrid host, as kubelet still supports), the v1
/// `memory.limit_in_bytes`, whose "no limit" is a number far above any
/// node's memory (`available` takes the lower of the two).
fn cgroup_limit() -> Option<u64> {
    let mounts = std::fs::read_to_string(crate::paths::MOUNTS).ok()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_files(&mounts, &own)
        .into_iter()
        .filter_map(|file| std::fs::read_to_string(file).ok()?.trim().parse().ok())
        .min()
}

/// The files that may hold the memory limit of the cgroup a process is in,
/// from `/proc/self/mounts`' text and `/proc/self/cgroup`'s: the v2
/// hierarchy's `memory.max` (lines `0::PATH`) and the v1 memory
/// hierarchy's `memory.limit_in_bytes` (lines `N:CONTROLLERS:PATH` naming
/// `memory`), each under where its hierarchy is mounted.
pub(crate) fn limit_files(mounts: &str, own: &str) -> Vec<PathBuf> {
    let mount = |v2: bool| {
        mounts.lines().find_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, path, fstype, options) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
            let wanted =
                if v2 { fstype == "cgroup2" } else { fstype == "cgroup" && options.split(',').any(|o| o == "memory") };
            wanted.then_some(path)
        })
    };
    let mut files = Vec::new();
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let (v2, file) = if controllers.is_empty() {
            (true, "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (false, "memory.limit_in_bytes")
        } else {
            continue;
        };
        if let Some(root) = mount(v2) {
            files.push(Path::new(root).join(path.trim_start_matches('/')).join(file));
        }
    }
    files
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

    /// (capacity, sized from memory) -> what it grows to.
    #[test]
    fn ct_doubles_up_to_its_bound_and_only_when_sized_from_memory() {
        for (capacity, grows, want) in [
            (MIN_ENTRIES, true, Some(131_072)),
            (1_048_576, true, Some(2_097_152)),
            (2_097_152, true, Some(MAX_ENTRIES)),
            (MAX_ENTRIES, true, None),
            (3_000_000, true, Some(MAX_ENTRIES)),
            (u32::MAX, true, None),
            (MIN_ENTRIES, false, None),
            (1024, false, None),
        ] {
            assert_eq!(grown(capacity, grows), want, "{capacity}, grows: {grows}");
        }
    }

    /// (from memory, pinned, grows) -> the size at a start.
    #[test]
    fn a_grown_ct_keeps_its_size_across_a_restart() {
        for (auto, pinned, grows, want) in [
            (65_536, None, true, 65_536),
            (65_536, Some(131_072), true, 131_072),
            (262_144, Some(131_072), true, 262_144), // more memory now
            (65_536, Some(8_388_608), true, 65_536), // above what growth makes
            (65_536, Some(131_072), false, 65_536),  // an explicit size
        ] {
            assert_eq!(ct_entries_at_start(auto, pinned, grows), want, "{auto}, {pinned:?}, {grows}");
        }
    }

    #[test]
    fn mem_total_is_read_in_kib() {
        let meminfo = "MemTotal:       24591156 kB\nMemFree:        1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_591_156 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    /// (mounts, /proc/self/cgroup) -> the limit files read, in order.
    #[test]
    fn the_limit_is_read_from_the_hierarchy_that_holds_the_memory_controller() {
        let v2_only = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n";
        // A hybrid host: the memory controller in v1, an empty v2 beside it.
        let hybrid = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n\
                      cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n\
                      cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n";
        let hybrid_own = "5:cpu,cpuacct:/pod1\n4:memory:/kubepods/pod1/agent\n0::/\n";
        for (mounts, own, want) in [
            (v2_only, "0::/kubepods.slice/agent.scope\n", vec!["/sys/fs/cgroup/kubepods.slice/agent.scope/memory.max"]),
            (
                hybrid,
                hybrid_own,
                vec![
                    "/sys/fs/cgroup/memory/kubepods/pod1/agent/memory.limit_in_bytes",
                    "/sys/fs/cgroup/unified/memory.max",
                ],
            ),
            // In a cgroup namespace a process sees its cgroup as the root.
            (v2_only, "0::/\n", vec!["/sys/fs/cgroup/memory.max"]),
            // A v1 memory line with no v1 memory mount to read it from.
            (v2_only, "4:memory:/x\n", vec![]),
            ("", hybrid_own, vec![]),
        ] {
            let files = limit_files(mounts, own);
            let want: Vec<PathBuf> = want.into_iter().map(PathBuf::from).collect();
            assert_eq!(files, want, "{own:?}");
        }
    }

    #[test]
    fn this_node_has_a_size() {
        let here = ct_entries_here();
        assert!(here.is_power_of_two() && (MIN_ENTRIES..=MAX_ENTRIES).contains(&here), "{here}");
    }
}
