//! Filesystem locations the agent uses, in one place.

/// Where bpffs is mounted by convention.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";
/// Default directory of the agent's pinned maps.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/ebpf-proxy";
/// Subdirectory of the pin directory that holds the pinned program links.
pub const LINKS_SUBDIR: &str = "links";
/// Where the agent mounts cgroup2 when the machine has none mounted.
pub const OWN_CGROUP2_MOUNT: &str = "/run/ebpf-proxy/cgroup2";
/// The mount table.
pub const MOUNTS: &str = "/proc/self/mounts";
/// kube-proxy's health address.
pub const DEFAULT_HEALTHZ: &str = "0.0.0.0:10256";
/// kube-proxy's metrics address.
pub const DEFAULT_METRICS: &str = "127.0.0.1:10249";
