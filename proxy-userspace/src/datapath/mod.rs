//! Everything that touches the kernel: loading and attaching the programs,
//! the pinned maps and links, and the syscalls behind them. Only this
//! module knows aya; the pure reconciler (`crate::reconcile`) writes the
//! maps through the `ServiceMaps` trait `maps::KernelMaps` implements.
pub mod acceleration;
pub mod active;
pub(crate) mod affinity;
pub mod counters;
mod ct_resize;
pub mod handover;
pub mod links;
pub mod loader;
mod maglev_map;
pub(crate) mod maps;
pub(crate) mod names;
pub(crate) mod netfilter_flows;
pub(crate) mod netlink;
mod programs;
pub(crate) mod sessions;
pub(crate) mod sock_destroy;
pub(crate) mod socket_lb_pins;
mod sys;
pub use sys::read_hash_map;

pub use maps::KernelMaps;
