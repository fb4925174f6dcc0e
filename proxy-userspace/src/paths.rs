//! Filesystem locations the agent uses, in one place.
use std::path::{Path, PathBuf};

use crate::reconcile::sizing::Sizes;

/// Where bpffs is mounted by convention.
pub(crate) const BPFFS_ROOT: &str = "/sys/fs/bpf";
/// Default directory of the agent's pinned maps.
pub(crate) const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/ebpf-proxy";
/// Subdirectory of the pin directory that holds the pinned program links.
pub(crate) const LINKS_SUBDIR: &str = "links";
/// Where the agent mounts cgroup2 when the machine has none mounted.
pub(crate) const OWN_CGROUP2_MOUNT: &str = "/run/ebpf-proxy/cgroup2";
/// Where the agent serves `ebpf-proxy explain` its reasons (a unix
/// socket, mode 0600).
pub(crate) const DEFAULT_EXPLAIN_SOCKET: &str = "/run/ebpf-proxy/agent.sock";
/// The mount table.
pub(crate) const MOUNTS: &str = "/proc/self/mounts";
/// kube-proxy's health address.
pub(crate) const DEFAULT_HEALTHZ: &str = "0.0.0.0:10256";
/// kube-proxy's metrics address.
pub const DEFAULT_METRICS: &str = "127.0.0.1:10249";
/// Version of the maps' layout (key and value types). Bump it whenever a
/// type in proxy-common changes: a new agent then fills maps of the new
/// layout beside the old ones and switches the programs over in one step.
/// 6: 32-bit frontend (rev-NAT) ids, and maps indexed by them sized with
/// the table (`-fF` in the directory name); two more `EXTERNAL_STATS`
/// counters (XDP). 7: `OUTSIDE_HANDOVER`, the `ct_flags::KERNEL` flag of
/// `CT` and the `left_to_kernel` counter (taking over from kube-proxy);
/// the `dsr_refused` counter and `ct_flags::DSR` (direct server return).
/// 8: `BACKENDS` an array indexed by backend id (protocol 0: empty).
/// 9: four backend ids to a `SERVICES` slots entry (`SLOTS_PER_ENTRY`).
/// 10: a second set of `EXTERNAL_STATS` counters, for the pods' traffic
/// translated per packet (`external_stat::POD_BASE`). 11: the
/// `dsr_too_big` counter. 12: `service_flags::FORWARD_SNAT` and
/// `FORWARD_DSR` (the `nodeport-mode` annotation), the `dsr_frag_needed`
/// counter. 13: the `dsr_to_snat` counter and `TAIL_CALLS`.
pub const MAP_LAYOUT_VERSION: u32 = 13;
/// Tests only: stands in for another build's layout version, to exercise
/// the switch-over between layouts.
pub const LAYOUT_VERSION_ENV: &str = "EBPF_PROXY_TEST_MAP_LAYOUT_VERSION";

/// The layout version of this build (or the test override).
#[must_use]
pub(crate) fn map_layout_version() -> u32 {
    std::env::var(LAYOUT_VERSION_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(MAP_LAYOUT_VERSION)
}

/// Where the maps of this build's layout, Maglev table size and map sizes
/// are pinned under `pin_dir` (`maps-vN-mM-sS-bB-fF`): another Maglev size
/// is another layout, since the programs read the tables with the size
/// they were loaded with, and other sizes of `SERVICES` (S), `BACKENDS` (B)
/// and the maps indexed by frontend id (F) are a new set the agent moves to
/// the same way.
#[must_use]
pub fn maps_dir(pin_dir: &Path, maglev_size: usize, sizes: Sizes) -> PathBuf {
    let Sizes { services, backends, frontends } = sizes;
    pin_dir.join(format!("{}-s{services}-b{backends}-f{frontends}", maglev_prefix(maglev_size)))
}

/// The map sizes (`SERVICES`, `BACKENDS`, frontends) of the most recently
/// written set of this build's layout and Maglev table size pinned under
/// `pin_dir`.
#[must_use]
pub(crate) fn pinned_sizes(pin_dir: &Path, maglev_size: usize) -> Option<(u32, u32, u32)> {
    let prefix = format!("{}-s", maglev_prefix(maglev_size));
    std::fs::read_dir(pin_dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (services, rest) = name.strip_prefix(&prefix)?.split_once("-b")?;
            let (backends, frontends) = rest.split_once("-f")?;
            let sizes = (services.parse().ok()?, backends.parse().ok()?, frontends.parse().ok()?);
            Some((e.metadata().and_then(|m| m.modified()).ok(), sizes))
        })
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, sizes)| sizes)
}

/// `maps-vN-mM`.
fn maglev_prefix(maglev_size: usize) -> String {
    format!("{}-m{maglev_size}", layout_prefix())
}

/// `maps-vN`: the prefix of this build's maps directories.
fn layout_prefix() -> String {
    format!("maps-v{}", map_layout_version())
}

/// The maps directory of this build's layout that the agent last wrote
/// (for commands that read the pinned maps without the agent's settings).
#[must_use]
pub fn current_maps_dir(pin_dir: &Path) -> Option<PathBuf> {
    let prefix = format!("{}-m", layout_prefix());
    std::fs::read_dir(pin_dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}
