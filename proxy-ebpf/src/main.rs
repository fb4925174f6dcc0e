//! eBPF programs of ebpf-proxy. One file per hook family; `unsafe` lives in
//! the thin accessors of `access.rs` (context and helpers) and `maps.rs`
//! (map lookups and in-place updates), nowhere else.
#![no_std]
#![no_main]
// The bpf target has atomic adds (BPF_ATOMIC) but no compare-and-swap
// before cpu v3, so core's atomic types lack `fetch_add` there: the active
// connection counts (`maps.rs`) call the intrinsic behind it.
// (Only there: the workspace's clippy and tests build this crate for the
// host on stable, where `AtomicU64` has it.)
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", expect(internal_features, reason = "core_intrinsics, for atomic_xadd (see above)"))]
// Every small function is inlined on purpose: a BPF-to-BPF call costs
// stack and verifier work, and the big steps are `#[inline(never)]`
// instead (each its own frame, which keeps the stack within the
// verifier's bound; the verifier still walks a static function at every
// call site, a global one once: `frame::tc_rewrite_port`).
#![expect(clippy::inline_always, reason = "BPF: inlining is chosen per function, see above")]

mod access;
mod balance;
mod crc32c;
mod ct;
mod encap;
mod frame;
mod icmp;
mod maps;
mod nodeport;
mod packet;
mod pod;
mod reject;
mod sock;
mod xdp;

use aya_ebpf::{
    Global,
    macros::{cgroup_sock, cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, SockContext, TcContext, XdpContext},
};

/// Set to 1 by the agent's `--bpf-log`. It is read-only data, frozen at load,
/// so with 0 the verifier removes every logging branch from the hot path.
#[unsafe(no_mangle)]
static LOG_ENABLED: Global<u8> = Global::new(0);

/// Entries of each Maglev table, set by the agent at load (read-only data:
/// the verifier knows its value and so the bound of every table index).
#[unsafe(no_mangle)]
static MAGLEV_SIZE: Global<u32> = Global::new(16_381);

/// Counters of each CPU's region of `CONNECTIONS` (the frontend maps'
/// size plus one: ids from 1), set by the agent at load (read-only data).
#[unsafe(no_mangle)]
static CONNECTIONS_STRIDE: Global<u32> = Global::new(proxy_common::map_sizes::CONNECTIONS);

/// `--nodeport-mode` (`proxy_common::nodeport_mode`), set by the agent at
/// load (read-only data).
#[unsafe(no_mangle)]
static NODEPORT_MODE: Global<u8> = Global::new(0);

/// `--dsr-dispatch` (`proxy_common::dsr_dispatch`), set by the agent at
/// load (read-only data).
#[unsafe(no_mangle)]
static DSR_DISPATCH: Global<u8> = Global::new(0);

/// `--cluster-cidr`, set at load (read-only data, `proxy_common::
/// cluster_cidr`): with a CIDR set, packets routed to the node for a
/// ClusterIP are translated too.
#[unsafe(no_mangle)]
static CLUSTER_CIDR_V4: Global<[u32; 2]> = Global::new([0; 2]);
#[unsafe(no_mangle)]
static CLUSTER_CIDR_V6: Global<[u32; 8]> = Global::new([0; 8]);
/// 1 when either is set.
#[unsafe(no_mangle)]
static ROUTED_CLUSTER_IPS: Global<u8> = Global::new(0);

/// `--socket-lb host-namespace`: the cookie of the node's network
/// namespace (the agent's), set at load (read-only data). The socket
/// programs then translate only sockets of that namespace; the pods'
/// traffic goes through the per-packet path (`pod.rs`). 0: every socket.
#[unsafe(no_mangle)]
static SOCKET_LB_NETNS: Global<u64> = Global::new(0);

#[inline(always)]
fn log_enabled() -> bool {
    LOG_ENABLED.load() != 0
}

use access::Family;
use frame::Tc;
use proxy_common::{external_stat, tail_call};
use sock::Hook;

/// Translates `connect()` to a service address (TCP, and connected UDP) into
/// a connection to one of its backends.
#[cgroup_sock_addr(connect4)]
#[expect(clippy::needless_pass_by_value, reason = "aya\'s program macros hand the context by value")]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    sock::translate(&ctx, Hook::Connect, Family::V4)
}

#[cgroup_sock_addr(connect6)]
#[expect(clippy::needless_pass_by_value, reason = "aya\'s program macros hand the context by value")]
pub fn connect6(ctx: SockAddrContext) -> i32 {
    sock::translate(&ctx, Hook::Connect, Family::V6)
}

/// Translates each datagram an unconnected UDP socket sends to a service.
#[cgroup_sock_addr(sendmsg4)]
#[expect(clippy::needless_pass_by_value, reason = "aya\'s program macros hand the context by value")]
pub fn sendmsg4(ctx: SockAddrContext) -> i32 {
    sock::translate(&ctx, Hook::Sendmsg, Family::V4)
}

#[cgroup_sock_addr(sendmsg6)]
#[expect(clippy::needless_pass_by_value, reason = "aya\'s program macros hand the context by value")]
pub fn sendmsg6(ctx: SockAddrContext) -> i32 {
    sock::translate(&ctx, Hook::Sendmsg, Family::V6)
}

/// Shows the service, not the backend, as the source of a UDP reply.
#[cgroup_sock_addr(recvmsg4)]
#[expect(clippy::needless_pass_by_value, reason = "aya\'s program macros hand the context by value")]
pub fn recvmsg4(ctx: SockAddrContext) -> i32 {
    sock::restore(&ctx, Family::V4)
}

#[cgroup_sock_addr(recvmsg6)]
#[expect(clippy::needless_pass_by_value, reason = "aya\'s program macros hand the context by value")]
pub fn recvmsg6(ctx: SockAddrContext) -> i32 {
    sock::restore(&ctx, Family::V6)
}

/// Shows the service, not the backend, as the peer of a translated socket.
#[cgroup_sock_addr(getpeername4)]
#[expect(clippy::needless_pass_by_value, reason = "aya\'s program macros hand the context by value")]
pub fn getpeername4(ctx: SockAddrContext) -> i32 {
    sock::restore(&ctx, Family::V4)
}

#[cgroup_sock_addr(getpeername6)]
#[expect(clippy::needless_pass_by_value, reason = "aya\'s program macros hand the context by value")]
pub fn getpeername6(ctx: SockAddrContext) -> i32 {
    sock::restore(&ctx, Family::V6)
}

/// A socket of the cgroup is released: the active connection it counted
/// (`ACTIVE_CONNS`) is taken back. Runs for every socket, however it ends
/// (close, exit, SIGKILL).
#[cgroup_sock(sock_release)]
#[expect(clippy::needless_pass_by_value, reason = "aya\'s program macros hand the context by value")]
pub fn sock_release(ctx: SockContext) -> i32 {
    sock::release(&ctx);
    1
}

/// Traffic from outside arriving on a node device: NodePorts, LoadBalancer
/// IPs and externalIPs are balanced to a backend; replies to flows this
/// node source-NATed go back to their clients.
#[classifier]
pub fn nodeport_ingress(ctx: TcContext) -> i32 {
    let tc = Tc::<false>(ctx);
    match nodeport::ingress(&tc) {
        nodeport::BY_SNAT => {
            // Here, in the program's own frame: the kernel refuses a tail
            // call below frames of 256 bytes and more.
            maps::tail_call(&tc.0, tail_call::DSR_TO_SNAT);
            frame::drop_packet::<Tc<false>>(external_stat::DSR_TOO_BIG)
        }
        action => action,
    }
}

/// A UDP datagram of a DSR flow too long for the route with the option or
/// outer header, from `nodeport_ingress` by tail call (`TAIL_CALLS`): its
/// flow goes by source NAT from now on.
#[classifier]
pub fn nodeport_dsr_to_snat(ctx: TcContext) -> i32 {
    nodeport::dsr_to_snat(&Tc::<false>(ctx))
}

/// Traffic leaving on a node device: replies of backends on this node get
/// the frontend as their source again.
#[classifier]
pub fn nodeport_egress(ctx: TcContext) -> i32 {
    nodeport::egress(&Tc::<false>(ctx))
}

/// The pods' own traffic, on the host side of a pod-facing device (packets
/// leaving the pod arrive here): a packet to any frontend a pod reaches
/// gets a backend and its destination rewritten, per packet (`pod.rs`).
#[classifier]
pub fn pod_ingress(ctx: TcContext) -> i32 {
    nodeport::ingress(&Tc::<true>(ctx))
}

/// Packets entering a pod through its pod-facing device: the replies of
/// its translated flows get the frontend as their source again.
#[classifier]
pub fn pod_egress(ctx: TcContext) -> i32 {
    nodeport::egress(&Tc::<true>(ctx))
}

/// `--nodeport-acceleration`: the ingress translation of traffic from
/// outside in XDP, in front of `nodeport_ingress` (which gets what it
/// passes up).
#[xdp]
#[expect(clippy::needless_pass_by_value, reason = "aya\'s program macros hand the context by value")]
pub fn nodeport_xdp(ctx: XdpContext) -> u32 {
    xdp::ingress(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
