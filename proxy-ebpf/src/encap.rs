//! DSR by encapsulation (`--dsr-dispatch ipip`, `proxy_common::dsr_dispatch`):
//! the entry node puts every packet of a DSR flow, untouched, inside an
//! outer IP header to the backend's address (IPIP for IPv4, IP6IP6 for
//! IPv6; no tunnel device: the programs add and take off the header), so
//! no IP option rides on the client's packet and no router on the way
//! needs to pass one. The backend's node takes the outer header off and
//! translates the inner packet to its backend (`nodeport::ipip_arrival`),
//! recording the flow's replies as for a DSR option: they leave straight
//! to the client, from the frontend.
use proxy_common::{Addr, as_v4, dsr_dispatch, mapped_v4};

use crate::{
    frame::Frame,
    maps::outer_header,
    packet::{ETH_HLEN, ETH_P_IP, ETH_P_IPV6, Family, Packet, RewriteFailed},
};

/// The IP protocol numbers of an inner IPv4 and IPv6 packet.
const IPPROTO_IPIP: u8 = 4;
const IPPROTO_IPV6: u8 = 41;
const TTL: u8 = 64;

/// The bytes the outer header adds to a packet of `family`.
#[inline(always)]
pub const fn overhead(family: Family) -> u16 {
    match family {
        Family::V4 => dsr_dispatch::V4_OVERHEAD,
        Family::V6 => dsr_dispatch::V6_OVERHEAD,
    }
}

/// Puts the packet inside an outer header from `src` to `dst` (the
/// backend), of its own family. TC only (`Frame::grow_outer`).
#[inline(never)]
pub fn encapsulate<F: Frame>(ctx: &F, pkt: &Packet, src: &Addr, dst: &Addr) -> Result<(), RewriteFailed> {
    match pkt.family() {
        Family::V4 => {
            let (Some(s), Some(d)) = (as_v4(src), as_v4(dst)) else { return Err(RewriteFailed) };
            let inner = ctx.load::<[u8; 4]>(pkt.l3())?;
            let total = u16::from_be_bytes([inner[2], inner[3]])
                .checked_add(dsr_dispatch::V4_OVERHEAD)
                .ok_or(RewriteFailed)?
                .to_be_bytes();
            // The inner packet's TOS; don't fragment, so that the path's
            // MTU is learnt, not worked around.
            let mut h = [
                0x45,
                inner[1],
                total[0],
                total[1],
                0,
                0,
                0x40,
                0,
                TTL,
                IPPROTO_IPIP,
                0,
                0,
                s[0],
                s[1],
                s[2],
                s[3],
                d[0],
                d[1],
                d[2],
                d[3],
            ];
            let sum = header_checksum(&h);
            h[10] = sum[0];
            h[11] = sum[1];
            ctx.grow_outer(u32::from(dsr_dispatch::V4_OVERHEAD), false)?;
            ctx.store(ETH_HLEN, &h)
        }
        Family::V6 => {
            let inner = ctx.load::<[u8; 8]>(pkt.l3())?;
            let payload = u16::from_be_bytes([inner[4], inner[5]])
                .checked_add(dsr_dispatch::V6_OVERHEAD)
                .ok_or(RewriteFailed)?
                .to_be_bytes();
            // Version, traffic class and flow label as the inner packet's.
            let head = [inner[0], inner[1], inner[2], inner[3], payload[0], payload[1], IPPROTO_IPV6, TTL];
            ctx.grow_outer(u32::from(dsr_dispatch::V6_OVERHEAD), true)?;
            ctx.store(ETH_HLEN, &head)?;
            ctx.store(ETH_HLEN + 8, src)?;
            ctx.store(ETH_HLEN + 24, dst)
        }
    }
}

/// Takes off the packet's outer header if it is an IPIP (IPv4 in IPv4, no
/// options, not a fragment) or IP6IP6 packet, keeping it in this CPU's
/// `OUTER_HEADER` (for `restore`, and its destination for the caller);
/// false for anything else, which is left as it is.
#[inline(never)]
pub fn take_outer<F: Frame>(ctx: &F) -> bool {
    let Some(kept) = outer_header() else { return false };
    let len = match u16::from_be(ctx.load::<u16>(12).unwrap_or(0)) {
        ETH_P_IP => {
            let Ok(h) = ctx.load::<[u8; 20]>(ETH_HLEN) else { return false };
            if h[0] != 0x45 || h[9] != IPPROTO_IPIP || u16::from_be_bytes([h[6], h[7]]) & 0x3fff != 0 {
                return false;
            }
            kept.bytes[..20].copy_from_slice(&h);
            kept.dst = mapped_v4([h[16], h[17], h[18], h[19]]);
            dsr_dispatch::V4_OVERHEAD
        }
        ETH_P_IPV6 => {
            let Ok(h) = ctx.load::<[u8; 40]>(ETH_HLEN) else { return false };
            if h[0] >> 4 != 6 || h[6] != IPPROTO_IPV6 {
                return false;
            }
            kept.dst.0.copy_from_slice(&h[24..40]);
            kept.bytes = h;
            dsr_dispatch::V6_OVERHEAD
        }
        _ => return false,
    };
    kept.len = u32::from(len);
    ctx.strip_outer(kept.len).is_ok()
}

/// The destination of the outer header `take_outer` took off last on this
/// CPU (the backend, for a DSR flow's packet), in place in the map.
#[inline(always)]
pub fn outer_dst() -> Option<&'static Addr> {
    outer_header().map(|kept| &kept.dst)
}

/// Puts the outer header `take_outer` took off back in front of the
/// packet: an IPIP packet that is not a DSR flow's goes on as it came
/// (another tunnel's, Calico's IPIP among them).
#[inline(never)]
pub fn restore<F: Frame>(ctx: &F) -> Result<(), RewriteFailed> {
    let kept = outer_header().ok_or(RewriteFailed)?;
    if kept.len == u32::from(dsr_dispatch::V4_OVERHEAD) {
        ctx.grow_outer(kept.len, false)?;
        let mut h = [0u8; 20];
        h.copy_from_slice(&kept.bytes[..20]);
        ctx.store(ETH_HLEN, &h)
    } else {
        ctx.grow_outer(kept.len, true)?;
        ctx.store(ETH_HLEN, &kept.bytes)
    }
}

/// The IPv4 header checksum of `h` (its checksum field zero).
#[inline(always)]
fn header_checksum(h: &[u8; 20]) -> [u8; 2] {
    let mut acc = 0u32;
    for w in h.as_chunks::<2>().0 {
        acc += u32::from(u16::from_be_bytes(*w));
    }
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    #[expect(clippy::cast_possible_truncation, reason = "folded to 16 bits")]
    (!(acc as u16)).to_be_bytes()
}
