//! Types shared by the eBPF programs and the userspace agent.
//!
//! Everything here crosses the kernel boundary: `#[repr(C)]`, fixed sizes
//! checked at compile time, explicit padding fields that writers must zero
//! (map keys are compared bytewise). Addresses and ports are stored in network
//! byte order, exactly as the kernel hands them to the programs.
#![no_std]

/// Map names, as the eBPF object declares them and as they are pinned.
/// Name of the eBPF global that switches its debug logging on.
pub const LOG_ENABLED: &str = "LOG_ENABLED";

pub mod map_names {
    pub const SERVICES_V4: &str = "SERVICES_V4";
    pub const BACKENDS_V4: &str = "BACKENDS_V4";
    pub const REVNAT_V4: &str = "REVNAT_V4";
    pub const SOCK_REVNAT_V4: &str = "SOCK_REVNAT_V4";
    pub const SOCK_BACKEND_V4: &str = "SOCK_BACKEND_V4";
    pub const AFFINITY_V4: &str = "AFFINITY_V4";
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
}

/// `BackendValue.state` values.
pub mod backend_state {
    /// Ready endpoint.
    pub const ACTIVE: u8 = 0;
    /// Serving but terminating: used only when a service has no ready endpoint.
    pub const TERMINATING: u8 = 1;
}

/// Key of `SERVICES_V4`. Slot 0 is the frontend entry; slots `1..=count` each
/// name one backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKeyV4 {
    /// Frontend address, network byte order.
    pub addr: u32,
    /// Frontend port, network byte order.
    pub port: u16,
    pub slot: u16,
    pub proto: u8,
    pub scope: u8,
    pub pad: [u8; 2],
}

impl ServiceKeyV4 {
    /// A key with every padding byte zeroed. `addr` and `port` are in network
    /// byte order.
    #[must_use]
    pub const fn new(addr: u32, port: u16, proto: u8, slot: u16) -> Self {
        Self { addr, port, slot, proto, scope: scope::ALL, pad: [0; 2] }
    }
}

/// Value of `SERVICES_V4`.
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

/// Value of `BACKENDS_V4`, keyed by a `u32` backend id that is never 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendV4 {
    /// Network byte order.
    pub addr: u32,
    /// Network byte order.
    pub port: u16,
    pub proto: u8,
    pub state: u8,
}

/// Value of `REVNAT_V4`, keyed by the `u16` rev-NAT id of a frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RevNatV4 {
    /// Network byte order.
    pub addr: u32,
    /// Network byte order.
    pub port: u16,
    pub pad: u16,
}

/// Key of `SOCK_REVNAT_V4`: a translated socket and the backend it reached.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SockRevNatKeyV4 {
    pub cookie: u64,
    /// Backend address, network byte order.
    pub addr: u32,
    /// Backend port, network byte order.
    pub port: u16,
    pub pad: u16,
}

/// Value of `SOCK_REVNAT_V4`: the service address the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockRevNatV4 {
    pub addr: u32,
    pub port: u16,
    pub rev_nat: u16,
}

/// Key of `SOCK_BACKEND_V4` (value: backend id): the backend an
/// unconnected UDP socket sends a service's datagrams to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SockBackendKeyV4 {
    pub cookie: u64,
    /// Service address, network byte order.
    pub addr: u32,
    /// Service port, network byte order.
    pub port: u16,
    pub proto: u8,
    pub pad: u8,
}

/// Key of `AFFINITY_V4`: a client (its network namespace cookie) and a
/// service frontend (its rev-NAT id).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    pub client: u64,
    pub rev_nat: u16,
    pub pad: [u16; 3],
}

/// Value of `AFFINITY_V4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub pad: u32,
    /// `bpf_ktime_get_ns()` of the last connection that used it.
    pub last_used_ns: u64,
}

const _: () = assert!(core::mem::size_of::<ServiceKeyV4>() == 12);
const _: () = assert!(core::mem::size_of::<SockRevNatKeyV4>() == 16);
const _: () = assert!(core::mem::size_of::<SockRevNatV4>() == 8);
const _: () = assert!(core::mem::size_of::<SockBackendKeyV4>() == 16);
const _: () = assert!(core::mem::size_of::<AffinityKey>() == 16);
const _: () = assert!(core::mem::size_of::<AffinityValue>() == 16);
const _: () = assert!(core::mem::size_of::<ServiceValue>() == 16);
const _: () = assert!(core::mem::size_of::<BackendV4>() == 8);
const _: () = assert!(core::mem::size_of::<RevNatV4>() == 8);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of them are `#[repr(C)]`, made only of integers, with every
    // padding spelled out as a field, so any bit pattern is valid.
    unsafe impl aya::Pod for super::ServiceKeyV4 {}
    unsafe impl aya::Pod for super::ServiceValue {}
    unsafe impl aya::Pod for super::BackendV4 {}
    unsafe impl aya::Pod for super::RevNatV4 {}
    unsafe impl aya::Pod for super::SockRevNatKeyV4 {}
    unsafe impl aya::Pod for super::SockRevNatV4 {}
    unsafe impl aya::Pod for super::SockBackendKeyV4 {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::AffinityValue {}
}
