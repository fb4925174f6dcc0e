//! The one translation between the model's types and the bytes of the maps
//! (`proxy_common`'s `#[repr(C)]` types), both ways: frontend keys, scopes,
//! protocols, slot 0's flags, backends, rev-NAT entries, source ranges and
//! service names. Pure functions, no aya: the reconciler writes with it,
//! recovery, `ebpf-proxy service`, the session purge and the tests read with
//! it.
//!
//! Encoding never fails. Decoding meets bytes the agent never writes (a map
//! filled by another build, a bit flipped by hand): those give a
//! `DecodeError`, never a panic, and each reader decides what to do with
//! them (recovery deletes the entry, `ebpf-proxy service` shows it as
//! unknown). Addresses come back in the form the model uses: the maps hold
//! IPv4 as IPv4-mapped IPv6, so `::ffff:a.b.c.d` decodes as `a.b.c.d`.
use std::{fmt, net::IpAddr};

use ipnet::IpNet;
use proxy_common::{
    Addr, Backend as BackendValue, RevNat, RevNatId, SOURCE_RANGE_ID_BITS, ServiceKey, ServiceName, ServiceValue,
    SockBackendKey, SockRevNat, SockRevNatKey, SourceRange, backend_flags, backend_state,
    net::{decode as decode_addr, encode as encode_addr},
    scope, service_flags,
};

use crate::model::{
    BackendState, Forwarding, Frontend, FrontendKey, FrontendKind, LbAlgorithm, Protocol, Reach, Scope, ServicePort,
};

/// Bytes of a map the agent never writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// An unknown IP protocol number.
    #[error("unknown IP protocol number {0} (the agent writes only TCP 6 and UDP 17)")]
    Protocol(u8),
    /// An unknown frontend scope.
    #[error("unknown frontend scope {0} (the agent writes only 0 and 1)")]
    Scope(u8),
    /// Flags naming more than one algorithm.
    #[error("frontend flags {0:#06x} name more than one load-balancing algorithm")]
    Algorithm(u16),
    /// Flags naming both forwarding modes.
    #[error("frontend flags {0:#06x} name both source NAT and DSR")]
    Forwarding(u16),
    /// Flags naming more than one kind.
    #[error("frontend flags {0:#06x} name more than one kind")]
    Kind(u16),
    /// Unknown frontend flag bits.
    #[error("unknown frontend flag bits {0:#06x}")]
    FrontendFlags(u16),
    /// An unknown backend state.
    #[error("unknown backend state {0} (the agent writes only 0 and 1)")]
    BackendState(u8),
    /// Unknown backend flag bits.
    #[error("unknown backend flag bits {0:#04x}")]
    BackendFlags(u8),
}

/// A backend as the maps know it: address, port and protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendAddr {
    pub(crate) addr: IpAddr,
    /// The port.
    pub port: u16,
    pub(crate) protocol: Protocol,
}

impl fmt::Display for BackendAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.port),
        }
    }
}

/// A `BACKENDS` value in the model's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackendEntry {
    /// The backend's address, port and protocol.
    pub addr: BackendAddr,
    pub(crate) state: BackendState,
    /// The endpoint runs on this node.
    pub(crate) local: bool,
}

/// An address and a network-order port of the maps, as the model has them.
#[must_use]
pub fn endpoint_of(addr: &Addr, port: u16) -> (IpAddr, u16) {
    (decode_addr(addr), u16::from_be(port))
}

/// The IP protocol number of `protocol` (the model's own mapping).
#[must_use]
pub(crate) const fn protocol_number(protocol: Protocol) -> u8 {
    protocol.number()
}

/// The protocol of an IP protocol number.
pub(crate) const fn protocol_of(number: u8) -> Result<Protocol, DecodeError> {
    match Protocol::from_number(number) {
        Some(p) => Ok(p),
        None => Err(DecodeError::Protocol(number)),
    }
}

/// `ServiceKey.scope` of a scope.
#[must_use]
pub(crate) const fn scope_number(s: Scope) -> u8 {
    match s {
        Scope::All => scope::ALL,
        Scope::External => scope::EXTERNAL,
    }
}

/// The scope of a `ServiceKey.scope`.
pub(crate) const fn scope_of(number: u8) -> Result<Scope, DecodeError> {
    match number {
        scope::ALL => Ok(Scope::All),
        scope::EXTERNAL => Ok(Scope::External),
        _ => Err(DecodeError::Scope(number)),
    }
}

/// The `SERVICES` key of slot `slot` of frontend `key`, padding zeroed.
#[must_use]
pub fn service_key(key: FrontendKey, slot: u16) -> ServiceKey {
    ServiceKey {
        scope: scope_number(key.scope),
        ..ServiceKey::new(encode_addr(key.addr), key.port.to_be(), protocol_number(key.protocol), slot)
    }
}

/// Backend slots per `SERVICES` entry (`proxy_common::SLOTS_PER_ENTRY`).
pub(crate) const SLOTS_PER_ENTRY: usize = proxy_common::SLOTS_PER_ENTRY as usize;

/// How many slots entries `slots` backends take.
#[must_use]
pub(crate) const fn slot_entries(slots: usize) -> usize {
    slots.div_ceil(SLOTS_PER_ENTRY)
}

/// The `SERVICES` key of slots entry `entry` (0-based: it holds slots
/// `entry * SLOTS_PER_ENTRY ..`, counted from 0) of frontend `key`.
#[must_use]
pub(crate) fn slots_key(key: FrontendKey, entry: usize) -> ServiceKey {
    service_key(key, u16::try_from(entry + 1).expect("the model caps backends at u16::MAX"))
}

/// Slots entry `entry` of a frontend whose backend ids are `ids`, in slot
/// order: the ids from `entry * SLOTS_PER_ENTRY` on, 0 past the end.
#[must_use]
pub(crate) fn slots_value(ids: &[u32], entry: usize) -> ServiceValue {
    let mut words = [0; SLOTS_PER_ENTRY];
    for (word, id) in words.iter_mut().zip(ids.iter().skip(entry * SLOTS_PER_ENTRY)) {
        *word = *id;
    }
    ServiceValue::slots(words)
}

/// Slot 0 of `frontend` with `count` backends in its slots: its rev-NAT
/// id, flags (`FrontendFlags::encode`), Maglev table (0: none) and
/// affinity timeout.
#[must_use]
pub(crate) fn slot_zero_value(
    frontend: &Frontend,
    count: usize,
    rev_nat: RevNatId,
    flags: u16,
    maglev: u16,
) -> ServiceValue {
    let count = u16::try_from(count).expect("the model caps backends at u16::MAX");
    ServiceValue::frontend(count, rev_nat, flags, maglev, frontend.affinity_timeout.unwrap_or(0))
}

/// The frontend and slot a `SERVICES` key names (0: slot 0; `n`: slots
/// entry `n - 1`).
pub(crate) fn frontend_of(key: &ServiceKey) -> Result<(FrontendKey, u16), DecodeError> {
    let (addr, port) = endpoint_of(&key.addr, key.port);
    Ok((FrontendKey { addr, port, protocol: protocol_of(key.proto)?, scope: scope_of(key.scope)? }, key.slot))
}

/// The kind bit of slot 0's flags.
#[must_use]
pub(crate) const fn kind_flag(kind: FrontendKind) -> u16 {
    match kind {
        FrontendKind::ClusterIp => service_flags::CLUSTER_IP,
        FrontendKind::NodePort => service_flags::NODE_PORT,
        FrontendKind::LoadBalancer => service_flags::LOAD_BALANCER,
        FrontendKind::ExternalIp => service_flags::EXTERNAL_IP,
    }
}

/// Every bit slot 0's flags may hold.
const KNOWN_FLAGS: u16 = service_flags::CLUSTER_IP
    | service_flags::AFFINITY
    | service_flags::EXTERNAL_KINDS
    | service_flags::TWO_SCOPES
    | service_flags::EXTERNAL_ONLY
    | service_flags::SOURCE_RANGES
    | service_flags::LEAST_CONNECTIONS
    | service_flags::MAGLEV
    | service_flags::FORWARD_SNAT
    | service_flags::FORWARD_DSR;

/// Slot 0's `flags`, bit by bit.
#[expect(clippy::struct_excessive_bools, reason = "each bool mirrors one independent flag bit of the map")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct FrontendFlags {
    pub(crate) kind: FrontendKind,
    /// sessionAffinity: ClientIP.
    pub(crate) affinity: bool,
    /// Only traffic from outside the node uses the entry.
    pub(crate) outside_only: bool,
    /// Traffic from outside uses the scope `External` twin.
    pub(crate) two_scopes: bool,
    /// loadBalancerSourceRanges restrict traffic from outside.
    pub(crate) source_ranges: bool,
    /// How a new connection picks its backend.
    pub(crate) algorithm: LbAlgorithm,
    /// The service's `nodeport-mode` (`None`: the node's).
    pub(crate) forwarding: Option<Forwarding>,
}

impl FrontendFlags {
    /// The flags of `frontend` at `key`: `EXTERNAL_ONLY` and `TWO_SCOPES`
    /// only on scope `All` entries, `TWO_SCOPES` once the twin is written.
    #[must_use]
    pub(crate) fn of(key: FrontendKey, frontend: &Frontend, twin_written: bool) -> Self {
        let all = key.scope == Scope::All;
        Self {
            kind: frontend.kind,
            affinity: frontend.affinity_timeout.is_some(),
            outside_only: all && frontend.reach == Reach::Outside,
            two_scopes: all && twin_written,
            source_ranges: frontend.source_ranges.is_some(),
            algorithm: frontend.lb_algorithm,
            forwarding: frontend.forwarding,
        }
    }

    #[must_use]
    pub(crate) const fn encode(self) -> u16 {
        kind_flag(self.kind)
            | bit(self.affinity, service_flags::AFFINITY)
            | bit(self.outside_only, service_flags::EXTERNAL_ONLY)
            | bit(self.two_scopes, service_flags::TWO_SCOPES)
            | bit(self.source_ranges, service_flags::SOURCE_RANGES)
            | algorithm_flag(self.algorithm)
            | forwarding_flag(self.forwarding)
    }

    /// The flags of `bits`: at most one kind bit, no unknown bit. The
    /// programs never read `CLUSTER_IP`: an entry without a kind bit is
    /// served as a ClusterIP is (to clients on the node only), so it reads
    /// as one (and is written back with the bit).
    pub(crate) const fn decode(bits: u16) -> Result<Self, DecodeError> {
        if bits & !KNOWN_FLAGS != 0 {
            return Err(DecodeError::FrontendFlags(bits & !KNOWN_FLAGS));
        }
        let kind = match bits & (service_flags::CLUSTER_IP | service_flags::EXTERNAL_KINDS) {
            0 | service_flags::CLUSTER_IP => FrontendKind::ClusterIp,
            service_flags::NODE_PORT => FrontendKind::NodePort,
            service_flags::LOAD_BALANCER => FrontendKind::LoadBalancer,
            service_flags::EXTERNAL_IP => FrontendKind::ExternalIp,
            _ => return Err(DecodeError::Kind(bits)),
        };
        Ok(Self {
            kind,
            affinity: bits & service_flags::AFFINITY != 0,
            outside_only: bits & service_flags::EXTERNAL_ONLY != 0,
            two_scopes: bits & service_flags::TWO_SCOPES != 0,
            source_ranges: bits & service_flags::SOURCE_RANGES != 0,
            algorithm: match bits & (service_flags::LEAST_CONNECTIONS | service_flags::MAGLEV) {
                0 => LbAlgorithm::Random,
                service_flags::LEAST_CONNECTIONS => LbAlgorithm::LeastConnections,
                service_flags::MAGLEV => LbAlgorithm::Maglev,
                _ => return Err(DecodeError::Algorithm(bits)),
            },
            forwarding: match bits & (service_flags::FORWARD_SNAT | service_flags::FORWARD_DSR) {
                0 => None,
                service_flags::FORWARD_SNAT => Some(Forwarding::Snat),
                service_flags::FORWARD_DSR => Some(Forwarding::Dsr),
                _ => return Err(DecodeError::Forwarding(bits)),
            },
        })
    }
}

/// The forwarding bit of slot 0's flags (none: the node's mode).
#[must_use]
pub(crate) const fn forwarding_flag(forwarding: Option<Forwarding>) -> u16 {
    match forwarding {
        None => 0,
        Some(Forwarding::Snat) => service_flags::FORWARD_SNAT,
        Some(Forwarding::Dsr) => service_flags::FORWARD_DSR,
    }
}

/// The algorithm bit of slot 0's flags (none for `Random`).
#[must_use]
pub(crate) const fn algorithm_flag(algorithm: LbAlgorithm) -> u16 {
    match algorithm {
        LbAlgorithm::Random => 0,
        LbAlgorithm::LeastConnections => service_flags::LEAST_CONNECTIONS,
        LbAlgorithm::Maglev => service_flags::MAGLEV,
    }
}

/// `flag` when `set`.
const fn bit(set: bool, flag: u16) -> u16 {
    if set { flag } else { 0 }
}

/// Whether slot 0's `bits` send traffic from outside to the external twin
/// (read alone: the kernel programs test this bit whatever the others are).
#[must_use]
pub(crate) const fn says_two_scopes(bits: u16) -> bool {
    bits & service_flags::TWO_SCOPES != 0
}

/// `Backend.state` of a state.
#[must_use]
pub(crate) const fn state_number(state: BackendState) -> u8 {
    match state {
        BackendState::Active => backend_state::ACTIVE,
        BackendState::Terminating => backend_state::TERMINATING,
    }
}

/// The state of a `Backend.state`.
pub(crate) const fn state_of(number: u8) -> Result<BackendState, DecodeError> {
    match number {
        backend_state::ACTIVE => Ok(BackendState::Active),
        backend_state::TERMINATING => Ok(BackendState::Terminating),
        _ => Err(DecodeError::BackendState(number)),
    }
}

/// `Backend.flags` of a backend that is (or is not) on this node.
#[must_use]
pub(crate) const fn local_flags(local: bool) -> u8 {
    if local { backend_flags::LOCAL } else { 0 }
}

/// Whether `Backend.flags` say the backend is on this node.
pub(crate) const fn local_of(flags: u8) -> Result<bool, DecodeError> {
    if flags & !backend_flags::LOCAL != 0 {
        return Err(DecodeError::BackendFlags(flags));
    }
    Ok(flags & backend_flags::LOCAL != 0)
}

/// The `BACKENDS` value of a backend, padding zeroed.
#[must_use]
pub fn backend_value(entry: BackendEntry) -> BackendValue {
    BackendValue {
        addr: encode_addr(entry.addr.addr),
        port: entry.addr.port.to_be(),
        proto: protocol_number(entry.addr.protocol),
        state: state_number(entry.state),
        flags: local_flags(entry.local),
        pad: [0; 3],
    }
}

/// Which backend a `BACKENDS` value is (its state and flags unread: what
/// recovery needs to find it again).
pub(crate) fn backend_addr(value: &BackendValue) -> Result<BackendAddr, DecodeError> {
    let (addr, port) = endpoint_of(&value.addr, value.port);
    Ok(BackendAddr { addr, port, protocol: protocol_of(value.proto)? })
}

/// A `BACKENDS` value in full.
pub fn backend_entry(value: &BackendValue) -> Result<BackendEntry, DecodeError> {
    Ok(BackendEntry { addr: backend_addr(value)?, state: state_of(value.state)?, local: local_of(value.flags)? })
}

/// The `REVNAT` value of frontend `key`: the address and port replies
/// appear to come from.
#[must_use]
pub fn rev_nat_value(key: FrontendKey) -> RevNat {
    RevNat { addr: encode_addr(key.addr), port: key.port.to_be(), pad: 0 }
}

#[cfg(test)]
/// The address and port of a `REVNAT` value.
#[must_use]
pub(crate) fn rev_nat_of(value: &RevNat) -> (IpAddr, u16) {
    endpoint_of(&value.addr, value.port)
}

/// The `SOCK_REVNAT` key of socket `cookie` translated to a backend.
#[must_use]
pub(crate) fn sock_revnat_key(cookie: u64, backend: IpAddr, port: u16) -> SockRevNatKey {
    SockRevNatKey { cookie, addr: encode_addr(backend), port: port.to_be(), pad: [0; 6] }
}

/// The frontend a `SOCK_REVNAT` value names, for a socket of `protocol`
/// (the value does not hold it: the socket does).
#[must_use]
pub(crate) fn sock_revnat_frontend(value: &SockRevNat, protocol: Protocol) -> FrontendKey {
    let (addr, port) = endpoint_of(&value.addr, value.port);
    FrontendKey::new(addr, port, protocol)
}

/// The frontend a `SOCK_BACKEND` key names.
pub(crate) fn sock_backend_frontend(key: &SockBackendKey) -> Result<FrontendKey, DecodeError> {
    let (addr, port) = endpoint_of(&key.addr, key.port);
    Ok(FrontendKey::new(addr, port, protocol_of(key.proto)?))
}

/// The LPM prefix length and key of source range `net` of frontend
/// `rev_nat` (an IPv4 network sits below the 96 bits of `::ffff:0:0/96`).
#[must_use]
pub(crate) fn source_range(rev_nat: RevNatId, net: IpNet) -> (u32, SourceRange) {
    let (addr, bits) = match net {
        IpNet::V4(n) => (encode_addr(IpAddr::V4(n.network())), 96 + u32::from(n.prefix_len())),
        IpNet::V6(n) => (encode_addr(IpAddr::V6(n.network())), u32::from(n.prefix_len())),
    };
    (SOURCE_RANGE_ID_BITS + bits, SourceRange { rev_nat: rev_nat.to_be(), addr })
}

/// The frontend and network of an LPM key (`None`: a prefix the agent
/// never writes).
#[must_use]
pub(crate) fn source_range_of(prefix_len: u32, key: &SourceRange) -> Option<(RevNatId, IpNet)> {
    let bits = prefix_len.checked_sub(SOURCE_RANGE_ID_BITS)?;
    let net = match decode_addr(&key.addr) {
        IpAddr::V4(a) => IpNet::new(IpAddr::V4(a), u8::try_from(bits.checked_sub(96)?).ok()?).ok()?,
        a @ IpAddr::V6(_) => IpNet::new(a, u8::try_from(bits).ok()?).ok()?,
    };
    Some((RevNatId::from_be(key.rev_nat), net))
}

/// `text` cut to at most `N - 1` bytes (at a character boundary), zero-padded.
fn field<const N: usize>(text: &str) -> [u8; N] {
    let mut end = text.len().min(N - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = [0; N];
    out[..end].copy_from_slice(&text.as_bytes()[..end]);
    out
}

/// The text of a zero-padded field (bytes that are not UTF-8 replaced).
fn text(field: &[u8]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// The `SERVICE_NAMES` value of a service port (longer parts than
/// Kubernetes allows are cut).
#[must_use]
pub(crate) fn service_name(port: &ServicePort) -> ServiceName {
    ServiceName { namespace: field(port.namespace()), name: field(port.name()), port: field(port.port()) }
}

/// The service port a `SERVICE_NAMES` value names.
#[must_use]
pub(crate) fn service_port_of(name: &ServiceName) -> ServicePort {
    ServicePort::new(text(&name.namespace), text(&name.name), text(&name.port))
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
