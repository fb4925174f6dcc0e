//! The pods' own traffic to services, per packet, on the node's pod-facing
//! devices (the host side of pod veths, and the bridges holding pod
//! routes): for traffic no translated socket sees. A pod the socket
//! programs leave alone (`--socket-lb host-namespace`, as a service mesh's
//! sidecar needs: its `SO_ORIGINAL_DST` must be the service), a VM or
//! sandbox whose own kernel opens the connection, anything behind a bridge.
//!
//! The translation is the outside path's (`nodeport.rs`, `ct.rs`, one copy
//! of the conntrack, NAT and rewrite code), run with `Tc<true>` as its
//! frame (`Frame::FROM_POD`). What differs is said here:
//! - the frontend is the one a client on the node reaches (scope `ALL`, as
//!   the socket programs look it up): ClusterIPs, externalIPs,
//!   LoadBalancer IPs and NodePorts on the node's addresses; an
//!   externalIP left to its real owner (`EXTERNAL_ONLY`) is passed;
//! - the backend is chosen as the socket programs choose it: the client's
//!   affine backend (`sessionAffinity: ClientIP`, the client named by its
//!   address, not its network namespace), else by the frontend's
//!   algorithm (`balance.rs`: a random slot, or least connections);
//! - no source NAT, so backends see the pod's address, except for hairpin
//!   (a pod reaching itself through its service): its packets would come
//!   back with its own address as source, which its stack drops as
//!   martian, so they take the node's address on the way back, as
//!   kube-proxy masquerades hairpin traffic;
//! - the egress program on the same device gives replies the frontend as
//!   their source again, whichever node the backend is on: every reply to
//!   the pod passes there.
use proxy_common::{Addr, AffinityKey, AffinityValue, ServiceKey, ServiceValue, service_flags};

use crate::{
    access::now_ns,
    maps::{affinity, backend, remember_affinity, service},
    packet::Packet,
};

/// Marks an `AffinityKey::client` made of an address (the per-packet
/// path) apart from a network namespace cookie (the socket path), which
/// the kernel counts up from 1.
const CLIENT_BY_ADDRESS: u64 = 1 << 63;

/// The frontend a pod reaches at the packet's destination (scope `ALL`),
/// and whether its service has any endpoint; `None` when it is not a
/// frontend or an externalIP a pod reaches at its real address.
#[inline(always)]
pub fn frontend(pkt: &Packet) -> Option<(ServiceKey, ServiceValue, bool)> {
    let key = ServiceKey::new(pkt.dst, pkt.dport, pkt.proto, 0);
    let frontend = service(&key)?;
    if frontend.flags & service_flags::EXTERNAL_ONLY != 0 {
        return None;
    }
    Some((key, frontend, frontend.count != 0))
}

/// The backend id of a new flow of a pod to `frontend` (its count is not
/// 0): the client's affine backend while it lives, else a random slot, as
/// the socket programs choose (`sock.rs`); 0 when none.
#[inline(never)]
pub fn pick_backend(pkt: &Packet, key: &ServiceKey, frontend: &ServiceValue) -> u32 {
    if frontend.flags & service_flags::AFFINITY == 0 {
        return random_slot(key, frontend);
    }
    let affinity_key = AffinityKey { client: client_id(&pkt.src), rev_nat: frontend.rev_nat, pad: 0 };
    let now = now_ns();
    if let Some(entry) = affinity(&affinity_key)
        && now.saturating_sub(entry.last_used_ns) < u64::from(frontend.affinity_timeout()) * 1_000_000_000
        && backend(entry.backend_id).is_some()
    {
        remember_affinity(&affinity_key, &AffinityValue { last_used_ns: now, ..entry });
        return entry.backend_id;
    }
    let id = random_slot(key, frontend);
    if id != 0 {
        remember_affinity(&affinity_key, &AffinityValue { backend_id: id, pad: 0, last_used_ns: now });
    }
    id
}

/// The backend id for a new flow by the frontend's algorithm (a random
/// slot, or the less loaded of two: `balance`); 0 when none.
#[inline(always)]
fn random_slot(key: &ServiceKey, frontend: &ServiceValue) -> u32 {
    let mut slots = *key;
    crate::balance::choose(&mut slots, frontend).unwrap_or(0)
}

/// A client's name in `AFFINITY` for the per-packet path: its address,
/// folded to 63 bits (an IPv4 address is kept whole).
#[inline(always)]
fn client_id(addr: &Addr) -> u64 {
    let w = addr.words();
    CLIENT_BY_ADDRESS | (u64::from(w[0] ^ w[2]) << 32 | u64::from(w[1] ^ w[3]))
}
