//! Types shared by the eBPF programs and the userspace agent.
//!
//! Everything here crosses the kernel boundary: `#[repr(C)]`, fixed sizes
//! checked at compile time, explicit padding fields that writers must zero
//! (map keys are compared bytewise). Addresses and ports are stored in network
//! byte order, exactly as the kernel hands them to the programs.
#![no_std]

/// Name of the eBPF global that switches its debug logging on.
pub const LOG_ENABLED: &str = "LOG_ENABLED";

/// Map names, as the eBPF object declares them and as they are pinned.
pub mod map_names {
    pub const SERVICES: &str = "SERVICES";
    pub const BACKENDS: &str = "BACKENDS";
    pub const REVNAT: &str = "REVNAT";
    pub const SOCK_REVNAT: &str = "SOCK_REVNAT";
    pub const SOCK_BACKEND: &str = "SOCK_BACKEND";
    pub const AFFINITY: &str = "AFFINITY";
    pub const CONNECTIONS: &str = "CONNECTIONS";
}

/// Default sizes of the maps (entries); the agent can override them at load.
pub mod map_sizes {
    /// One entry per frontend plus one per backend slot.
    pub const SERVICES: u32 = 65_536;
    pub const BACKENDS: u32 = 65_536;
    /// `rev_nat` ids are `u16`, id 0 is never used.
    pub const REVNAT: u32 = 65_535;
    /// LRU: one entry per translated socket (and backend).
    pub const SOCK_REVNAT: u32 = 131_072;
    /// LRU: one entry per unconnected UDP socket and service it sends to.
    pub const SOCK_BACKEND: u32 = 65_536;
    /// LRU: one entry per client (network namespace) and affine service.
    pub const AFFINITY: u32 = 65_536;
    /// Per-CPU counters of new connections, indexed by rev-NAT id.
    pub const CONNECTIONS: u32 = 65_536;
}

/// IP protocol numbers as they appear in `bpf_sock_addr.protocol`.
pub mod proto {
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
}

/// `ServiceKey.scope` values.
pub mod scope {
    /// Backends for every client.
    pub const ALL: u8 = 0;
}

/// `ServiceValue.flags` bits (slot 0 only).
pub mod service_flags {
    /// A ClusterIP frontend.
    pub const CLUSTER_IP: u16 = 1 << 0;
    /// sessionAffinity: ClientIP; `affinity_timeout` holds the seconds.
    pub const AFFINITY: u16 = 1 << 1;
    /// A nodePort on a node address (or 127.0.0.1).
    pub const NODE_PORT: u16 = 1 << 2;
    /// A LoadBalancer ingress IP.
    pub const LOAD_BALANCER: u16 = 1 << 3;
    /// An externalIP of this node.
    pub const EXTERNAL_IP: u16 = 1 << 4;
}

/// `Backend.state` values.
pub mod backend_state {
    /// Ready endpoint.
    pub const ACTIVE: u8 = 0;
    /// Serving but terminating: used only when a service has no ready endpoint.
    pub const TERMINATING: u8 = 1;
}

/// An IPv6 address, or an IPv4 address as IPv4-mapped IPv6
/// (`::ffff:a.b.c.d`), in network byte order. One form for both families
/// lets one set of maps serve IPv4, IPv6 and IPv4-mapped IPv6 sockets.
pub type Addr = [u8; 16];

/// The IPv4-mapped form of an IPv4 address given as its four bytes.
#[must_use]
pub const fn mapped_v4(octets: [u8; 4]) -> Addr {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, octets[0], octets[1], octets[2], octets[3]]
}

/// The IPv4 address of an IPv4-mapped one.
#[must_use]
pub const fn as_v4(addr: &Addr) -> Option<[u8; 4]> {
    let mut i = 0;
    while i < 10 {
        if addr[i] != 0 {
            return None;
        }
        i += 1;
    }
    if addr[10] == 0xff && addr[11] == 0xff { Some([addr[12], addr[13], addr[14], addr[15]]) } else { None }
}

/// Key of `SERVICES`. Slot 0 is the frontend entry; slots `1..=count` each
/// name one backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// Frontend address.
    pub addr: Addr,
    /// Frontend port, network byte order.
    pub port: u16,
    pub slot: u16,
    pub proto: u8,
    pub scope: u8,
    pub pad: [u8; 2],
}

impl ServiceKey {
    /// A key with every padding byte zeroed; `port` in network byte order.
    #[must_use]
    pub const fn new(addr: Addr, port: u16, proto: u8, slot: u16) -> Self {
        Self { addr, port, slot, proto, scope: scope::ALL, pad: [0; 2] }
    }
}

/// Value of `SERVICES`.
///
/// In slot 0 `count` is the number of backend slots, `rev_nat` the id of the
/// frontend's reverse translation and `flags` its kind; `backend_id` is 0.
/// In slots `1..=count` only `backend_id` is set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceValue {
    pub backend_id: u32,
    pub count: u16,
    pub rev_nat: u16,
    pub flags: u16,
    pub pad: u16,
    /// Session affinity timeout in seconds (0: no affinity).
    pub affinity_timeout: u32,
}

/// Value of `BACKENDS`, keyed by a `u32` backend id that is never 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    pub addr: Addr,
    /// Network byte order.
    pub port: u16,
    pub proto: u8,
    pub state: u8,
}

/// Value of `REVNAT`, keyed by the `u16` rev-NAT id of a frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RevNat {
    pub addr: Addr,
    /// Network byte order.
    pub port: u16,
    pub pad: u16,
}

/// Key of `SOCK_REVNAT`: a translated socket and the backend it reached.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SockRevNatKey {
    pub cookie: u64,
    /// Backend address.
    pub addr: Addr,
    /// Backend port, network byte order.
    pub port: u16,
    pub pad: [u8; 6],
}

/// Value of `SOCK_REVNAT`: the service address the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockRevNat {
    pub addr: Addr,
    pub port: u16,
    pub rev_nat: u16,
}

/// Key of `SOCK_BACKEND` (value: backend id): the backend an unconnected
/// UDP socket sends a service's datagrams to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SockBackendKey {
    pub cookie: u64,
    /// Service address.
    pub addr: Addr,
    /// Service port, network byte order.
    pub port: u16,
    pub proto: u8,
    pub pad: [u8; 5],
}

/// Key of `AFFINITY`: a client (its network namespace cookie) and a
/// service frontend (its rev-NAT id).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    pub client: u64,
    pub rev_nat: u16,
    pub pad: [u16; 3],
}

/// Value of `AFFINITY`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub pad: u32,
    /// `bpf_ktime_get_ns()` of the last connection that used it.
    pub last_used_ns: u64,
}

const _: () = assert!(core::mem::size_of::<ServiceKey>() == 24);
const _: () = assert!(core::mem::size_of::<ServiceValue>() == 16);
const _: () = assert!(core::mem::size_of::<Backend>() == 20);
const _: () = assert!(core::mem::size_of::<RevNat>() == 20);
const _: () = assert!(core::mem::size_of::<SockRevNatKey>() == 32);
const _: () = assert!(core::mem::size_of::<SockRevNat>() == 20);
const _: () = assert!(core::mem::size_of::<SockBackendKey>() == 32);
const _: () = assert!(core::mem::size_of::<AffinityKey>() == 16);
const _: () = assert!(core::mem::size_of::<AffinityValue>() == 16);

/// Conversions between the maps' 16-byte addresses and `std::net`.
#[cfg(feature = "user")]
pub mod net {
    extern crate std;
    use std::net::{IpAddr, Ipv6Addr};

    use super::{Addr, mapped_v4};

    /// The maps' form of an address (IPv4 as IPv4-mapped IPv6).
    #[must_use]
    pub fn encode(addr: IpAddr) -> Addr {
        match addr {
            IpAddr::V4(v4) => mapped_v4(v4.octets()),
            IpAddr::V6(v6) => v6.octets(),
        }
    }

    /// An address of the maps (IPv4-mapped comes back as IPv4).
    #[must_use]
    pub fn decode(addr: &Addr) -> IpAddr {
        Ipv6Addr::from(*addr).to_canonical()
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of them are `#[repr(C)]`, made only of integers, with every
    // padding spelled out as a field, so any bit pattern is valid.
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::ServiceValue {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::RevNat {}
    unsafe impl aya::Pod for super::SockRevNatKey {}
    unsafe impl aya::Pod for super::SockRevNat {}
    unsafe impl aya::Pod for super::SockBackendKey {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::AffinityValue {}
}
