//! Where Services and EndpointSlices come from: every source implements
//! `ChangeSource`.
pub mod bootstrap;
pub mod change_source;
pub mod convert;
pub mod file;
pub mod file_source;
pub mod kube;
pub mod labels;
pub mod lean;
pub mod listwatch;
#[cfg(test)]
pub(crate) mod log_capture;
pub mod objects;
pub mod placements;
pub mod protobuf;
pub mod reachability;
pub mod requests;
pub mod retry;
pub mod slim;
pub mod store;
pub mod stored_slice;
pub mod tracker;

pub use change_source::{ChangeSource, Delivery};
pub use objects::{Changed, Objects, Snapshot};
