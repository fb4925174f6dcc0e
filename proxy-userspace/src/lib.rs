//! ebpf-proxy: a Kubernetes service proxy that translates service addresses
//! in the kernel with eBPF instead of iptables DNAT.
pub mod agent;
pub mod args;
pub mod cmd;
pub mod config;
pub mod datapath;
pub mod devices;
pub mod fs;
pub mod health;
pub mod healthcheck;
pub mod local_addrs;
pub mod maglev;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod nodeport_addresses;
pub mod paths;
pub mod pin_rollback;
pub mod pipeline;
pub mod process_metrics;
pub mod resize;
pub mod rest_metrics;
pub mod sandbox;
pub mod serve;
pub mod source;
pub mod telemetry;
