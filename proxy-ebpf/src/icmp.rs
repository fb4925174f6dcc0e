//! ICMP errors about a translated flow, on their way to its client: a
//! router's "fragmentation needed" (IPv6: "packet too big"), a backend's
//! "port unreachable", "time exceeded". They quote the packet the client
//! sent as it was after translation (to the backend), which the client's
//! stack cannot match to its socket (it sent to the frontend): the quoted
//! destination becomes the frontend again, and the error's own source too
//! when the backend sent it. So path MTU discovery works through a service
//! (RFC 1191, RFC 8201). Run by the egress programs (`nodeport::egress`)
//! for flows whose reply entry in `CT` holds no source NAT; checksums are
//! updated, not recomputed: the quoted IPv4 header's own checksum makes
//! its sum unchanged, so the ICMP checksum follows only the port (and,
//! for IPv6, the addresses).
use proxy_common::{Addr, CtKey, CtValue, as_v4, ct_dir, ct_flags, mapped_v4, proto};

use crate::{
    access::csum_diff,
    frame::{BPF_F_PSEUDO_HDR, Frame},
    maps::ct_update,
    packet::{ETH_HLEN, RewriteFailed},
};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;
const ICMP_HLEN: usize = 8;

/// What an ICMP error quotes: the packet the client sent, as translated.
struct Quoted {
    v6: bool,
    /// Offset of the ICMP header, and of the quoted IP and L4 headers.
    icmp: usize,
    ip: usize,
    l4: usize,
    /// The outer source: the sender of the error.
    sender: Addr,
    proto: u8,
    src: Addr,
    dst: Addr,
    sport: u16,
    dport: u16,
}

/// Translates an ICMP error about a flow with a reply entry in `CT`;
/// anything else is left as it is. Errors of the helpers leave the packet
/// to the stack as it is (`Err`: the caller counts a failed rewrite).
#[inline(never)]
pub fn translate_error<F: Frame>(ctx: &F) -> Result<(), RewriteFailed> {
    let mut q = Quoted {
        v6: false,
        icmp: 0,
        ip: 0,
        l4: 0,
        sender: Addr([0; 16]),
        proto: 0,
        src: Addr([0; 16]),
        dst: Addr([0; 16]),
        sport: 0,
        dport: 0,
    };
    if !quoted(ctx, &mut q) {
        return Ok(());
    }
    let mut frontend = CtValue::default();
    if !flow_of(&q, &mut frontend) {
        return Ok(());
    }
    rewrite(ctx, &q, &frontend)
}

/// Sets `out` to the reply entry of the quoted packet's flow, if it holds
/// no source NAT. The quoted packet went client -> backend: the entry is
/// keyed backend -> client.
#[inline(never)]
fn flow_of(q: &Quoted, out: &mut CtValue) -> bool {
    let key = CtKey {
        src: q.dst,
        dst: q.src,
        sport: q.dport,
        dport: q.sport,
        proto: q.proto,
        dir: ct_dir::REPLY,
        pad: [0; 2],
    };
    ct_update(&key, |entry| {
        if entry.flags & ct_flags::SNAT != 0 {
            return false;
        }
        *out = *entry;
        true
    })
    .unwrap_or(false)
}

/// The quoted IPv6 destination becomes `new`.
#[inline(never)]
fn replace_quoted_v6<F: Frame>(ctx: &F, q: &Quoted, new: &Addr) -> Result<(), RewriteFailed> {
    replace_v6(ctx, q.ip + 24, q.icmp + 2, &q.dst, new, 0)
}

/// The error's IPv6 source becomes `new` (the ICMPv6 checksum covers it,
/// in its pseudo-header).
#[inline(never)]
fn replace_sender_v6<F: Frame>(ctx: &F, q: &Quoted, new: &Addr) -> Result<(), RewriteFailed> {
    replace_v6(ctx, ETH_HLEN + 8, q.icmp + 2, &q.sender, new, BPF_F_PSEUDO_HDR)
}

/// Replaces the IPv6 address at `at` (`old`) by `new` and updates the
/// ICMPv6 checksum at `csum` (`flags`: whether the pseudo-header holds it).
#[inline(always)]
fn replace_v6<F: Frame>(
    ctx: &F,
    at: usize,
    csum: usize,
    old: &Addr,
    new: &Addr,
    flags: u64,
) -> Result<(), RewriteFailed> {
    ctx.store(at, new)?;
    let diff = csum_diff(&mut old.words(), &mut new.words());
    if diff < 0 {
        return Err(RewriteFailed);
    }
    #[expect(clippy::cast_sign_loss, reason = "checked non-negative")]
    ctx.l4_csum_replace(csum, 0, diff as u64, flags)
}

#[inline(never)]
fn rewrite<F: Frame>(ctx: &F, q: &Quoted, frontend: &CtValue) -> Result<(), RewriteFailed> {
    let icmp_csum = q.icmp + 2;
    // The quoted destination port.
    if q.dport != frontend.port {
        ctx.store(q.l4 + 2, &frontend.port)?;
        ctx.l4_csum_replace(icmp_csum, u64::from(q.dport), u64::from(frontend.port), 2)?;
    }
    if q.dst != frontend.addr {
        if q.v6 {
            replace_quoted_v6(ctx, q, &frontend.addr)?;
        } else {
            let (Some(old), Some(new)) = (as_v4(&q.dst), as_v4(&frontend.addr)) else { return Err(RewriteFailed) };
            ctx.store(q.ip + 16, &new)?;
            let (from, to) = (u64::from(u32::from_ne_bytes(old)), u64::from(u32::from_ne_bytes(new)));
            // The quoted header's checksum keeps its sum, and so the
            // ICMP checksum, as it is.
            ctx.l3_csum_replace(q.ip + 10, from, to, 4)?;
        }
    }
    // An error the backend sent itself comes from the frontend.
    if q.sender == q.dst && q.sender != frontend.addr {
        if q.v6 {
            replace_sender_v6(ctx, q, &frontend.addr)?;
        } else {
            let (Some(old), Some(new)) = (as_v4(&q.sender), as_v4(&frontend.addr)) else { return Err(RewriteFailed) };
            ctx.store(ETH_HLEN + 12, &new)?;
            let (from, to) = (u64::from(u32::from_ne_bytes(old)), u64::from(u32::from_ne_bytes(new)));
            ctx.l3_csum_replace(ETH_HLEN + 10, from, to, 4)?;
        }
    }
    Ok(())
}

/// Sets `out` to the packet an ICMP error (destination unreachable, packet
/// too big, time exceeded, parameter problem) quotes, if the frame is one
/// quoting a TCP, UDP or SCTP packet of its own family. Written field by
/// field into `out`: a whole `Quoted` built on this frame and copied would
/// take more stack than the verifier allows this chain.
#[inline(never)]
fn quoted<F: Frame>(ctx: &F, out: &mut Quoted) -> bool {
    read_quoted(ctx, out).is_some()
}

#[inline(always)]
fn read_quoted<F: Frame>(ctx: &F, out: &mut Quoted) -> Option<()> {
    let ethertype = u16::from_be(ctx.load::<u16>(12).ok()?);
    let l3 = ETH_HLEN;
    match ethertype {
        ETH_P_IP => {
            let head = ctx.load::<u8>(l3).ok()?;
            let ihl = usize::from(head & 0x0f) * 4;
            if head >> 4 != 4 || ihl < 20 || ctx.load::<u8>(l3 + 9).ok()? != IPPROTO_ICMP {
                return None;
            }
            let kind = ctx.load::<u8>(l3 + ihl).ok()?;
            // Destination unreachable, time exceeded, parameter problem.
            if kind != 3 && kind != 11 && kind != 12 {
                return None;
            }
            out.v6 = false;
            out.icmp = l3 + ihl;
            out.sender = mapped_v4(ctx.load::<[u8; 4]>(l3 + 12).ok()?);
        }
        ETH_P_IPV6 => {
            if ctx.load::<u8>(l3 + 6).ok()? != IPPROTO_ICMPV6 {
                return None;
            }
            // Destination unreachable, packet too big, time exceeded,
            // parameter problem (informational types are 128 and up).
            let kind = ctx.load::<u8>(l3 + 40).ok()?;
            if kind == 0 || kind > 4 {
                return None;
            }
            out.v6 = true;
            out.icmp = l3 + 40;
            out.sender = ctx.load::<Addr>(l3 + 8).ok()?;
        }
        _ => return None,
    }
    out.ip = out.icmp + ICMP_HLEN;
    if out.v6 {
        out.proto = ctx.load::<u8>(out.ip + 6).ok()?;
        out.src = ctx.load::<Addr>(out.ip + 8).ok()?;
        out.dst = ctx.load::<Addr>(out.ip + 24).ok()?;
        out.l4 = out.ip + 40;
    } else {
        let ihl = usize::from(ctx.load::<u8>(out.ip).ok()? & 0x0f) * 4;
        if ihl < 20 {
            return None;
        }
        out.proto = ctx.load::<u8>(out.ip + 9).ok()?;
        out.src = mapped_v4(ctx.load::<[u8; 4]>(out.ip + 12).ok()?);
        out.dst = mapped_v4(ctx.load::<[u8; 4]>(out.ip + 16).ok()?);
        out.l4 = out.ip + ihl;
    }
    if out.proto != proto::TCP && out.proto != proto::UDP && out.proto != proto::SCTP {
        return None;
    }
    out.sport = ctx.load::<u16>(out.l4).ok()?;
    out.dport = ctx.load::<u16>(out.l4 + 2).ok()?;
    Some(())
}
