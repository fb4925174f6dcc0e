//! Where Services and EndpointSlices come from.
pub mod file;
pub mod kube;
pub mod objects;
pub mod tracker;

pub use objects::{Changed, Objects, Snapshot};
