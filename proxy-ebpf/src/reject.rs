//! Rejections of traffic from outside to a frontend without endpoints, as
//! kube-proxy's KUBE-EXTERNAL-SERVICES REJECT rules give them: a TCP reset
//! for TCP, an ICMP (ICMPv6) port unreachable for UDP, so the client fails
//! at once instead of waiting for a timeout. The packet is turned into its
//! reply in place (cut or grown to the reply's size, every header written
//! afresh, checksums computed from scratch) and sent back out of the device
//! it arrived on, to the neighbour it came from (the Ethernet addresses
//! swapped). Rate-limited per CPU (`reject_limit`); over the rate, and for
//! what cannot be answered (a reset, IPv4 options), the packet is dropped.
use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};
use proxy_common::{Addr, as_v4, external_stat, proto, reject_limit};

use crate::{
    access::{change_tail, now_ns, redirect_back},
    maps::{count_external, reject_budget},
    packet::{ETH_HLEN, Family, Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
};

const IPV4_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
const TCP_HLEN: usize = 20;
const ICMP_HLEN: usize = 8;
/// What an ICMP error quotes of the packet it answers: its IP header and
/// the first 8 bytes after it (the UDP header), enough for the client's
/// stack to find its socket (RFC 792; RFC 4443 allows more, not needed).
const QUOTED_V4: usize = IPV4_HLEN + 8;
const QUOTED_V6: usize = IPV6_HLEN + 8;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;
/// Destination unreachable, port unreachable.
const ICMP_DEST_UNREACH: [u8; 2] = [3, 3];
const ICMPV6_PORT_UNREACH: [u8; 2] = [1, 4];
/// Destination unreachable, fragmentation needed; packet too big.
const ICMP_FRAG_NEEDED: [u8; 2] = [3, 4];
const ICMPV6_PACKET_TOO_BIG: [u8; 2] = [2, 0];
const TTL: u8 = 64;
const NS_PER_SEC: u64 = 1_000_000_000;
/// What one reply costs of a CPU's budget, in nanoseconds of credit.
const REPLY_COST_NS: u64 = NS_PER_SEC / reject_limit::PER_SECOND;

/// Answers `pkt` with a reset or a port unreachable; returns the TC action.
/// `stats`: where the hook's counters start (`Frame::STATS_BASE`).
#[inline(never)]
pub fn reject(ctx: &TcContext, pkt: &Packet, stats: u32) -> i32 {
    if pkt.proto == proto::TCP && pkt.tcp_flags & TCP_RST != 0 {
        // A reset is never answered (RFC 9293).
        return drop_packet(stats + external_stat::NO_BACKEND);
    }
    if !take_token() {
        return drop_packet(stats + external_stat::REJECT_LIMITED);
    }
    let built = match (pkt.family(), pkt.proto == proto::TCP) {
        (Family::V4, true) => reset_v4(ctx, pkt),
        (Family::V6, true) => reset_v6(ctx, pkt),
        (Family::V4, false) => unreachable_v4(ctx, pkt, ICMP_DEST_UNREACH, 0),
        (Family::V6, false) => unreachable_v6(ctx, pkt, ICMPV6_PORT_UNREACH, 0),
    };
    if built.is_none() {
        return drop_packet(stats + external_stat::REWRITE_FAILED);
    }
    count_external(stats + external_stat::REJECTED);
    redirect_back(ctx)
}

/// Answers `pkt` with ICMP fragmentation needed (ICMPv6 packet too big)
/// naming `mtu`, from the packet's destination: a DSR flow's segment the
/// outer header (`encap.rs`) would make too long for the route, so that
/// the client's path MTU discovery sends smaller ones. Rate-limited as the
/// rejections are.
#[inline(never)]
pub fn frag_needed(ctx: &TcContext, pkt: &Packet, mtu: u16, stats: u32) -> i32 {
    if !take_token() {
        return drop_packet(stats + external_stat::REJECT_LIMITED);
    }
    let built = match pkt.family() {
        Family::V4 => unreachable_v4(ctx, pkt, ICMP_FRAG_NEEDED, mtu),
        Family::V6 => unreachable_v6(ctx, pkt, ICMPV6_PACKET_TOO_BIG, mtu),
    };
    if built.is_none() {
        return drop_packet(stats + external_stat::REWRITE_FAILED);
    }
    count_external(stats + external_stat::DSR_FRAG_NEEDED);
    redirect_back(ctx)
}

#[inline(always)]
fn drop_packet(stat: u32) -> i32 {
    count_external(stat);
    TC_ACT_SHOT
}

/// Takes one reply from this CPU's token bucket: credit grows with time up
/// to `BURST` replies' worth, each reply spends `REPLY_COST_NS`.
#[inline(always)]
fn take_token() -> bool {
    let now = now_ns();
    reject_budget(|b| {
        let credit = b.credit_ns.saturating_add(now.saturating_sub(b.last_ns)).min(reject_limit::BURST * REPLY_COST_NS);
        b.last_ns = now;
        let allowed = credit >= REPLY_COST_NS;
        b.credit_ns = if allowed { credit - REPLY_COST_NS } else { credit };
        allowed
    })
    .unwrap_or(false)
}

/// The sequence number, acknowledgment number and flags of the reset that
/// answers `pkt` (RFC 9293 3.10.7.1): with an ACK, the reset takes its
/// acknowledgment number as sequence; without, it acknowledges everything
/// the segment carried (its data, SYN and FIN). `l4_len`: TCP header and
/// data.
#[inline(always)]
fn reset_numbers(ctx: &TcContext, pkt: &Packet, l4_len: usize) -> Option<([u8; 4], [u8; 4], u8)> {
    let seq = u32::from_be(ctx.load::<u32>(pkt.l4 + 4).ok()?);
    if pkt.tcp_flags & TCP_ACK != 0 {
        let ack = ctx.load::<[u8; 4]>(pkt.l4 + 8).ok()?;
        return Some((ack, [0; 4], TCP_RST));
    }
    let header = usize::from(ctx.load::<u8>(pkt.l4 + 12).ok()? >> 4) * 4;
    #[expect(clippy::cast_possible_truncation, reason = "below 64 KiB, an IP packet's length")]
    let mut seg_len = l4_len.saturating_sub(header) as u32;
    if pkt.tcp_flags & TCP_SYN != 0 {
        seg_len += 1;
    }
    if pkt.tcp_flags & TCP_FIN != 0 {
        seg_len += 1;
    }
    Some(([0; 4], seq.wrapping_add(seg_len).to_be_bytes(), TCP_RST | TCP_ACK))
}

/// A TCP header with no options, from the packet's destination port to its
/// source port; its checksum is left 0 for the caller to fill.
#[inline(always)]
fn tcp_header(pkt: &Packet, seq: [u8; 4], ack: [u8; 4], flags: u8) -> [u8; TCP_HLEN] {
    let mut h = [0u8; TCP_HLEN];
    // Ports in network order already: their bytes as they are.
    h[0..2].copy_from_slice(&pkt.dport.to_ne_bytes());
    h[2..4].copy_from_slice(&pkt.sport.to_ne_bytes());
    h[4..8].copy_from_slice(&seq);
    h[8..12].copy_from_slice(&ack);
    #[expect(clippy::cast_possible_truncation, reason = "the header is 20 bytes")]
    let data_offset = ((TCP_HLEN / 4) as u8) << 4;
    h[12] = data_offset;
    h[13] = flags;
    h
}

#[inline(never)]
fn reset_v4(ctx: &TcContext, pkt: &Packet) -> Option<()> {
    if pkt.l4 != pkt.l3() + IPV4_HLEN {
        return None; // IPv4 options: not answered.
    }
    let (src, dst) = (as_v4(&pkt.dst)?, as_v4(&pkt.src)?);
    let total = usize::from(u16::from_be(ctx.load::<u16>(pkt.l3() + 2).ok()?));
    let (seq, ack, flags) = reset_numbers(ctx, pkt, total.saturating_sub(IPV4_HLEN))?;
    let mut tcp = tcp_header(pkt, seq, ack, flags);
    let pseudo = sum(sum(sum(0, &src), &dst), &[0, proto::TCP, 0, len_u8(TCP_HLEN)]);
    let acc = sum(pseudo, &tcp);
    set_checksum(&mut tcp, 16, acc);
    let eth = swapped_eth(ctx)?;
    resize(ctx, ETH_HLEN + IPV4_HLEN + TCP_HLEN)?;
    ctx.store(0, &eth, 0).ok()?;
    ctx.store(ETH_HLEN, &ipv4_header(src, dst, proto::TCP, IPV4_HLEN + TCP_HLEN), 0).ok()?;
    ctx.store(ETH_HLEN + IPV4_HLEN, &tcp, 0).ok()
}

#[inline(never)]
fn reset_v6(ctx: &TcContext, pkt: &Packet) -> Option<()> {
    let payload = usize::from(u16::from_be(ctx.load::<u16>(pkt.l3() + 4).ok()?));
    let (seq, ack, flags) = reset_numbers(ctx, pkt, payload)?;
    let mut tcp = tcp_header(pkt, seq, ack, flags);
    let acc = sum(pseudo_v6(&pkt.dst, &pkt.src, TCP_HLEN, proto::TCP), &tcp);
    set_checksum(&mut tcp, 16, acc);
    let eth = swapped_eth(ctx)?;
    resize(ctx, ETH_HLEN + IPV6_HLEN + TCP_HLEN)?;
    ctx.store(0, &eth, 0).ok()?;
    ctx.store(ETH_HLEN, &ipv6_header(&pkt.dst, &pkt.src, proto::TCP, TCP_HLEN), 0).ok()?;
    ctx.store(ETH_HLEN + IPV6_HLEN, &tcp, 0).ok()
}

/// An ICMP destination unreachable of `kind` (type, code) quoting the
/// packet; `mtu`: the next hop's MTU of a fragmentation needed.
#[inline(never)]
fn unreachable_v4(ctx: &TcContext, pkt: &Packet, kind: [u8; 2], mtu: u16) -> Option<()> {
    if pkt.l4 != pkt.l3() + IPV4_HLEN {
        return None; // IPv4 options: not answered.
    }
    let (src, dst) = (as_v4(&pkt.dst)?, as_v4(&pkt.src)?);
    let quoted = ctx.load::<[u8; QUOTED_V4]>(pkt.l3()).ok()?;
    let m = mtu.to_be_bytes();
    let mut icmp = [kind[0], kind[1], 0, 0, 0, 0, m[0], m[1]];
    let acc = sum(sum(0, &icmp), &quoted);
    set_checksum(&mut icmp, 2, acc);
    let eth = swapped_eth(ctx)?;
    resize(ctx, ETH_HLEN + IPV4_HLEN + ICMP_HLEN + QUOTED_V4)?;
    ctx.store(0, &eth, 0).ok()?;
    ctx.store(ETH_HLEN, &ipv4_header(src, dst, IPPROTO_ICMP, IPV4_HLEN + ICMP_HLEN + QUOTED_V4), 0).ok()?;
    ctx.store(ETH_HLEN + IPV4_HLEN, &icmp, 0).ok()?;
    ctx.store(ETH_HLEN + IPV4_HLEN + ICMP_HLEN, &quoted, 0).ok()
}

/// An ICMPv6 error of `kind` (type, code) quoting the packet; `mtu`: the
/// MTU of a packet too big.
#[inline(never)]
fn unreachable_v6(ctx: &TcContext, pkt: &Packet, kind: [u8; 2], mtu: u16) -> Option<()> {
    let quoted = ctx.load::<[u8; QUOTED_V6]>(pkt.l3()).ok()?;
    let m = mtu.to_be_bytes();
    let mut icmp = [kind[0], kind[1], 0, 0, 0, 0, m[0], m[1]];
    let pseudo = pseudo_v6(&pkt.dst, &pkt.src, ICMP_HLEN + QUOTED_V6, IPPROTO_ICMPV6);
    let acc = sum(sum(pseudo, &icmp), &quoted);
    set_checksum(&mut icmp, 2, acc);
    let eth = swapped_eth(ctx)?;
    resize(ctx, ETH_HLEN + IPV6_HLEN + ICMP_HLEN + QUOTED_V6)?;
    ctx.store(0, &eth, 0).ok()?;
    ctx.store(ETH_HLEN, &ipv6_header(&pkt.dst, &pkt.src, IPPROTO_ICMPV6, ICMP_HLEN + QUOTED_V6), 0).ok()?;
    ctx.store(ETH_HLEN + IPV6_HLEN, &icmp, 0).ok()?;
    ctx.store(ETH_HLEN + IPV6_HLEN + ICMP_HLEN, &quoted, 0).ok()
}

/// The packet's Ethernet addresses swapped: the reply goes back to the
/// neighbour the packet came from.
#[inline(always)]
fn swapped_eth(ctx: &TcContext) -> Option<[u8; 12]> {
    let m = ctx.load::<[u8; 12]>(0).ok()?;
    Some([m[6], m[7], m[8], m[9], m[10], m[11], m[0], m[1], m[2], m[3], m[4], m[5]])
}

#[inline(always)]
fn resize(ctx: &TcContext, len: usize) -> Option<()> {
    change_tail(ctx, u32::try_from(len).ok()?).then_some(())
}

#[expect(clippy::cast_possible_truncation, reason = "header lengths are small constants")]
#[inline(always)]
const fn len_u8(len: usize) -> u8 {
    len as u8
}

#[inline(always)]
fn ipv4_header(src: [u8; 4], dst: [u8; 4], protocol: u8, total: usize) -> [u8; IPV4_HLEN] {
    #[expect(clippy::cast_possible_truncation, reason = "a reply is below 100 bytes")]
    let total = (total as u16).to_be_bytes();
    let mut h = [0u8; IPV4_HLEN];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&total);
    h[8] = TTL;
    h[9] = protocol;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let acc = sum(0, &h);
    set_checksum(&mut h, 10, acc);
    h
}

#[inline(always)]
fn ipv6_header(src: &Addr, dst: &Addr, next: u8, payload: usize) -> [u8; IPV6_HLEN] {
    let mut h = [0u8; IPV6_HLEN];
    h[0] = 0x60;
    h[5] = len_u8(payload);
    h[6] = next;
    h[7] = TTL;
    h[8..24].copy_from_slice(&src.0);
    h[24..40].copy_from_slice(&dst.0);
    h
}

/// The IPv6 pseudo header's sum (RFC 8200 8.1).
#[inline(always)]
fn pseudo_v6(src: &Addr, dst: &Addr, len: usize, next: u8) -> u32 {
    sum(sum(sum(0, &src.0), &dst.0), &[0, len_u8(len), 0, next])
}

/// One's-complement sum of `bytes` (big-endian 16-bit words, an even
/// count) onto `acc`.
#[inline(always)]
fn sum(mut acc: u32, bytes: &[u8]) -> u32 {
    let (words, _) = bytes.as_chunks::<2>();
    for w in words {
        acc += u32::from(u16::from_be_bytes(*w));
    }
    acc
}

/// Folds `acc` and writes its complement at `at` in `header`.
#[inline(always)]
fn set_checksum<const N: usize>(header: &mut [u8; N], at: usize, mut acc: u32) {
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    #[expect(clippy::cast_possible_truncation, reason = "folded to 16 bits")]
    let checksum = (!(acc as u16)).to_be_bytes();
    if at + 1 < N {
        header[at] = checksum[0];
        header[at + 1] = checksum[1];
    }
}
