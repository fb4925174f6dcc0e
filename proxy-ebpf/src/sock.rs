//! Socket-address hooks: translate a service address into a backend once
//! per socket (at connect, or at each unconnected UDP send), and show the
//! service address again where the socket reads its peer (recvmsg,
//! getpeername). One code path for both families: addresses are 16 bytes,
//! IPv4 as IPv4-mapped IPv6, so an IPv6 socket dialling `::ffff:a.b.c.d`
//! finds the IPv4 service too.
use aya_ebpf::programs::{SockAddrContext, SockContext};
use aya_log_ebpf::debug;
use proxy_common::{
    Addr, AffinityKey, AffinityValue, Backend, ServiceKey, ServiceValue, SockBackendKey, SockRevNat, SockRevNatKey,
    as_v4, proto, service_flags,
};

use crate::{
    SOCKET_LB_NETNS,
    access::{Family, SockAddr, netns_cookie, now_ns, set_syscall_error, sock_cookie, socket_cookie},
    log_enabled,
    maps::{
        affinity, backend, count_connection, count_socket, remember_affinity, remember_sock_backend,
        remember_sock_revnat, service, sock_backend, sock_revnat, uncount_socket,
    },
};

/// Let the syscall go on.
const ALLOW: i32 = 1;
/// Fail the syscall (with the error set by `set_syscall_error`).
const REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;

/// Which hook a translation runs in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `connect()`: TCP, and UDP sockets that connect.
    Connect,
    /// `sendmsg()` on an unconnected UDP socket: every datagram passes here,
    /// so the socket's backend is remembered and reused.
    Sendmsg,
}

/// Translates the destination of a connect or an unconnected send.
#[inline(always)]
pub fn translate(ctx: &SockAddrContext, hook: Hook, family: Family) -> i32 {
    if outside_socket_lb(ctx) {
        // `--socket-lb host-namespace`: a pod's socket keeps the service
        // address; its packets are translated on the pod-facing device.
        return ALLOW;
    }
    let sa = SockAddr::new(ctx);
    let Ok(protocol) = u8::try_from(sa.protocol()) else {
        return ALLOW;
    };
    if protocol != proto::TCP && protocol != proto::UDP {
        return ALLOW;
    }
    let (addr, port) = (sa.addr(family), sa.user_port());
    let mut key = ServiceKey::new(addr, port, protocol, 0);
    let Some(frontend) = service(&key) else {
        return ALLOW;
    };
    if frontend.flags & service_flags::EXTERNAL_ONLY != 0 {
        // An externalIP that is not this node's: only traffic arriving from
        // outside is translated, local clients reach the real address.
        return ALLOW;
    }
    if frontend.count == 0 {
        // A service without endpoints: refuse, as kube-proxy's REJECT rule does.
        if log_enabled() {
            debug!(ctx, "[{:i}]:{} refused: no backends", addr.0, u16::from_be(port));
        }
        set_syscall_error(ECONNREFUSED);
        return REJECT;
    }
    let cookie = socket_cookie(ctx);
    let sticky = SockBackendKey { cookie, addr, port, proto: protocol, pad: [0; 5] };
    let Some((backend_id, target, reused)) = choose_backend(ctx, hook, &mut key, &frontend, &sticky) else {
        return ALLOW;
    };
    if !sa.set_addr(family, &target.addr) {
        return ALLOW; // an IPv4 socket cannot reach an IPv6 backend
    }
    sa.set_user_port(target.port);
    if !reused {
        // A new connection, or the first datagram of an unconnected socket.
        count_connection(frontend.rev_nat);
        count_socket(cookie, backend_id, &target);
    }
    if hook == Hook::Sendmsg {
        remember_sock_backend(&sticky, backend_id);
    }
    let revnat_key = SockRevNatKey { cookie, addr: target.addr, port: target.port, pad: [0; 6] };
    remember_sock_revnat(&revnat_key, &SockRevNat { addr, port, pad: 0, rev_nat: frontend.rev_nat });
    if log_enabled() {
        log_translation(ctx, &addr, port, &target.addr, target.port);
    }
    ALLOW
}

/// Whether the socket is outside what the socket programs translate
/// (`--socket-lb host-namespace`: sockets of other network namespaces).
/// Out of line: `translate`'s frame is near the verifier's stack bound.
#[inline(never)]
fn outside_socket_lb(ctx: &SockAddrContext) -> bool {
    let only_netns = SOCKET_LB_NETNS.load();
    only_netns != 0 && netns_cookie(ctx) != only_netns
}

/// Logs `SERVICE -> BACKEND`, IPv4 as IPv4 (not as IPv4-mapped IPv6).
#[inline(never)]
fn log_translation(ctx: &SockAddrContext, from: &Addr, from_port: u16, to: &Addr, to_port: u16) {
    let (from_port, to_port) = (u16::from_be(from_port), u16::from_be(to_port));
    if let (Some(a), Some(b)) = (as_v4(from), as_v4(to)) {
        debug!(ctx, "{:i}:{} -> {:i}:{}", u32::from_be_bytes(a), from_port, u32::from_be_bytes(b), to_port);
    } else {
        debug!(ctx, "[{:i}]:{} -> [{:i}]:{}", from.0, from_port, to.0, to_port);
    }
}

/// The backend for this socket: the one an unconnected UDP socket already
/// uses, else the client's affine one, else one picked by the frontend's
/// algorithm (`balance::choose`: a random slot, or the less loaded of
/// two). A remembered
/// backend that is gone (the agent purges such memos right after a sync,
/// this covers the moment between) is passed over. The flag tells whether
/// the socket's remembered backend was reused.
#[inline(always)]
fn choose_backend(
    ctx: &SockAddrContext,
    hook: Hook,
    key: &mut ServiceKey,
    frontend: &ServiceValue,
    sticky: &SockBackendKey,
) -> Option<(u32, Backend, bool)> {
    if hook == Hook::Sendmsg
        && let Some(id) = sock_backend(sticky)
        && let Some(b) = backend(id)
    {
        return Some((id, b, true));
    }
    if frontend.flags & service_flags::AFFINITY == 0 {
        let id = random_slot(key, frontend)?;
        return Some((id, backend(id)?, false));
    }
    // Only sessionAffinity pays for the client's identity and the clock.
    let affinity_key = AffinityKey { client: netns_cookie(ctx), rev_nat: frontend.rev_nat, pad: 0 };
    let now = now_ns();
    if let Some(entry) = affinity(&affinity_key)
        && now.saturating_sub(entry.last_used_ns) < u64::from(frontend.affinity_timeout()) * 1_000_000_000
        && let Some(b) = backend(entry.backend_id)
    {
        remember_affinity(&affinity_key, &AffinityValue { last_used_ns: now, ..entry });
        return Some((entry.backend_id, b, false));
    }
    let id = random_slot(key, frontend)?;
    let b = backend(id)?;
    remember_affinity(&affinity_key, &AffinityValue { backend_id: id, pad: 0, last_used_ns: now });
    Some((id, b, false))
}

/// The backend id for a new connection: by the frontend's algorithm
/// (`balance::choose`).
#[inline(always)]
fn random_slot(key: &mut ServiceKey, frontend: &ServiceValue) -> Option<u32> {
    // A miss (the agent broke the write order) leaves the destination
    // alone: it has no route and fails on its own.
    crate::balance::choose(key, frontend)
}

/// A socket is released (closed, or its process killed): the active
/// connection it counted, if any, is taken back (`cgroup/sock_release`
/// runs for every socket of the cgroup, whatever ends it).
#[inline(always)]
pub fn release(ctx: &SockContext) {
    uncount_socket(sock_cookie(ctx));
}

/// Shows the service address where the socket sees its peer: the source of
/// a received datagram, or `getpeername()`.
#[inline(always)]
pub fn restore(ctx: &SockAddrContext, family: Family) -> i32 {
    let sa = SockAddr::new(ctx);
    let key = SockRevNatKey { cookie: socket_cookie(ctx), addr: sa.addr(family), port: sa.user_port(), pad: [0; 6] };
    if let Some(svc) = sock_revnat(&key)
        && sa.set_addr(family, &svc.addr)
    {
        sa.set_user_port(svc.port);
    }
    ALLOW
}
