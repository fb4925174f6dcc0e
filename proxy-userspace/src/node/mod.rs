//! The node the agent runs on: the devices traffic arrives on, its local
//! addresses (and which serve NodePorts), the pods' devices, the network
//! namespaces of client addresses, the bpffs and cgroup2 mounts, and the
//! NodePort range kept out of the ephemeral ports.
pub(crate) mod client_netns;
pub(crate) mod devices;
pub(crate) mod fs;
pub(crate) mod local_addrs;
pub mod memory;
pub mod nodeport_addresses;
pub(crate) mod pod_devices;
pub(crate) mod port_reservation;
pub mod reserved_ports;
