//! Where Services and EndpointSlices come from: every source implements
//! `ChangeSource`.
pub(crate) mod bootstrap;
pub(crate) mod change_source;
pub(crate) mod convert;
pub mod file;
pub mod file_source;
pub mod kube;
pub(crate) mod labels;
pub mod lean;
pub mod listwatch;
#[cfg(test)]
pub(crate) mod log_capture;
pub(crate) mod objects;
pub(crate) mod placements;
pub mod protobuf;
pub(crate) mod reachability;
pub(crate) mod requests;
pub mod retry;
pub(crate) mod slim;
pub mod store;
pub(crate) mod stored_slice;
pub(crate) mod tracker;

pub use change_source::{ChangeSource, Delivery};
pub(crate) use objects::{Changed, Objects, Snapshot};
