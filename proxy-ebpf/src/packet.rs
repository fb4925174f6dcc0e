//! Packets on a TC or XDP hook (`Frame`): parse Ethernet + IPv4/IPv6 +
//! TCP/UDP/SCTP, and rewrite addresses and ports with their checksums
//! (SCTP's CRC32c, which covers its ports but not the addresses, in
//! `crc32c.rs`).
//! Addresses are 16 bytes (IPv4 as IPv4-mapped IPv6) like everywhere else;
//! ports in network byte order. Reads and writes go through the hook's
//! byte helpers, so non-linear packets work and no bounds are left to the
//! verifier.
use proxy_common::{Addr, CtKey, as_v4, dsr_option, mapped_v4, proto};

use crate::{
    access::{csum_diff, csum_diff_words},
    frame::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, Frame},
};

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;
/// IPv6 next header: Destination Options.
pub const IPPROTO_DSTOPTS: u8 = 60;

/// Rewriting a packet failed (a helper refused).
pub struct RewriteFailed;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// Which end of the packet to rewrite.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum End {
    Src,
    Dst,
}

/// Offset of the TCP or UDP checksum.
#[inline(always)]
fn l4_csum_offset(proto: u8, l4: usize) -> usize {
    if proto == proto::TCP { l4 + 16 } else { l4 + 6 }
}

/// L4 checksum flags: a UDP checksum of 0 (IPv4: none) stays 0.
#[inline(always)]
fn l4_flags(proto: u8) -> u64 {
    if proto == proto::UDP { BPF_F_MARK_MANGLED_0 } else { 0 }
}

/// A port of a packet rewritten, with the checksum that covers it
/// (TCP's or UDP's, or SCTP's CRC32c). It fits in one scalar (`pack`), so
/// that TC's programs can pass it to a global function
/// (`frame::tc_rewrite_port`), which the verifier checks once, where a
/// static one is walked again at every call site with the caller's state.
#[derive(Clone, Copy)]
pub struct PortRewrite {
    /// Offset of the TCP, UDP or SCTP header.
    pub l4: u16,
    pub proto: u8,
    pub v6: bool,
    /// The source port, else the destination port.
    pub src: bool,
    /// The port before and after (network order).
    pub old: u16,
    pub new: u16,
}

impl PortRewrite {
    #[inline(always)]
    pub fn pack(self) -> u64 {
        u64::from(self.l4)
            | u64::from(self.proto) << 16
            | u64::from(self.v6) << 24
            | u64::from(self.src) << 25
            | u64::from(self.old) << 32
            | u64::from(self.new) << 48
    }

    #[inline(always)]
    #[expect(clippy::cast_possible_truncation, reason = "each field is cut out of where `pack` put it")]
    pub fn unpack(v: u64) -> Self {
        Self {
            l4: v as u16,
            proto: (v >> 16) as u8,
            v6: v >> 24 & 1 == 1,
            src: v >> 25 & 1 == 1,
            old: (v >> 32) as u16,
            new: (v >> 48) as u16,
        }
    }

    /// Writes the new port and updates the checksum.
    #[inline(always)]
    pub fn apply<F: Frame + ?Sized>(self, ctx: &F) -> Result<(), RewriteFailed> {
        let l4 = usize::from(self.l4);
        if self.proto == proto::SCTP {
            let family = if self.v6 { Family::V6 } else { Family::V4 };
            crate::crc32c::port_changed(ctx, family, l4, self.src, self.old ^ self.new)?;
        } else {
            let (from, to) = (u64::from(self.old), u64::from(self.new));
            ctx.l4_csum_replace(l4_csum_offset(self.proto, l4), from, to, 2 | l4_flags(self.proto))?;
        }
        ctx.store(l4 + if self.src { 0 } else { 2 }, &self.new)
    }
}

/// A TCP or UDP packet, as parsed.
pub struct Packet {
    /// The IP version, 4 or 6 (`family()`). A plain integer, not a
    /// `Family`: an enum's spare values would become the niche of
    /// `Option<Packet>` (`parse`), whose BTF the kernel refuses (a union
    /// member at an offset).
    pub ip_version: u8,
    /// Offset of the TCP or UDP header.
    pub l4: usize,
    pub proto: u8,
    pub src: Addr,
    pub dst: Addr,
    pub sport: u16,
    pub dport: u16,
    /// TCP flags (0 for UDP).
    pub tcp_flags: u8,
    /// The port (network order) of the frontend a DSR option
    /// (`dsr_option`) names; 0: the packet carries none. Its address is
    /// read when needed (`dsr_addr`): the packet is on every frame of the
    /// call chain, whose stack the verifier bounds.
    pub dsr_port: u16,
}

impl Packet {
    /// Reads the packet's IP and TCP/UDP headers, and a DSR option if it
    /// carries one; `None` for anything else (other protocols, IPv4
    /// fragments, IPv6 extension headers but DSR's), which is then left
    /// alone. Out of line, so its temporaries are off the stack by the
    /// time the translation runs. It returns the packet rather than
    /// filling one the caller zeroed: zeroing a struct is a byte-wise
    /// `memset` loop on BPF, paid on every packet.
    #[inline(never)]
    pub fn parse<F: Frame>(ctx: &F) -> Option<Self> {
        Self::read(ctx)
    }

    /// `parse` field by field, on a smaller frame than `read_plain`'s: for
    /// a call chain already deep (an IPIP packet's inner one).
    #[inline(never)]
    pub fn parse_fields<F: Frame>(ctx: &F) -> Option<Self> {
        Self::read_fields(ctx)
    }

    /// The plain packets (an IPv4 header without options, an IPv6 header
    /// without extension headers, TCP or UDP), read in one helper call
    /// (`read_plain`), else field by field (`read_fields`). Each reader on
    /// its own frame: their buffers together would put `parse` past the
    /// verifier's stack bound for the chain below the program.
    #[inline(always)]
    fn read<F: Frame>(ctx: &F) -> Option<Self> {
        if let Some(pkt) = Self::read_plain(ctx) {
            return Some(pkt);
        }
        Self::read_fields(ctx)
    }

    /// A plain TCP or UDP packet from one copy of its first bytes (up to
    /// TCP's flags): one helper call where `read_fields` makes eight,
    /// and every packet of every program pays for the parse. `None` for
    /// anything else, which `read_fields` then reads (IPv4 options, a DSR
    /// option, fragments, SCTP, a packet shorter than the copy).
    #[inline(never)]
    fn read_plain<F: Frame>(ctx: &F) -> Option<Self> {
        const V4: usize = ETH_HLEN + 20;
        const V6: usize = ETH_HLEN + 40;
        let head = ctx.load::<[u8; V4 + 14]>(0).ok()?;
        let (ip_version, l4, proto, src, dst, ports, flags) = match u16::from_be_bytes([head[12], head[13]]) {
            ETH_P_IP => {
                // Version 4, 20 bytes of header, not a fragment.
                if head[ETH_HLEN] != 0x45 || u16::from_be_bytes([head[ETH_HLEN + 6], head[ETH_HLEN + 7]]) & 0x3fff != 0
                {
                    return None;
                }
                let at = |i: usize| [head[i], head[i + 1], head[i + 2], head[i + 3]];
                let l4 = [head[V4], head[V4 + 1], head[V4 + 2], head[V4 + 3]];
                (
                    4,
                    V4,
                    head[ETH_HLEN + 9],
                    mapped_v4(at(ETH_HLEN + 12)),
                    mapped_v4(at(ETH_HLEN + 16)),
                    l4,
                    head[V4 + 13],
                )
            }
            ETH_P_IPV6 => {
                let h = ctx.load::<[u8; V6 + 14]>(0).ok()?;
                let src = Addr(core::array::from_fn(|i| h[ETH_HLEN + 8 + i]));
                let dst = Addr(core::array::from_fn(|i| h[ETH_HLEN + 24 + i]));
                let l4 = [h[V6], h[V6 + 1], h[V6 + 2], h[V6 + 3]];
                (6, V6, h[ETH_HLEN + 6], src, dst, l4, h[V6 + 13])
            }
            _ => return None,
        };
        if proto != proto::TCP && proto != proto::UDP {
            return None;
        }
        let tcp_flags = if proto == proto::TCP { flags } else { 0 };
        Some(Self::from_parts((ip_version, l4, proto), src, dst, ports, tcp_flags, 0))
    }

    #[inline(never)]
    fn read_fields<F: Frame>(ctx: &F) -> Option<Self> {
        let ethertype = u16::from_be(ctx.load::<u16>(12).ok()?);
        let l3 = ETH_HLEN;
        let mut dsr_port = 0;
        let (ip_version, l4, proto, src, dst) = match ethertype {
            ETH_P_IP => {
                let version_ihl = ctx.load::<u8>(l3).ok()?;
                let ihl = usize::from(version_ihl & 0x0f) * 4;
                if version_ihl >> 4 != 4 || ihl < 20 {
                    return None;
                }
                // More-fragments flag or a fragment offset: only the first
                // fragment has ports, so fragments are not translated.
                if u16::from_be(ctx.load::<u16>(l3 + 6).ok()?) & 0x3fff != 0 {
                    return None;
                }
                // A DSR option is always the first (`add_dsr_option`).
                if ihl >= 20 + usize::from(dsr_option::V4_LEN) {
                    let opt = ctx.load::<[u8; 8]>(l3 + 20).ok()?;
                    if opt[0] == dsr_option::V4_TYPE && opt[1] == dsr_option::V4_LEN {
                        dsr_port = u16::from_ne_bytes([opt[2], opt[3]]);
                    }
                }
                let proto = ctx.load::<u8>(l3 + 9).ok()?;
                let src = mapped_v4(ctx.load::<[u8; 4]>(l3 + 12).ok()?);
                let dst = mapped_v4(ctx.load::<[u8; 4]>(l3 + 16).ok()?);
                (4, l3 + ihl, proto, src, dst)
            }
            ETH_P_IPV6 => {
                let mut proto = ctx.load::<u8>(l3 + 6).ok()?;
                let src = ctx.load::<Addr>(l3 + 8).ok()?;
                let dst = ctx.load::<Addr>(l3 + 24).ok()?;
                let mut l4 = l3 + 40;
                if proto == IPPROTO_DSTOPTS {
                    // Only the Destination Options header of DSR is
                    // parsed: next header, length 2 (24 bytes), the option.
                    let head = ctx.load::<[u8; 4]>(l4).ok()?;
                    if head[1] != 2 || head[2] != dsr_option::V6_TYPE || head[3] != dsr_option::V6_OPT_LEN {
                        return None;
                    }
                    dsr_port = ctx.load::<u16>(l4 + 20).ok()?;
                    proto = head[0];
                    l4 += usize::from(dsr_option::V6_HDR_LEN);
                }
                (6, l4, proto, src, dst)
            }
            _ => return None,
        };
        if proto != proto::TCP && proto != proto::UDP && proto != proto::SCTP {
            return None;
        }
        let ports = ctx.load::<[u8; 4]>(l4).ok()?;
        let tcp_flags = if proto == proto::TCP { ctx.load::<u8>(l4 + 13).ok()? } else { 0 };
        Some(Self::from_parts((ip_version, l4, proto), src, dst, ports, tcp_flags, dsr_port))
    }

    /// A parsed packet: `(ip_version, l4, proto)`, its addresses, the
    /// first four bytes of its L4 header (the ports), TCP flags and the
    /// DSR option's port.
    #[inline(always)]
    fn from_parts(
        (ip_version, l4, proto): (u8, usize, u8),
        src: Addr,
        dst: Addr,
        ports: [u8; 4],
        tcp_flags: u8,
        dsr_port: u16,
    ) -> Self {
        Self {
            ip_version,
            l4,
            proto,
            src,
            dst,
            sport: u16::from_ne_bytes([ports[0], ports[1]]),
            dport: u16::from_ne_bytes([ports[2], ports[3]]),
            tcp_flags,
            dsr_port,
        }
    }

    #[inline(always)]
    pub fn family(&self) -> Family {
        if self.ip_version == 6 { Family::V6 } else { Family::V4 }
    }

    /// Offset of the IP header: right after the Ethernet header (not a
    /// field: the packet is on every frame of the call chain, whose stack
    /// the verifier bounds).
    #[inline(always)]
    #[expect(clippy::unused_self, reason = "a method, so that it reads like the field it replaces")]
    pub const fn l3(&self) -> usize {
        ETH_HLEN
    }

    /// The connection-tracking key of this packet as it is now.
    #[inline(always)]
    pub fn ct_key(&self, dir: u8) -> CtKey {
        CtKey {
            src: self.src,
            dst: self.dst,
            sport: self.sport,
            dport: self.dport,
            proto: self.proto,
            dir,
            pad: [0; 2],
        }
    }

    /// A TCP SYN without ACK: a client opening a connection.
    #[inline(always)]
    pub fn is_syn(&self) -> bool {
        self.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }

    fn l4_csum_offset(&self) -> usize {
        l4_csum_offset(self.proto, self.l4)
    }

    fn l4_flags(&self) -> u64 {
        l4_flags(self.proto)
    }

    /// Rewrites the source or destination address and port. The address
    /// part is out of line: its own frame keeps the stack of the callers
    /// (`nodeport::forward`) within the verifier's bound.
    #[inline(always)]
    pub fn rewrite<F: Frame>(&mut self, ctx: &F, end: End, addr: &Addr, port: u16) -> Result<(), RewriteFailed> {
        let (old_addr, old_port) = match end {
            End::Src => (self.src, self.sport),
            End::Dst => (self.dst, self.dport),
        };
        if old_addr != *addr {
            self.rewrite_addr(ctx, end, &old_addr, addr)?;
        }
        if old_port != port {
            self.rewrite_port(ctx, end, old_port, port)?;
        }
        match end {
            End::Src => (self.src, self.sport) = (*addr, port),
            End::Dst => (self.dst, self.dport) = (*addr, port),
        }
        Ok(())
    }

    /// Through the hook (`Frame::rewrite_port`): TC's programs run it out
    /// of line, where the verifier checks it once. Out of line here too:
    /// packing it inlined grew the frame of `nodeport::forward`, on the
    /// deepest chain the verifier bounds (512 bytes).
    #[inline(never)]
    fn rewrite_port<F: Frame>(&self, ctx: &F, end: End, old: u16, new: u16) -> Result<(), RewriteFailed> {
        #[expect(clippy::cast_possible_truncation, reason = "headers end within the first 100 bytes")]
        let l4 = self.l4 as u16;
        ctx.rewrite_port(PortRewrite {
            l4,
            proto: self.proto,
            v6: self.ip_version == 6,
            src: end == End::Src,
            old,
            new,
        })
    }

    #[inline(never)]
    fn rewrite_addr<F: Frame>(&self, ctx: &F, end: End, old: &Addr, new: &Addr) -> Result<(), RewriteFailed> {
        let l4_csum = self.l4_csum_offset();
        match self.family() {
            Family::V4 => {
                let (Some(old4), Some(new4)) = (as_v4(old), as_v4(new)) else { return Err(RewriteFailed) };
                let (from, to) = (u64::from(u32::from_ne_bytes(old4)), u64::from(u32::from_ne_bytes(new4)));
                let offset = self.l3() + if end == End::Src { 12 } else { 16 };
                // SCTP's checksum covers no pseudo-header.
                if self.proto != proto::SCTP {
                    ctx.l4_csum_replace(l4_csum, from, to, BPF_F_PSEUDO_HDR | 4 | self.l4_flags())?;
                }
                ctx.l3_csum_replace(self.l3() + 10, from, to, 4)?;
                ctx.store(offset, &new4)
            }
            Family::V6 => {
                if as_v4(new).is_some() {
                    return Err(RewriteFailed);
                }
                if self.proto != proto::SCTP {
                    let diff = csum_diff(&mut old.words(), &mut new.words());
                    if diff < 0 {
                        return Err(RewriteFailed);
                    }
                    #[expect(clippy::cast_sign_loss, reason = "checked non-negative")]
                    ctx.l4_csum_replace(l4_csum, 0, diff as u64, BPF_F_PSEUDO_HDR | self.l4_flags())?;
                }
                let offset = self.l3() + if end == End::Src { 8 } else { 24 };
                ctx.store(offset, new)
            }
        }
    }

    /// Decrements the TTL (hop limit) of a packet this node forwards
    /// itself; fails when it would reach 0.
    #[inline(always)]
    pub fn decrement_ttl<F: Frame>(&self, ctx: &F) -> Result<(), RewriteFailed> {
        match self.family() {
            Family::V4 => {
                // TTL and protocol form one 16-bit word of the checksum.
                let old = ctx.load::<[u8; 2]>(self.l3() + 8)?;
                if old[0] <= 1 {
                    return Err(RewriteFailed);
                }
                let new = [old[0] - 1, old[1]];
                let (from, to) = (u16::from_ne_bytes(old), u16::from_ne_bytes(new));
                ctx.l3_csum_replace(self.l3() + 10, u64::from(from), u64::from(to), 2)?;
                ctx.store(self.l3() + 8, &new)
            }
            Family::V6 => {
                let hops = ctx.load::<u8>(self.l3() + 7)?;
                if hops <= 1 {
                    return Err(RewriteFailed);
                }
                ctx.store(self.l3() + 7, &(hops - 1))
            }
        }
    }

    /// The packet's IP length: header and payload.
    #[inline(always)]
    pub fn ip_len<F: Frame>(&self, ctx: &F) -> Result<u16, RewriteFailed> {
        Ok(match self.family() {
            Family::V4 => u16::from_be(ctx.load::<u16>(self.l3() + 2)?),
            Family::V6 => u16::from_be(ctx.load::<u16>(self.l3() + 4)?).saturating_add(40),
        })
    }

    /// The packet's IP length once a DSR option is added
    /// (`add_dsr_option`).
    #[inline(always)]
    pub fn ip_len_with_dsr_option<F: Frame>(&self, ctx: &F) -> Result<u16, RewriteFailed> {
        let added = match self.family() {
            Family::V4 => u16::from(dsr_option::V4_LEN),
            Family::V6 => u16::from(dsr_option::V6_HDR_LEN),
        };
        Ok(self.ip_len(ctx)?.saturating_add(added))
    }

    /// The frontend address of the packet's DSR option (`dsr_port` is not
    /// 0): IPv4 after the option's type, length and port; IPv6 after the
    /// Destination Options header's first 4 bytes.
    #[inline(always)]
    pub fn dsr_addr<F: Frame>(&self, ctx: &F) -> Result<Addr, RewriteFailed> {
        match self.family() {
            Family::V4 => Ok(mapped_v4(ctx.load::<[u8; 4]>(self.l3() + 24)?)),
            Family::V6 => ctx.load::<Addr>(self.l3() + 44),
        }
    }

    /// Inserts the DSR option naming the packet's destination (the
    /// frontend, before it is rewritten) right after the fixed IP header (IPv4: an 8-byte option, the header
    /// length, total length and checksum updated; IPv6: a 24-byte
    /// Destination Options header). The TCP/UDP checksum covers neither.
    /// Fails when the hook cannot grow the packet (XDP) or an IPv4 header
    /// has no room for 8 more bytes.
    #[inline(never)]
    pub fn add_dsr_option<F: Frame>(&mut self, ctx: &F) -> Result<(), RewriteFailed> {
        let port = self.dport;
        match self.family() {
            Family::V4 => {
                let Some(a) = as_v4(&self.dst) else { return Err(RewriteFailed) };
                let head = ctx.load::<[u8; 4]>(self.l3())?;
                if head[0] & 0x0f > 15 - 2 {
                    return Err(RewriteFailed);
                }
                let total = u16::from_be_bytes([head[2], head[3]]).checked_add(8).ok_or(RewriteFailed)?.to_be_bytes();
                let new_head = [head[0] + 2, head[1], total[0], total[1]];
                let p = port.to_ne_bytes();
                let opt = [dsr_option::V4_TYPE, dsr_option::V4_LEN, p[0], p[1], a[0], a[1], a[2], a[3]];
                ctx.grow_net(u32::from(dsr_option::V4_LEN))?;
                ctx.store(self.l3(), &new_head)?;
                ctx.store(self.l3() + 20, &opt)?;
                // The header checksum: the first word changed, the option
                // words were added.
                let mut from = [u32::from_ne_bytes(head)];
                let mut to = [
                    u32::from_ne_bytes(new_head),
                    u32::from_ne_bytes([opt[0], opt[1], opt[2], opt[3]]),
                    u32::from_ne_bytes(a),
                ];
                let diff = csum_diff_words(&mut from, &mut to);
                if diff < 0 {
                    return Err(RewriteFailed);
                }
                #[expect(clippy::cast_sign_loss, reason = "checked non-negative")]
                ctx.l3_csum_replace(self.l3() + 10, 0, diff as u64, 0)?;
                self.l4 += usize::from(dsr_option::V4_LEN);
            }
            Family::V6 => {
                let payload = ctx.load::<[u8; 2]>(self.l3() + 4)?;
                let payload = u16::from_be_bytes(payload)
                    .checked_add(u16::from(dsr_option::V6_HDR_LEN))
                    .ok_or(RewriteFailed)?
                    .to_be_bytes();
                ctx.grow_net(u32::from(dsr_option::V6_HDR_LEN))?;
                let opt = self.l3() + 40;
                ctx.store(opt, &[self.proto, 2, dsr_option::V6_TYPE, dsr_option::V6_OPT_LEN])?;
                ctx.store(opt + 4, &self.dst)?;
                ctx.store(opt + 20, &[port, 0])?;
                ctx.store(self.l3() + 4, &payload)?;
                ctx.store(self.l3() + 6, &IPPROTO_DSTOPTS)?;
                self.l4 += usize::from(dsr_option::V6_HDR_LEN);
            }
        }
        Ok(())
    }
}
