//! Everything that touches the kernel: loading and attaching the programs,
//! and keeping the maps equal to the desired table. Only this module knows aya.
pub mod acceleration;
pub mod active;
pub mod affinity;
pub mod audit;
mod backend_table;
pub mod codec;
pub mod counters;
mod ct_resize;
pub mod failures;
pub mod fake_maps;
pub mod handover;
mod ids;
pub mod inspect;
pub mod links;
pub mod loader;
mod maglev_map;
mod maglev_tables;
mod map_error;
pub mod maps;
pub mod names;
pub mod netfilter_flows;
pub mod netlink;
mod programs;
pub mod reconcile;
pub mod sessions;
pub mod sizing;
pub mod sock_destroy;
pub mod socket_lb_pins;
mod sys;
pub use sys::read_hash_map;

pub use maps::{KernelMaps, MapError, ServiceMaps};
pub use reconcile::{Change, ChangeKind, Reconciler, Report};

#[cfg(test)]
mod reconcile_tests;
