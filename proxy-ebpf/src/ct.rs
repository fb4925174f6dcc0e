//! Connection tracking for traffic from outside the node: an entry per
//! direction of a flow (`CT`, LRU), so every packet of a flow reaches the
//! backend its first packet chose and replies find their way back. Entries
//! expire when unused for their lifetime (shorter once the connection
//! closes); the LRU evicts the oldest when the map is full. A source-NATed
//! flow's reply entry holds its port on the node's address: while the flow
//! lives, and after it closes only until the backend is done with the tuple
//! (`holds_port`).
use proxy_common::{Addr, CtKey, CtValue, ct_dir, ct_flags, ct_lifetime, flow_hash, proto, snat_ports};

use crate::{
    access::now_ns,
    maps::{count_flow, ct_entry, ct_insert, ct_remove, ct_update, uncount_active},
    packet::{Packet, TCP_FIN, TCP_RST},
};

const NS_PER_SEC: u64 = 1_000_000_000;
/// An entry's last-use time is written at most this often (a write per
/// packet would cost more than the lookup).
const REFRESH_NS: u64 = NS_PER_SEC;
/// Source NAT ports tried for a new flow before giving up: with ports
/// picked at random, a new flow fails only when the backend's ports are
/// nearly all held (at 90 % taken, 1 in 850). Cilium tries 32, or 128 where
/// the kernel allows a million instructions (`SNAT_COLLISION_RETRIES`,
/// bpf/lib/nat.h); the loop stays bounded for the verifier.
const SNAT_TRIES: u32 = 64;

#[inline(always)]
fn lifetime_ns(protocol: u8, flags: u8) -> u64 {
    ct_lifetime::of(protocol, flags) * NS_PER_SEC
}

#[inline(always)]
fn live(entry: &CtValue, protocol: u8, now: u64) -> bool {
    now.saturating_sub(entry.last_seen_ns) < lifetime_ns(protocol, entry.flags)
}

/// Whether the reply entry `entry` still holds its SNAT port: a TCP flow
/// closed by an RST does not (both ends dropped the connection), one closed
/// by both FINs for `ct_lifetime::TCP_PORT_AFTER_FINS` (its last ACK), any
/// other while it lives (a half-closed flow may still carry data).
#[inline(always)]
fn holds_port(entry: &CtValue, protocol: u8, now: u64) -> bool {
    if protocol == proto::TCP {
        if entry.flags & ct_flags::RESET != 0 {
            return false;
        }
        if entry.flags & ct_flags::FIN_BOTH == ct_flags::FIN_BOTH {
            return now.saturating_sub(entry.last_seen_ns) < ct_lifetime::TCP_PORT_AFTER_FINS * NS_PER_SEC;
        }
    }
    live(entry, protocol, now)
}

/// The `ct_flags` a packet going `dir` brings to its flow: closing on a
/// FIN (and which end sent it) or an RST; none for other packets.
#[inline(always)]
fn closing_flags(pkt: &Packet, dir: u8) -> u8 {
    let mut flags = 0;
    if pkt.tcp_flags & TCP_RST != 0 {
        flags |= ct_flags::CLOSING | ct_flags::RESET;
    }
    if pkt.tcp_flags & TCP_FIN != 0 {
        flags |= ct_flags::CLOSING | if dir == ct_dir::ORIGINAL { ct_flags::FIN_ORIGINAL } else { ct_flags::FIN_REPLY };
    }
    flags
}

/// The live entry of the packet's flow in direction `dir` (its key is
/// the packet as it is), refreshed for this packet (last use, and the
/// closing flags of a TCP FIN or RST, on both directions' entries); `None`
/// when there is none. Returned, not written into a caller's zeroed
/// value: zeroing is a byte-wise `memset` loop on BPF.
#[inline(never)]
pub fn lookup(pkt: &Packet, dir: u8) -> Option<CtValue> {
    let key = &pkt.ct_key(dir);
    let entry = ct_entry(key)?;
    let now = now_ns();
    if !live(entry, key.proto, now) {
        // A counted flow that ended unseen: its count is taken back here,
        // once (the agent's sweep takes back those no packet comes back
        // for: docs/design.md, "Balancing by load").
        if entry.flags & ct_flags::COUNTED != 0 {
            entry.flags &= !ct_flags::COUNTED;
            uncount_active(entry.backend_id, &entry.addr, entry.port);
        }
        return None;
    }
    let closing = closing_flags(pkt, dir);
    let mut touch_other = false;
    if entry.flags & closing != closing {
        entry.flags |= closing;
        entry.last_seen_ns = now;
        touch_other = true;
    } else if now.saturating_sub(entry.last_seen_ns) > REFRESH_NS {
        entry.last_seen_ns = now;
        touch_other = true;
    }
    // A flow left to netfilter has no other entry here.
    if touch_other && entry.flags & ct_flags::KERNEL == 0 {
        update_other(key, entry, closing, now);
    }
    // Copied straight into the caller's slot: a copy on this frame would
    // grow the programs' deepest call chains.
    Some(*entry)
}

/// `lookup` into `out`, for a caller that holds its flow in one slot,
/// found or new (`nodeport::to_frontend`, whose frame is on the deepest
/// chain); false when there is none. Out of line: the found entry is
/// held on this frame, not on the caller's.
#[inline(never)]
pub fn lookup_into(pkt: &Packet, dir: u8, out: &mut CtValue) -> bool {
    match lookup(pkt, dir) {
        Some(found) => {
            *out = found;
            true
        }
        None => false,
    }
}

/// The flow whose original entry has `key` ends before its entry expires
/// (a new flow takes over its tuple: a SYN on a closing one, one whose
/// backend went): its active connection is taken back, once.
#[inline(never)]
fn end_count(key: &CtKey) {
    ct_update(key, |entry| {
        if entry.flags & ct_flags::COUNTED != 0 {
            entry.flags &= !ct_flags::COUNTED;
            uncount_active(entry.backend_id, &entry.addr, entry.port);
        }
    });
}

/// Marks the packet's flow as netfilter's: its packets go to the kernel
/// untouched (`ct_flags::KERNEL`). The caller found no live flow of ours
/// on the tuple, or a closing one a SYN reopens: that one is replaced
/// (its active connection taken back), or the new connection's SYN would
/// go to netfilter and its later segments to the old flow's backend.
#[inline(never)]
pub fn leave_to_kernel(pkt: &Packet, rev_nat: u32) {
    let key = &pkt.ct_key(ct_dir::ORIGINAL);
    end_count(key);
    let entry = CtValue { rev_nat, flags: ct_flags::KERNEL, last_seen_ns: now_ns(), ..CtValue::default() };
    ct_insert(key, &entry);
}

/// The key of the other direction of the flow whose entry is `entry`.
#[inline(always)]
fn other_key(key: &CtKey, entry: &CtValue) -> CtKey {
    let snat = entry.flags & ct_flags::SNAT != 0;
    if key.dir == ct_dir::ORIGINAL {
        // Replies come from the backend to the client (or the SNAT address).
        let (dst, dport) = if snat { (entry.nat_addr, entry.nat_port) } else { (key.src, key.sport) };
        CtKey { src: entry.addr, dst, sport: entry.port, dport, proto: key.proto, dir: ct_dir::REPLY, pad: [0; 2] }
    } else {
        let (src, sport) = if snat { (entry.nat_addr, entry.nat_port) } else { (key.dst, key.dport) };
        CtKey { src, dst: entry.addr, sport, dport: entry.port, proto: key.proto, dir: ct_dir::ORIGINAL, pad: [0; 2] }
    }
}

/// Keeps the other direction's entry alive with this one (a flow may send
/// one way only for a long time; its other entry must not be taken
/// meanwhile) and gives it this one's new closing `flags`. Only if it is
/// still this flow's: a closed flow's reply entry may since have been
/// taken by a new flow on the same SNAT port (`holds_port`), which a late
/// packet of the old flow must not close. Out of line: the other key is
/// on its own frame, not on `lookup`'s, which is on the deepest chains.
#[inline(never)]
fn update_other(key: &CtKey, entry: &CtValue, flags: u8, now: u64) {
    ct_update(&other_key(key, entry), |other| {
        if points_back(other, key) {
            other.flags |= flags;
            other.last_seen_ns = now;
        }
    });
}

/// Whether `other`, the entry of the other direction, belongs to the flow
/// whose entry in direction `key.dir` has `key`: it translates back to it.
#[inline(always)]
fn points_back(other: &CtValue, key: &CtKey) -> bool {
    if key.dir == ct_dir::ORIGINAL {
        // A reply entry: back to the client.
        other.nat_addr == key.src && other.nat_port == key.sport
    } else {
        // An original entry: to the backend, from the SNAT port if any.
        other.addr == key.src
            && other.port == key.sport
            && (other.flags & ct_flags::SNAT == 0 || other.nat_port == key.dport)
    }
}

/// Records a new flow: the packet's tuple as it arrived (client to
/// frontend) translates to `value`, counted as an active connection of
/// its backend (`ct_flags::COUNTED`) once recorded. For a source-NATed
/// flow a free port on the SNAT address is chosen and written to
/// `value.nat_port`; `false` when none is free.
#[inline(never)]
pub fn create(pkt: &Packet, value: &mut CtValue) -> bool {
    value.last_seen_ns = now_ns();
    // Counted here, not in `nodeport::new_flow`, whose frame is on the
    // programs' deepest call chain (docs/design.md, "Balancing by load").
    let key = &pkt.ct_key(ct_dir::ORIGINAL);
    end_count(key);
    value.flags |= ct_flags::COUNTED;
    if value.flags & ct_flags::SNAT == 0 {
        if !insert_reply(pkt, value) {
            return false;
        }
    } else {
        let port = snat_port(pkt, value);
        if port == 0 {
            return false;
        }
        value.nat_port = port;
    }
    let created = ct_insert(key, value);
    if created {
        count_flow(value.backend_id);
    }
    created
}

/// Moves DSR flow `value` (its entry, as found for the packet's tuple) to
/// source NAT from `value.nat_addr`, which the caller sets: a free port
/// claimed by a new reply entry, the old one (from the backend to the
/// client) removed, the flow's entry rewritten. Its backend and its count
/// as an active connection stay. `false` when no port is free (the flow
/// stays as it was).
#[inline(never)]
pub fn dsr_to_snat(pkt: &Packet, value: &mut CtValue) -> bool {
    let key = &pkt.ct_key(ct_dir::ORIGINAL);
    let direct_reply = other_key(key, value);
    value.flags = (value.flags & !ct_flags::DSR) | ct_flags::SNAT;
    value.last_seen_ns = now_ns();
    let port = snat_port(pkt, value);
    if port == 0 {
        return false;
    }
    value.nat_port = port;
    ct_remove(&direct_reply);
    ct_insert(key, value)
}

/// The reply entry of a new flow: from the backend back to the frontend
/// (and, with SNAT, to the client).
#[inline(always)]
fn reply_entry(pkt: &Packet, value: &CtValue) -> CtValue {
    CtValue {
        addr: pkt.dst,
        nat_addr: pkt.src,
        port: pkt.dport,
        nat_port: pkt.sport,
        rev_nat: value.rev_nat,
        backend_id: value.backend_id,
        flags: value.flags & ct_flags::SNAT,
        pad: [0; 3],
        last_seen_ns: value.last_seen_ns,
    }
}

/// Inserts the reply entry of a flow without source NAT (the backend
/// answers the client directly, through this node).
#[inline(never)]
fn insert_reply(pkt: &Packet, value: &CtValue) -> bool {
    ct_insert(&other_key(&pkt.ct_key(ct_dir::ORIGINAL), value), &reply_entry(pkt, value))
}

/// Records, on the backend's node, a DSR flow to a backend here: its
/// replies (from the backend to the client) leave with the frontend the
/// packet's DSR option names as their source (`nodeport::egress`).
/// Replaces an older entry of the same tuple.
#[inline(never)]
pub fn record_dsr(pkt: &Packet, frontend: &Addr, rev_nat: u32, backend_id: u32) -> bool {
    let key = CtKey {
        src: pkt.dst,
        dst: pkt.src,
        sport: pkt.dport,
        dport: pkt.sport,
        proto: pkt.proto,
        dir: ct_dir::REPLY,
        pad: [0; 2],
    };
    let value = CtValue {
        addr: *frontend,
        nat_addr: pkt.src,
        port: pkt.dsr_port,
        nat_port: pkt.sport,
        rev_nat,
        backend_id,
        flags: ct_flags::DSR,
        pad: [0; 3],
        last_seen_ns: now_ns(),
    };
    ct_insert(&key, &value)
}

/// Scatters `x` over all 32 bits (lowbias32, a murmur3-style finalizer):
/// the candidates of one flow, and those of flows with close hashes, land
/// on unrelated ports. A fixed stride would make every flow probe the same
/// sequence, and a busy stretch of it would fail many flows at once.
#[inline(always)]
fn mix(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Claims a port on `value.nat_addr` towards the backend by inserting the
/// reply entry for it: the first of `SNAT_TRIES` candidates (derived from
/// the flow, so a retried flow gets the same one) no flow holds
/// (`holds_port`).
/// Returns the port (network order), or 0 when none is free.
#[inline(never)]
fn snat_port(pkt: &Packet, value: &CtValue) -> u16 {
    let now = value.last_seen_ns;
    let reply = &reply_entry(pkt, value);
    let span = u32::from(snat_ports::MAX - snat_ports::MIN) + 1;
    let start = flow_hash(&pkt.src, pkt.sport, pkt.dport, pkt.proto ^ 0x5a);
    let mut key = CtKey {
        src: value.addr,
        dst: value.nat_addr,
        sport: value.port,
        dport: 0,
        proto: pkt.proto,
        dir: ct_dir::REPLY,
        pad: [0; 2],
    };
    for i in 0..SNAT_TRIES {
        #[expect(clippy::cast_possible_truncation, reason = "below span, which fits u16 with MIN")]
        let port = (snat_ports::MIN + (mix(start.wrapping_add(i.wrapping_mul(0x9e37_79b9))) % span) as u16).to_be();
        key.dport = port;
        if ct_update(&key, |taken| holds_port(taken, pkt.proto, now)) == Some(true) {
            continue;
        }
        if ct_insert(&key, reply) {
            return port;
        }
    }
    0
}
