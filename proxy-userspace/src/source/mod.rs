//! Where Services and EndpointSlices come from.
pub mod bootstrap;
pub mod file;
pub mod kube;
pub mod objects;
pub mod slice_store;
pub mod slim;
pub mod stored_slice;
pub mod tracker;

pub use objects::{Changed, Objects, Snapshot};
