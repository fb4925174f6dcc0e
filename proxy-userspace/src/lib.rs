//! ebpf-proxy: a Kubernetes service proxy that translates service addresses
//! in the kernel with eBPF instead of iptables DNAT.
//!
//! Data flows one way: `source` → `model` → `reconcile` → `datapath`, with
//! the `observe` modules reading what each sync did.
#![warn(missing_docs)]

/// The agent: wires the pipeline, the datapath and the observers together.
pub mod agent;
/// The command line.
pub mod args;
/// One module per subcommand.
pub mod cmd;
/// The configuration file.
pub mod config;
/// The kernel side: loading and attaching the programs, the pinned maps.
pub mod datapath;
/// The pure Kubernetes rules: Services and EndpointSlices in, the desired table out.
pub mod model;
/// The node itself: its devices, addresses, namespaces and filesystems.
pub mod node;
/// The observers of each sync: health, metrics, telemetry, explain.
pub mod observe;
/// Filesystem locations the agent uses.
pub mod paths;
/// One sync at a time: source → model → reconciler.
pub mod pipeline;
/// The pure reconciler: the desired table in, the difference written through a map trait.
pub mod reconcile;
/// The reference pages under docs/reference/, generated from the code.
pub mod reference;
/// Guards for the demo and the tests: network namespaces, cgroups, bpffs.
pub mod sandbox;
/// The agent's settings: flags, environment and config file in one struct.
pub mod settings;
/// Where Services and EndpointSlices come from: the API server or a file.
pub mod source;
/// Taking a node over from a running kube-proxy.
pub mod takeover;
