//! The XDP program in front of the TC ingress program on devices with
//! native XDP (`--nodeport-acceleration`): the same translation
//! (`nodeport.rs`), run before the kernel allocates a socket buffer.
//!
//! What it finishes itself: packets to a frontend whose backend is on this
//! node (rewritten, then passed to the stack), whose backend is on another
//! node when the route leaves by the device it came in on (rewritten and
//! sent back out with `XDP_TX`), and the replies of source-NATed flows back
//! to their clients. Everything else passes untouched to the TC programs,
//! which do what XDP cannot: anything not parsed (fragments, ICMP errors,
//! IPv6 extension headers, other protocols), rejections (the reply is
//! built on the socket buffer), packets routed out of another device
//! (`XDP_REDIRECT` would drop them, uncounted, on a device that cannot
//! transmit XDP frames), and packets whose next hop has no
//! link-layer address yet (TC's `bpf_redirect_neigh` resolves it; the
//! flow is already in `CT`, so TC takes the same backend), and the packets
//! of a DSR flow that carry its option (TCP SYNs, UDP datagrams: XDP does
//! not grow packets; a DSR flow's other packets it sends itself). XDP sees
//! packets whose checksums are complete (from a NIC); the checksums are
//! updated in software (`frame::csum_replace_sw`).
use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use proxy_common::external_stat;

use crate::{
    access::{Route, xdp_ifindex, xdp_load, xdp_store},
    frame::{CSUM_SIZE_MASK, Frame, csum_replace_sw},
    maps::count_external,
    nodeport,
    packet::{Packet, RewriteFailed},
};

#[expect(clippy::cast_possible_wrap, reason = "XDP actions are small")]
const fn action(a: u32) -> i32 {
    a as i32
}

impl Frame for XdpContext {
    const PASS: i32 = action(xdp_action::XDP_PASS);
    const DROP: i32 = action(xdp_action::XDP_DROP);
    const SENDS_FRAMES: bool = true;
    const GROWS: bool = false;

    /// Not here: moving the headers with `bpf_xdp_adjust_head` is left
    /// undone; TC adds DSR options (`Frame::GROWS`).
    #[inline(always)]
    fn grow_net(&self, _len: u32) -> Result<(), RewriteFailed> {
        Err(RewriteFailed)
    }

    #[inline(always)]
    fn load<T>(&self, offset: usize) -> Result<T, RewriteFailed> {
        xdp_load(self, offset).ok_or(RewriteFailed)
    }

    #[inline(always)]
    fn store<T>(&self, offset: usize, value: &T) -> Result<(), RewriteFailed> {
        if xdp_store(self, offset, value) { Ok(()) } else { Err(RewriteFailed) }
    }

    #[inline(always)]
    fn l3_csum_replace(&self, offset: usize, from: u64, to: u64, size: u64) -> Result<(), RewriteFailed> {
        csum_replace_sw(self, offset, from, to, size & CSUM_SIZE_MASK)
    }

    #[inline(always)]
    fn l4_csum_replace(&self, offset: usize, from: u64, to: u64, flags: u64) -> Result<(), RewriteFailed> {
        csum_replace_sw(self, offset, from, to, flags)
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        xdp_ifindex(self)
    }

    #[inline(always)]
    fn send(&self, route: &Route) -> i32 {
        if self.store(0, &route.macs).is_err() {
            count_external(external_stat::REWRITE_FAILED);
            return Self::DROP;
        }
        action(xdp_action::XDP_TX)
    }

    #[inline(always)]
    fn can_send(&self, route: &Route) -> bool {
        route.ifindex == self.ifindex()
    }

    #[inline(always)]
    fn reject(&self, _pkt: &Packet) -> i32 {
        count_external(external_stat::XDP_TO_TC);
        Self::PASS
    }

    #[inline(always)]
    fn unfinished(&self, _stat: u32) -> i32 {
        count_external(external_stat::XDP_TO_TC);
        Self::PASS
    }

    #[inline(always)]
    fn translated(&self) {
        count_external(external_stat::XDP_TRANSLATED);
    }

    #[inline(always)]
    fn left_to_kernel(&self) -> i32 {
        Self::PASS
    }
}

/// The XDP verdict for a packet arriving on a node device.
#[inline(always)]
pub fn ingress(ctx: &XdpContext) -> u32 {
    u32::try_from(nodeport::ingress(ctx)).unwrap_or(xdp_action::XDP_ABORTED)
}
