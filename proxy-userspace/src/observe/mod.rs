//! What reads the agent after each sync: its health, the metrics endpoint
//! and what it reports, the connection-tracking fill, the allocator's
//! memory, and the local endpoint `ebpf-proxy explain` asks.
pub mod ct_fill;
pub mod explain_socket;
pub mod health;
pub mod healthcheck;
pub mod memory;
pub mod metrics;
pub mod process_metrics;
pub mod rest_metrics;
pub mod serve;
pub mod telemetry;
