//! Thin wrappers around the raw context and helpers: with the map accessors
//! of `maps.rs`, the only `unsafe` code.
use aya_ebpf::{
    EbpfContext,
    bindings::{bpf_fib_lookup, bpf_redir_neigh},
    helpers::generated::{
        bpf_csum_diff, bpf_fib_lookup as fib_lookup_helper, bpf_get_netns_cookie, bpf_get_prandom_u32,
        bpf_get_smp_processor_id, bpf_get_socket_cookie, bpf_ktime_get_ns, bpf_loop, bpf_redirect, bpf_redirect_neigh,
        bpf_set_retval, bpf_sk_lookup_udp, bpf_sk_release, bpf_skb_adjust_room, bpf_skb_change_tail,
        bpf_skc_lookup_tcp, bpf_xdp_load_bytes, bpf_xdp_store_bytes,
    },
    programs::{SockAddrContext, SockContext, TcContext, XdpContext},
};
use proxy_common::{Addr, as_v4, mapped_v4};

use crate::frame::Frame;

/// The address family of a hook.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// The `bpf_sock_addr` of a cgroup socket-address hook.
pub struct SockAddr<'a> {
    ctx: &'a SockAddrContext,
}

impl<'a> SockAddr<'a> {
    #[inline(always)]
    pub fn new(ctx: &'a SockAddrContext) -> Self {
        Self { ctx }
    }

    /// IP protocol of the socket (6 TCP, 17 UDP).
    #[inline(always)]
    pub fn protocol(&self) -> u32 {
        // SAFETY: the kernel hands every sock_addr program a valid context.
        unsafe { (*self.ctx.sock_addr).protocol }
    }

    /// The destination (or, in recvmsg/getpeername, the peer) address, in
    /// the 16-byte form of the maps.
    #[inline(always)]
    pub fn addr(&self, family: Family) -> Addr {
        // SAFETY: as in `protocol`; user_ip4 and user_ip6 are readable as
        // 32-bit words in sock_addr programs of their family.
        let sa = unsafe { &*self.ctx.sock_addr };
        match family {
            Family::V4 => mapped_v4(sa.user_ip4.to_ne_bytes()),
            Family::V6 => Addr::from_words(sa.user_ip6),
        }
    }

    /// Sets the destination (or peer) address; false when an IPv4 socket
    /// is asked to take an IPv6 address.
    #[inline(always)]
    #[must_use]
    pub fn set_addr(&self, family: Family, addr: &Addr) -> bool {
        // SAFETY: user_ip4/user_ip6 are writable as 32-bit words in the
        // connect, sendmsg, recvmsg and getpeername programs.
        let sa = unsafe { &mut *self.ctx.sock_addr };
        match family {
            Family::V4 => match as_v4(addr) {
                Some(octets) => {
                    sa.user_ip4 = u32::from_ne_bytes(octets);
                    true
                }
                None => false,
            },
            Family::V6 => {
                sa.user_ip6 = addr.words();
                true
            }
        }
    }

    /// Destination port, network byte order (the kernel keeps it in the low
    /// 16 bits of a 32-bit field).
    #[inline(always)]
    #[expect(clippy::cast_possible_truncation, reason = "the port is the low 16 bits")]
    pub fn user_port(&self) -> u16 {
        // SAFETY: as in `protocol`.
        unsafe { (*self.ctx.sock_addr).user_port as u16 }
    }

    #[inline(always)]
    pub fn set_user_port(&self, port: u16) {
        // SAFETY: `user_port` is writable in connect4/sendmsg4 programs.
        unsafe { (*self.ctx.sock_addr).user_port = u32::from(port) }
    }
}

/// The socket's cookie: unique for its life, the key of per-socket memos.
#[inline(always)]
pub fn socket_cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: valid for sock_addr programs (bpf_get_socket_cookie_sock_addr).
    unsafe { bpf_get_socket_cookie(ctx.as_ptr()) }
}

/// The cookie of a `cgroup/sock_*` program's socket: the same value
/// `socket_cookie` gives at connect and sendmsg.
#[inline(always)]
pub fn sock_cookie(ctx: &SockContext) -> u64 {
    // SAFETY: valid for cgroup sock programs (bpf_get_socket_cookie_sock).
    unsafe { bpf_get_socket_cookie(ctx.as_ptr()) }
}

/// The cookie of the socket's network namespace: the client identity for
/// session affinity (one pod, one namespace).
#[inline(always)]
pub fn netns_cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: valid for sock_addr programs (5.7+).
    unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }
}

/// `BPF_F_CURRENT_NETNS`: look sockets up in the packet's namespace.
const CURRENT_NETNS: u64 = u64::MAX;
/// `TCP_LISTEN` (include/net/tcp_states.h).
const TCP_LISTEN: u32 = 10;

/// Whether a socket of this network namespace owns the TCP or UDP flow of
/// a packet arriving from `(src, sport)` to `(dst, dport)` (ports in
/// network order): an established (or closing) TCP socket, or a connected
/// UDP socket, whose local end is the packet's destination. A listener or
/// an unconnected UDP socket does not own a flow: a service's port wins
/// over them, as kube-proxy's DNAT in PREROUTING does.
#[inline(always)]
pub fn local_socket_owns(ctx: &impl EbpfContext, tcp: bool, src: &Addr, sport: u16, dst: &Addr, dport: u16) -> bool {
    // `struct bpf_sock_tuple`: IPv4's 12 bytes or IPv6's 36.
    let mut tuple = [0u8; 36];
    let size = if let (Some(s), Some(d)) = (as_v4(src), as_v4(dst)) {
        tuple[..4].copy_from_slice(&s);
        tuple[4..8].copy_from_slice(&d);
        tuple[8..10].copy_from_slice(&sport.to_ne_bytes());
        tuple[10..12].copy_from_slice(&dport.to_ne_bytes());
        12
    } else {
        tuple[..16].copy_from_slice(&src.0);
        tuple[16..32].copy_from_slice(&dst.0);
        tuple[32..34].copy_from_slice(&sport.to_ne_bytes());
        tuple[34..36].copy_from_slice(&dport.to_ne_bytes());
        36
    };
    // SAFETY: the tuple is initialised stack memory of the size given; a
    // socket found is read through the pointer the helper returned and
    // released before it goes out of scope, as the verifier demands.
    unsafe {
        // Two calls, not one through a pointer: BPF has no indirect call.
        let sk = if tcp {
            bpf_skc_lookup_tcp(ctx.as_ptr(), tuple.as_mut_ptr().cast(), size, CURRENT_NETNS, 0)
        } else {
            bpf_sk_lookup_udp(ctx.as_ptr(), tuple.as_mut_ptr().cast(), size, CURRENT_NETNS, 0)
        };
        if sk.is_null() {
            return false;
        }
        let owns = if tcp { (*sk).state != TCP_LISTEN } else { (*sk).dst_port != 0 };
        bpf_sk_release(sk.cast());
        owns
    }
}

/// Monotonic time in nanoseconds.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: takes no arguments and cannot fail.
    unsafe { bpf_ktime_get_ns() }
}

/// The CPU the program runs on (below the possible CPUs' count; a
/// program runs to its end on one CPU).
#[inline(always)]
pub fn cpu() -> u32 {
    // SAFETY: the helper takes no arguments and cannot fail.
    unsafe { bpf_get_smp_processor_id() }
}

#[inline(always)]
pub fn random_u32() -> u32 {
    // SAFETY: the helper takes no arguments and cannot fail.
    unsafe { bpf_get_prandom_u32() }
}

/// Sets the error the syscall returns when the program rejects it.
#[inline(always)]
pub fn set_syscall_error(errno: i32) {
    // SAFETY: cgroup programs may call bpf_set_retval (5.18+). Its result is
    // an error only when the value is not a valid errno, which ours are.
    unsafe { bpf_set_retval(-errno) };
}

/// The index of the device the packet is on.
#[inline(always)]
pub fn skb_ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: tc programs get a valid __sk_buff; ifindex is readable.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// `bpf_fib_lookup`: the kernel's route for `params` (see linux/bpf.h);
/// returns its status (0: forwarded, neighbour known).
#[inline(always)]
#[expect(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "the struct is 64 bytes")]
pub fn fib_lookup(ctx: &impl EbpfContext, params: &mut bpf_fib_lookup, flags: u32) -> i64 {
    // SAFETY: `params` is a valid, initialised struct of the size passed.
    unsafe { fib_lookup_helper(ctx.as_ptr(), core::ptr::from_mut(params), size_of::<bpf_fib_lookup>() as i32, flags) }
}

/// Sends the packet out of `ifindex` to the neighbour `nh`, resolving its
/// link-layer address; the program must then return the value returned.
#[inline(always)]
pub fn redirect_neigh(ifindex: u32, nh: &mut bpf_redir_neigh) -> i32 {
    // SAFETY: `nh` is a valid struct of the size passed.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        reason = "the helper returns a TC action; the struct is 20 bytes"
    )]
    unsafe {
        bpf_redirect_neigh(ifindex, core::ptr::from_mut(nh), size_of::<bpf_redir_neigh>() as i32, 0) as i32
    }
}

/// Sends the packet back out of the device it arrived on (a reply built in
/// its place); the program must then return the value returned.
#[inline(always)]
pub fn redirect_back(ctx: &TcContext) -> i32 {
    // SAFETY: the helper takes plain integers; an unknown ifindex makes the
    // redirect fail later, in the kernel, not here.
    #[expect(clippy::cast_possible_truncation, reason = "the helper returns a TC action")]
    unsafe {
        bpf_redirect(skb_ifindex(ctx), 0) as i32
    }
}

/// Cuts the packet to `len` bytes, or grows it with zeros at its end;
/// false when the kernel refuses.
#[inline(always)]
pub fn change_tail(ctx: &TcContext, len: u32) -> bool {
    // SAFETY: tc programs get a valid __sk_buff; flags must be 0.
    unsafe { bpf_skb_change_tail(ctx.skb.skb, len, 0) == 0 }
}

/// The index of the device an XDP packet arrived on.
#[inline(always)]
pub fn xdp_ifindex(ctx: &XdpContext) -> u32 {
    // SAFETY: XDP programs get a valid xdp_md; ingress_ifindex is readable.
    unsafe { (*ctx.ctx).ingress_ifindex }
}

/// Copies `size_of::<T>()` bytes at `offset` of an XDP packet (linear or
/// not) into a `T`; `None` when they are not all in the packet. `T` is
/// plain bytes (integers, arrays, addresses).
#[inline(always)]
pub fn xdp_load<T>(ctx: &XdpContext, offset: usize) -> Option<T> {
    let mut out = core::mem::MaybeUninit::<T>::uninit();
    let (offset, len) = (u32::try_from(offset).ok()?, u32::try_from(size_of::<T>()).ok()?);
    // SAFETY: `out` has room for `len` bytes; the helper checks the packet
    // bounds and writes all of them, or fails.
    let ret = unsafe { bpf_xdp_load_bytes(ctx.ctx, offset, out.as_mut_ptr().cast(), len) };
    // SAFETY: the helper filled every byte, and `T` is plain bytes.
    (ret == 0).then(|| unsafe { out.assume_init() })
}

/// Writes `value`'s bytes at `offset` of an XDP packet; false when they
/// do not all fit in the packet.
#[inline(always)]
pub fn xdp_store<T>(ctx: &XdpContext, offset: usize, value: &T) -> bool {
    let (Ok(offset), Ok(len)) = (u32::try_from(offset), u32::try_from(size_of::<T>())) else { return false };
    // SAFETY: `value` is `len` readable bytes; the helper only reads them
    // (its pointer is not const in the bindings) and checks the bounds.
    unsafe { bpf_xdp_store_bytes(ctx.ctx, offset, core::ptr::from_ref(value).cast_mut().cast(), len) == 0 }
}

/// The one's-complement checksum difference of replacing `from` by `to`
/// (network-order words), for `l4_csum_replace` with a size of 0.
#[inline(always)]
pub fn csum_diff(from: &mut [u32; 4], to: &mut [u32; 4]) -> i64 {
    // SAFETY: both buffers are 16 bytes, 4-byte aligned, as passed.
    unsafe { bpf_csum_diff(from.as_mut_ptr(), 16, to.as_mut_ptr(), 16, 0) }
}

/// The one's-complement checksum difference of replacing the words `from`
/// by the words `to` (network order; the lengths may differ: words added
/// or removed).
#[inline(always)]
pub fn csum_diff_words<const A: usize, const B: usize>(from: &mut [u32; A], to: &mut [u32; B]) -> i64 {
    #[expect(clippy::cast_possible_truncation, reason = "a few words")]
    // SAFETY: both buffers are as long as passed, 4-byte aligned.
    unsafe {
        bpf_csum_diff(from.as_mut_ptr(), (A * 4) as u32, to.as_mut_ptr(), (B * 4) as u32, 0)
    }
}

/// Makes `len` bytes of room right after the fixed IP header (20 bytes
/// for IPv4, 40 for IPv6: `BPF_ADJ_ROOM_NET`); false when the kernel
/// refuses. The bytes are then written by the caller.
#[inline(always)]
pub fn adjust_room_net(ctx: &TcContext, len: u32) -> bool {
    const BPF_ADJ_ROOM_NET: u32 = 0;
    // SAFETY: tc programs get a valid __sk_buff; the helper checks the rest.
    unsafe { bpf_skb_adjust_room(ctx.skb.skb, i32::try_from(len).unwrap_or(0), BPF_ADJ_ROOM_NET, 0) == 0 }
}

/// Adds (`len` > 0) or takes away (`len` < 0) `len` bytes right after the
/// Ethernet header (`BPF_ADJ_ROOM_MAC`): room for an outer IP header, or
/// the outer header of an IPIP packet removed. `flags`: the kernel's
/// `BPF_F_ADJ_ROOM_ENCAP_L3_*` when adding one, so that a GSO packet is
/// segmented as a tunnel's. False when the kernel refuses.
#[inline(always)]
pub fn adjust_room_mac(ctx: &TcContext, len: i32, flags: u64) -> bool {
    const BPF_ADJ_ROOM_MAC: u32 = 1;
    // SAFETY: tc programs get a valid __sk_buff; the helper checks the rest.
    unsafe { bpf_skb_adjust_room(ctx.skb.skb, len, BPF_ADJ_ROOM_MAC, flags) == 0 }
}

/// The size of the segments a GSO packet will be cut into (0: not GSO).
#[inline(always)]
pub fn gso_size(ctx: &TcContext) -> u32 {
    // SAFETY: tc programs get a valid __sk_buff, which has this field.
    unsafe { (*ctx.skb.skb).gso_size }
}

/// `bpf_fib_lookup` flags (linux/bpf.h).
const BPF_FIB_LOOKUP_SKIP_NEIGH: u32 = 1 << 2;
const BPF_FIB_LOOKUP_SRC: u32 = 1 << 4;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// A route question and the kernel's answer (`route`).
pub struct Route {
    /// In: protocol, ports (network order), addresses of the packet.
    pub proto: u8,
    /// In: ask for the source address the route prefers (`src`).
    pub want_src: bool,
    /// In: the packet's IP length as it will leave, checked against the
    /// route's MTU (`ROUTE_FRAG_NEEDED`); 0: the kernel checks the packet
    /// as it is now. Out, on `ROUTE_FRAG_NEEDED`: the route's MTU.
    pub tot_len: u16,
    pub sport: u16,
    pub dport: u16,
    pub src: Addr,
    pub dst: Addr,
    /// Out: the device to send on.
    pub ifindex: u32,
    /// Out: the next hop, a gateway or the destination itself.
    pub nexthop: Addr,
    /// Out, for a hook that sends frames itself (`Frame::SENDS_FRAMES`):
    /// the Ethernet destination and source, in header order.
    pub macs: [u8; 12],
}

impl Route {
    #[inline(always)]
    pub fn new(proto: u8, src: &Addr, sport: u16, dst: &Addr, dport: u16) -> Self {
        Self {
            proto,
            want_src: false,
            tot_len: 0,
            sport,
            dport,
            src: *src,
            dst: *dst,
            ifindex: 0,
            nexthop: Addr::default(),
            macs: [0; 12],
        }
    }
}

/// `bpf_fib_lookup`'s answer for a packet longer than the route's MTU
/// (`BPF_FIB_LKUP_RET_FRAG_NEEDED`, linux/bpf.h).
pub const ROUTE_FRAG_NEEDED: i64 = 8;

/// `bpf_fib_lookup`'s answer for a destination that is not forwarded: a
/// local address of the node (among others: linux/bpf.h,
/// `BPF_FIB_LKUP_RET_NOT_FWDED`).
pub const ROUTE_NOT_FORWARDED: i64 = 4;

/// Asks the routing table for `r` as if the packet entered on its device
/// (filling `ifindex`, `nexthop`, and `src` when `want_src`; for a hook
/// that sends frames itself, `macs` too); returns `bpf_fib_lookup`'s
/// status (0: forwarded, see `ROUTE_NOT_FORWARDED`; for such a hook, also
/// an unknown neighbour is not 0). IPv4 when both addresses are
/// IPv4-mapped.
#[inline(never)]
pub fn route_status<F: Frame>(ctx: &F, r: &mut Route) -> i64 {
    use aya_ebpf::bindings::{
        bpf_fib_lookup__bindgen_ty_1 as TotLen, bpf_fib_lookup__bindgen_ty_2 as Tos,
        bpf_fib_lookup__bindgen_ty_3 as Src, bpf_fib_lookup__bindgen_ty_4 as Dst, bpf_fib_lookup__bindgen_ty_5 as Vlan,
    };
    let family = if as_v4(&r.dst).is_some() { AF_INET } else { AF_INET6 };
    let mut params = bpf_fib_lookup {
        family,
        l4_protocol: r.proto,
        sport: r.sport,
        dport: r.dport,
        __bindgen_anon_1: TotLen { tot_len: r.tot_len },
        ifindex: ctx.ifindex(),
        __bindgen_anon_2: Tos { flowinfo: 0 },
        __bindgen_anon_3: Src { ipv6_src: [0; 4] },
        __bindgen_anon_4: Dst { ipv6_dst: [0; 4] },
        __bindgen_anon_5: Vlan { tbid: 0 },
        smac: [0; 6],
        dmac: [0; 6],
    };
    // IPv4 uses the first word of each address union.
    let (src, dst) = (r.src.words(), r.dst.words());
    if family == AF_INET {
        params.__bindgen_anon_4.ipv4_dst = dst[3];
        if !r.want_src {
            params.__bindgen_anon_3.ipv4_src = src[3];
        }
    } else {
        params.__bindgen_anon_4.ipv6_dst = dst;
        if !r.want_src {
            params.__bindgen_anon_3.ipv6_src = src;
        }
    }
    let resolve = F::SENDS_FRAMES && !r.want_src;
    let flags = if resolve { 0 } else { BPF_FIB_LOOKUP_SKIP_NEIGH } | if r.want_src { BPF_FIB_LOOKUP_SRC } else { 0 };
    let status = fib_lookup(ctx, &mut params, flags);
    if status == ROUTE_FRAG_NEEDED {
        // SAFETY: on this status the kernel wrote the MTU in the union.
        r.tot_len = unsafe { params.__bindgen_anon_1.mtu_result };
    }
    if status != 0 {
        return status;
    }
    r.ifindex = params.ifindex;
    if resolve {
        let (d, s) = (params.dmac, params.smac);
        r.macs = [d[0], d[1], d[2], d[3], d[4], d[5], s[0], s[1], s[2], s[3], s[4], s[5]];
    }
    // SAFETY: the kernel wrote the union members of the family asked for.
    unsafe {
        if family == AF_INET {
            if r.want_src {
                r.src = mapped_v4(params.__bindgen_anon_3.ipv4_src.to_ne_bytes());
            }
            r.nexthop = mapped_v4(params.__bindgen_anon_4.ipv4_dst.to_ne_bytes());
        } else {
            if r.want_src {
                r.src = Addr::from_words(params.__bindgen_anon_3.ipv6_src);
            }
            r.nexthop = Addr::from_words(params.__bindgen_anon_4.ipv6_dst);
        }
    }
    0
}

/// Sends the packet out along `route`, resolving the next hop's link-layer
/// address; the program returns what this returns (TC_ACT_REDIRECT).
#[inline(always)]
pub fn redirect(route: &Route) -> i32 {
    use aya_ebpf::bindings::bpf_redir_neigh__bindgen_ty_1 as Nh;
    let mut nh = match as_v4(&route.nexthop) {
        Some(v4) => {
            bpf_redir_neigh { nh_family: u32::from(AF_INET), __bindgen_anon_1: Nh { ipv4_nh: u32::from_ne_bytes(v4) } }
        }
        None => {
            bpf_redir_neigh { nh_family: u32::from(AF_INET6), __bindgen_anon_1: Nh { ipv6_nh: route.nexthop.words() } }
        }
    };
    redirect_neigh(route.ifindex, &mut nh)
}

/// Runs `step` `count` times on `state` (`bpf_loop`, Linux 5.17): the
/// verifier checks `step` once, whatever `count`, where an unrolled or
/// bounded loop is walked step by step at every call site.
#[inline(always)]
pub fn repeat<T>(count: u32, step: extern "C" fn(u64, *mut T) -> i64, state: &mut T) {
    // SAFETY: `step` takes (index, the state pointer), as bpf_loop calls
    // it; `state` outlives the call, which does not keep it.
    unsafe {
        bpf_loop(count, step as *mut core::ffi::c_void, core::ptr::from_mut(state).cast(), 0);
    }
}
