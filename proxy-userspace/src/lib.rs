//! ebpf-proxy: a Kubernetes service proxy that translates service addresses
//! in the kernel with eBPF instead of iptables DNAT.
pub mod datapath;
pub mod model;
pub mod source;
