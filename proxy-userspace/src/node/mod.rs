//! The node the agent runs on: the devices traffic arrives on, its local
//! addresses (and which serve NodePorts), the pods' devices, the network
//! namespaces of client addresses, and the bpffs and cgroup2 mounts.
pub mod client_netns;
pub mod devices;
pub mod fs;
pub mod local_addrs;
pub mod nodeport_addresses;
pub mod pod_devices;
