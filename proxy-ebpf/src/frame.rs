//! What the translation of traffic from outside needs of the hook it runs
//! in: reading and writing packet bytes, checksum updates, the route of a
//! packet, sending it on, and the hook's verdicts. `nodeport.rs` and
//! `packet.rs` are written once against `Frame`; TC (`Tc`, below: on the
//! node's external devices, and on pod-facing devices for the pods' own
//! traffic, `pod.rs`) and XDP (`XdpContext`, in `xdp.rs`) implement it, so
//! every hook gives the same rewritten packets for the same input.
use crate::{
    access::{Route, adjust_room_mac, adjust_room_net, gso_size, redirect, skb_ifindex},
    maps::count_external,
    packet::{Packet, PortRewrite, RewriteFailed},
    reject,
};
use aya_ebpf::{
    EbpfContext,
    bindings::{__sk_buff, TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use core::ffi::c_void;
use proxy_common::external_stat;

/// `l4_csum_replace` flags (linux/bpf.h): the low 4 bits are the size of
/// the replaced field (0: `to` is a `csum_diff`).
pub const BPF_F_PSEUDO_HDR: u64 = 1 << 4;
pub const BPF_F_MARK_MANGLED_0: u64 = 1 << 5;
pub const CSUM_SIZE_MASK: u64 = 0xf;

/// A packet on a hook. Offsets are from the start of the Ethernet header.
pub trait Frame: EbpfContext {
    /// The packet goes on its way (TC_ACT_OK, XDP_PASS).
    const PASS: i32;
    /// The packet is dropped (TC_ACT_SHOT, XDP_DROP).
    const DROP: i32;
    /// Whether the packets are a pod's own, seen on the pod-facing device
    /// (`pod.rs`): any frontend a pod may reach, its backend chosen as the
    /// socket programs choose it, source NAT only for hairpin. Otherwise
    /// traffic from outside the node.
    const FROM_POD: bool = false;
    /// Where this hook's counters start in `EXTERNAL_STATS`
    /// (`external_stat::POD_BASE` for the pods' traffic).
    const STATS_BASE: u32 = 0;
    /// Whether route lookups must resolve the next hop's link-layer
    /// address: a hook that sends frames itself (XDP) needs it, TC lets
    /// the kernel resolve it (`bpf_redirect_neigh`).
    const SENDS_FRAMES: bool;

    fn load<T>(&self, offset: usize) -> Result<T, RewriteFailed>;
    fn store<T>(&self, offset: usize, value: &T) -> Result<(), RewriteFailed>;
    /// Updates the IPv4 header checksum at `offset` for a `size`-byte
    /// field (2 or 4) that changes from `from` to `to`.
    fn l3_csum_replace(&self, offset: usize, from: u64, to: u64, size: u64) -> Result<(), RewriteFailed>;
    /// Updates the TCP or UDP checksum at `offset`, as the kernel's
    /// `bpf_l4_csum_replace` (`flags`: its size and flags above).
    fn l4_csum_replace(&self, offset: usize, from: u64, to: u64, flags: u64) -> Result<(), RewriteFailed>;
    /// Rewrites a port with the checksum that covers it.
    #[inline(always)]
    fn rewrite_port(&self, at: PortRewrite) -> Result<(), RewriteFailed> {
        at.apply(self)
    }
    /// Makes `len` bytes of room right after the fixed IP header (for a
    /// DSR option): TC can (`bpf_skb_adjust_room`); XDP does not, and
    /// leaves packets that need it to TC (`GROWS`).
    fn grow_net(&self, len: u32) -> Result<(), RewriteFailed>;
    /// Whether `grow_net` can succeed on this hook.
    const GROWS: bool;
    /// Makes room for an outer IP header of `len` bytes (`v6`: IPv6) right
    /// after the Ethernet header (`encap.rs`); only where `GROWS`.
    fn grow_outer(&self, _len: u32, _v6: bool) -> Result<(), RewriteFailed> {
        Err(RewriteFailed)
    }
    /// Takes away the outer IP header of `len` bytes after the Ethernet
    /// header; only where `GROWS`.
    fn strip_outer(&self, _len: u32) -> Result<(), RewriteFailed> {
        Err(RewriteFailed)
    }
    /// The IP length of the segments of a GSO packet, from the start of
    /// `l3` to the end of a segment's payload, given where its L4 header
    /// starts (`l4`; `tcp`: a TCP header, else UDP's); 0 when the packet is
    /// not GSO or the hook sees single frames (XDP).
    fn segment_len(&self, _l3: usize, _l4: usize, _tcp: bool) -> u32 {
        0
    }
    /// The index of the device the packet arrived on (or leaves by).
    fn ifindex(&self) -> u32;
    /// Sends the rewritten packet along `route` (a forwarding route of
    /// `route_status`, its TTL already decremented); returns the verdict.
    fn send(&self, route: &Route) -> i32;
    /// Whether `send` can send along `route`: TC always can
    /// (`bpf_redirect_neigh`); XDP only back out of the device the frame
    /// came in on (`XDP_TX`), since `XDP_REDIRECT` to a device that cannot
    /// transmit XDP frames (a bridge, vxlan, a veth whose peer runs no XDP)
    /// drops them where nothing counts it.
    fn can_send(&self, route: &Route) -> bool;
    /// Answers a packet to a frontend without any endpoint (`reject.rs`),
    /// or leaves it to a hook that can; returns the verdict.
    fn reject(&self, pkt: &Packet) -> i32;
    /// Answers a packet too long for its route once encapsulated with
    /// ICMP fragmentation needed (`reject::frag_needed`), or leaves it to a
    /// hook that can; returns the verdict.
    fn too_big(&self, _pkt: &Packet, _mtu: u16) -> i32 {
        self.unfinished(external_stat::DSR_TOO_BIG)
    }
    /// A packet this hook cannot finish (`stat` says why: no route, no
    /// neighbour entry yet): TC drops it, XDP leaves it untouched to TC.
    fn unfinished(&self, stat: u32) -> i32;
    /// Counts a packet this hook translated and sent (or passed on to the
    /// stack) itself.
    #[inline(always)]
    fn translated(&self) {}
    /// A packet to a frontend that netfilter serves (taking over from
    /// kube-proxy): untouched to the kernel. TC counts it; XDP passes it to
    /// TC, which decides (and counts) again.
    #[inline(always)]
    fn left_to_kernel(&self) -> i32 {
        Self::count(external_stat::LEFT_TO_KERNEL);
        Self::PASS
    }
    /// Counts `stat` (an `external_stat`) among this hook's counters.
    #[inline(always)]
    fn count(stat: u32) {
        count_external(Self::STATS_BASE + stat);
    }
}

/// A TC program's packet: `POD` for the programs on pod-facing devices
/// (`pod.rs`), else those on the node's external devices.
pub struct Tc<const POD: bool>(pub TcContext);

impl<const POD: bool> EbpfContext for Tc<POD> {
    #[inline(always)]
    fn as_ptr(&self) -> *mut c_void {
        self.0.as_ptr()
    }
}

impl<const POD: bool> Frame for Tc<POD> {
    const PASS: i32 = TC_ACT_OK;
    const DROP: i32 = TC_ACT_SHOT;
    const SENDS_FRAMES: bool = false;
    const GROWS: bool = true;
    const FROM_POD: bool = POD;
    const STATS_BASE: u32 = if POD { external_stat::POD_BASE } else { 0 };

    #[inline(always)]
    fn grow_net(&self, len: u32) -> Result<(), RewriteFailed> {
        if adjust_room_net(&self.0, len) { Ok(()) } else { Err(RewriteFailed) }
    }

    #[inline(always)]
    fn grow_outer(&self, len: u32, v6: bool) -> Result<(), RewriteFailed> {
        // linux/bpf.h: BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, _IPV6.
        let flags = if v6 { 1 << 2 } else { 1 << 1 };
        let len = i32::try_from(len).map_err(|_| RewriteFailed)?;
        if adjust_room_mac(&self.0, len, flags) { Ok(()) } else { Err(RewriteFailed) }
    }

    #[inline(always)]
    fn strip_outer(&self, len: u32) -> Result<(), RewriteFailed> {
        let len = i32::try_from(len).map_err(|_| RewriteFailed)?;
        if adjust_room_mac(&self.0, -len, 0) { Ok(()) } else { Err(RewriteFailed) }
    }

    #[inline(always)]
    fn segment_len(&self, l3: usize, l4: usize, tcp: bool) -> u32 {
        let gso = gso_size(&self.0);
        if gso == 0 {
            return 0;
        }
        // The TCP header's length (its data offset), or UDP's 8 bytes.
        let l4_len = if tcp { self.load::<u8>(l4 + 12).map_or(20, |off| u32::from(off >> 4) * 4) } else { 8 };
        u32::try_from(l4 - l3).unwrap_or(0) + l4_len + gso
    }

    #[inline(always)]
    fn load<T>(&self, offset: usize) -> Result<T, RewriteFailed> {
        self.0.load(offset).map_err(|_| RewriteFailed)
    }

    #[inline(always)]
    fn store<T>(&self, offset: usize, value: &T) -> Result<(), RewriteFailed> {
        self.0.store(offset, value, 0).map_err(|_| RewriteFailed)
    }

    #[inline(always)]
    fn l3_csum_replace(&self, offset: usize, from: u64, to: u64, size: u64) -> Result<(), RewriteFailed> {
        self.0.l3_csum_replace(offset, from, to, size).map_err(|_| RewriteFailed)
    }

    #[inline(always)]
    fn l4_csum_replace(&self, offset: usize, from: u64, to: u64, flags: u64) -> Result<(), RewriteFailed> {
        self.0.l4_csum_replace(offset, from, to, flags).map_err(|_| RewriteFailed)
    }

    /// Out of line, in a global function (`tc_rewrite_port`).
    #[inline(always)]
    fn rewrite_port(&self, at: PortRewrite) -> Result<(), RewriteFailed> {
        if tc_rewrite_port(self.0.skb.skb, at.pack()) == 0 { Ok(()) } else { Err(RewriteFailed) }
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        skb_ifindex(&self.0)
    }

    #[inline(always)]
    fn can_send(&self, _route: &Route) -> bool {
        true
    }

    #[inline(always)]
    fn send(&self, route: &Route) -> i32 {
        redirect(route)
    }

    #[inline(always)]
    fn reject(&self, pkt: &Packet) -> i32 {
        reject::reject(&self.0, pkt, Self::STATS_BASE)
    }

    #[inline(always)]
    fn too_big(&self, pkt: &Packet, mtu: u16) -> i32 {
        reject::frag_needed(&self.0, pkt, mtu, Self::STATS_BASE)
    }

    #[inline(always)]
    fn unfinished(&self, stat: u32) -> i32 {
        Self::count(stat);
        TC_ACT_SHOT
    }
}

/// A port rewrite (`PortRewrite::apply`) of a TC program's packet, as a
/// global function (exported by the link, `build.rs`): the verifier
/// checks a global function once, alone, with only its arguments' types
/// known, and its callers go on from an unknown result. A static function
/// is walked again at every call site with the caller's state, and SCTP's
/// CRC update behind every port rewrite doubled what the verifier walked
/// in `nodeport_ingress` and `pod_ingress` (docs/performance.md).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn tc_rewrite_port(skb: *mut __sk_buff, at: u64) -> i64 {
    let ctx = Tc::<false>(TcContext::new(skb));
    match PortRewrite::unpack(at).apply(&ctx) {
        Ok(()) => 0,
        Err(RewriteFailed) => -1,
    }
}

/// The 16-bit one's-complement checksum at `offset` updated in software
/// for `from` replaced by `to` (RFC 1624, eqn. 3: `~(~old + ~from + to)`),
/// with the size and flags of `bpf_l4_csum_replace` (size 0: `to` is a
/// `csum_diff`): the same bits the kernel's helpers write for a packet
/// whose checksum is complete, which is what XDP sees.
#[inline(always)]
pub fn csum_replace_sw<F: Frame>(ctx: &F, offset: usize, from: u64, to: u64, flags: u64) -> Result<(), RewriteFailed> {
    let old: u16 = ctx.load(offset)?;
    let mangled_0 = flags & BPF_F_MARK_MANGLED_0 != 0;
    if mangled_0 && old == 0 {
        // A UDP datagram without checksum (IPv4) keeps none.
        return Ok(());
    }
    let mut acc = u64::from(!old);
    #[expect(clippy::cast_possible_truncation, reason = "the values are as wide as their size says")]
    match flags & CSUM_SIZE_MASK {
        0 => acc += to & 0xffff_ffff,
        2 => acc += u64::from(!(from as u16)) + u64::from(to as u16),
        4 => acc += u64::from(!(from as u32)) + u64::from(to as u32),
        _ => return Err(RewriteFailed),
    }
    // Three folds bring any sum of these few terms below 2^16.
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    #[expect(clippy::cast_possible_truncation, reason = "folded to 16 bits")]
    let mut new = !(acc as u16);
    if mangled_0 && new == 0 {
        new = 0xffff;
    }
    ctx.store(offset, &new)
}

/// Counts `stat` and gives the hook's drop verdict.
#[inline(always)]
pub fn drop_packet<F: Frame>(stat: u32) -> i32 {
    F::count(stat);
    F::DROP
}
