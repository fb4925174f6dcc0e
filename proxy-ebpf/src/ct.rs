//! Connection tracking for traffic from outside the node: an entry per
//! direction of a flow (`CT`, LRU), so every packet of a flow reaches the
//! backend its first packet chose and replies find their way back. Entries
//! expire when unused for their lifetime (shorter once the connection
//! closes); the LRU evicts the oldest when the map is full.
use proxy_common::{CtKey, CtValue, ct_dir, ct_flags, ct_lifetime, flow_hash, proto, snat_ports};

use crate::{
    access::now_ns,
    maps::{ct_insert, ct_update},
    packet::Packet,
};

const NS_PER_SEC: u64 = 1_000_000_000;
/// An entry's last-use time is written at most this often (a write per
/// packet would cost more than the lookup).
const REFRESH_NS: u64 = NS_PER_SEC;
/// Source NAT ports tried for a new flow before giving up.
const SNAT_TRIES: u32 = 16;

#[inline(always)]
fn lifetime_ns(protocol: u8, flags: u8) -> u64 {
    let seconds = if protocol != proto::TCP {
        ct_lifetime::UDP
    } else if flags & ct_flags::CLOSING != 0 {
        ct_lifetime::TCP_CLOSING
    } else {
        ct_lifetime::TCP
    };
    seconds * NS_PER_SEC
}

#[inline(always)]
fn live(entry: &CtValue, protocol: u8, now: u64) -> bool {
    now.saturating_sub(entry.last_seen_ns) < lifetime_ns(protocol, entry.flags)
}

/// Copies the live entry of the packet's flow in direction `dir` (its key
/// is the packet as it is) to `out`, refreshed for this packet (last use,
/// and closing on a TCP FIN or RST); false when there is none.
#[inline(never)]
pub fn lookup(pkt: &Packet, dir: u8, out: &mut CtValue) -> bool {
    let key = &pkt.ct_key(dir);
    let now = now_ns();
    ct_update(key, |entry| {
        if !live(entry, key.proto, now) {
            return false;
        }
        if pkt.is_closing() && entry.flags & ct_flags::CLOSING == 0 {
            entry.flags |= ct_flags::CLOSING;
            entry.last_seen_ns = now;
            mark_other_closing(key, entry);
        } else if now.saturating_sub(entry.last_seen_ns) > REFRESH_NS {
            entry.last_seen_ns = now;
            refresh_other(key, entry, now);
        }
        *out = *entry;
        true
    })
    .unwrap_or(false)
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

/// Keeps the other direction alive with this one (a flow may send one
/// way only for a long time; its other entry must not be taken meanwhile).
#[inline(always)]
fn refresh_other(key: &CtKey, entry: &CtValue, now: u64) {
    ct_update(&other_key(key, entry), |other| other.last_seen_ns = now);
}

#[inline(always)]
fn mark_other_closing(key: &CtKey, entry: &CtValue) {
    ct_update(&other_key(key, entry), |other| other.flags |= ct_flags::CLOSING);
}

/// Records a new flow: the packet's tuple as it arrived (client to
/// frontend) translates to `value`. For a source-NATed flow a free port on
/// the SNAT address is chosen and written to `value.nat_port`; `false` when
/// none is free.
#[inline(never)]
pub fn create(pkt: &Packet, value: &mut CtValue) -> bool {
    value.last_seen_ns = now_ns();
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
    ct_insert(&pkt.ct_key(ct_dir::ORIGINAL), value, false)
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
    ct_insert(&other_key(&pkt.ct_key(ct_dir::ORIGINAL), value), &reply_entry(pkt, value), false)
}

/// Claims a port on `value.nat_addr` towards the backend by inserting the
/// reply entry for it: the first of a few candidates (derived from the
/// flow, so a retried flow gets the same one) not held by a live flow.
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
        let port = (snat_ports::MIN + (start.wrapping_add(i.wrapping_mul(7919)) % span) as u16).to_be();
        key.dport = port;
        if ct_update(&key, |taken| live(taken, pkt.proto, now)) == Some(true) {
            continue;
        }
        if ct_insert(&key, reply, false) {
            return port;
        }
    }
    0
}
