//! What reads the agent after each sync: its health, the metrics endpoint
//! and what it reports, the connection-tracking fill, the allocator's
//! memory, and the local endpoint `ebpf-proxy explain` asks.
pub(crate) mod ct_fill;
pub(crate) mod explain_socket;
pub(crate) mod health;
pub(crate) mod healthcheck;
pub mod memory;
pub(crate) mod metrics;
pub(crate) mod process_metrics;
pub(crate) mod rest_metrics;
pub(crate) mod serve;
pub mod telemetry;
