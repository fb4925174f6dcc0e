//! Socket-address hooks: translate a service address into a backend once
//! per socket (at connect, or at each unconnected UDP send), and show the
//! service address again where the socket reads its peer (recvmsg,
//! getpeername).
use aya_ebpf::programs::SockAddrContext;
use aya_log_ebpf::debug;
use proxy_common::{
    AffinityKey, AffinityValue, BackendV4, ServiceKeyV4, ServiceValue, SockBackendKeyV4, SockRevNatKeyV4, SockRevNatV4,
    proto, service_flags,
};

use crate::{
    access::{SockAddr, netns_cookie, now_ns, random_u32, set_syscall_error, socket_cookie},
    log_enabled,
    maps::{
        affinity_v4, backend_v4, remember_affinity_v4, remember_sock_backend_v4, remember_sock_revnat_v4, service_v4,
        sock_backend_v4, sock_revnat_v4,
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
pub fn translate4(ctx: &SockAddrContext, hook: Hook) -> i32 {
    let sa = SockAddr::new(ctx);
    let Ok(protocol) = u8::try_from(sa.protocol()) else {
        return ALLOW;
    };
    if protocol != proto::TCP && protocol != proto::UDP {
        return ALLOW;
    }
    let (addr, port) = (sa.user_ip4(), sa.user_port());
    let mut key = ServiceKeyV4::new(addr, port, protocol, 0);
    let Some(frontend) = service_v4(&key) else {
        return ALLOW;
    };
    if frontend.count == 0 {
        // A service without endpoints: refuse, as kube-proxy's REJECT rule does.
        if log_enabled() {
            debug!(ctx, "{:i}:{} refused: no backends", u32::from_be(addr), u16::from_be(port));
        }
        set_syscall_error(ECONNREFUSED);
        return REJECT;
    }
    let cookie = socket_cookie(ctx);
    let sticky = SockBackendKeyV4 { cookie, addr, port, proto: protocol, pad: 0 };
    let Some((backend_id, backend)) = choose_backend(ctx, hook, &mut key, &frontend, &sticky) else {
        return ALLOW;
    };
    if hook == Hook::Sendmsg {
        remember_sock_backend_v4(&sticky, backend_id);
    }
    let revnat_key = SockRevNatKeyV4 { cookie, addr: backend.addr, port: backend.port, pad: 0 };
    remember_sock_revnat_v4(&revnat_key, &SockRevNatV4 { addr, port, rev_nat: frontend.rev_nat });
    if log_enabled() {
        debug!(
            ctx,
            "{:i}:{} -> {:i}:{}",
            u32::from_be(addr),
            u16::from_be(port),
            u32::from_be(backend.addr),
            u16::from_be(backend.port)
        );
    }
    sa.set_user_ip4(backend.addr);
    sa.set_user_port(backend.port);
    ALLOW
}

/// The backend for this socket: the one an unconnected UDP socket already
/// uses, else the client's affine one, else a random slot. A remembered
/// backend that is gone (the agent purges such memos right after a sync,
/// this covers the moment between) is passed over.
#[inline(always)]
fn choose_backend(
    ctx: &SockAddrContext,
    hook: Hook,
    key: &mut ServiceKeyV4,
    frontend: &ServiceValue,
    sticky: &SockBackendKeyV4,
) -> Option<(u32, BackendV4)> {
    if hook == Hook::Sendmsg
        && let Some(id) = sock_backend_v4(sticky)
        && let Some(backend) = backend_v4(id)
    {
        return Some((id, backend));
    }
    let affinity = frontend.flags & service_flags::AFFINITY != 0;
    let affinity_key = AffinityKey { client: netns_cookie(ctx), rev_nat: frontend.rev_nat, pad: [0; 3] };
    let now = now_ns();
    if affinity
        && let Some(entry) = affinity_v4(&affinity_key)
        && now.saturating_sub(entry.last_used_ns) < u64::from(frontend.affinity_timeout) * 1_000_000_000
        && let Some(backend) = backend_v4(entry.backend_id)
    {
        remember_affinity_v4(&affinity_key, &AffinityValue { last_used_ns: now, ..entry });
        return Some((entry.backend_id, backend));
    }
    #[expect(clippy::cast_possible_truncation, reason = "the remainder is below count, a u16")]
    let slot = (random_u32() % u32::from(frontend.count)) as u16;
    key.slot = slot + 1;
    // Slots 1..=count are written before slot 0 announces count, so this
    // misses only if the agent broke that order; then leave the destination
    // alone (it has no route and fails on its own).
    let id = service_v4(key)?.backend_id;
    let backend = backend_v4(id)?;
    if affinity {
        remember_affinity_v4(&affinity_key, &AffinityValue { backend_id: id, pad: 0, last_used_ns: now });
    }
    Some((id, backend))
}

/// Shows the service address where the socket sees its peer: the source of
/// a received datagram, or `getpeername()`.
#[inline(always)]
pub fn restore4(ctx: &SockAddrContext) -> i32 {
    let sa = SockAddr::new(ctx);
    let key = SockRevNatKeyV4 { cookie: socket_cookie(ctx), addr: sa.user_ip4(), port: sa.user_port(), pad: 0 };
    if let Some(service) = sock_revnat_v4(&key) {
        sa.set_user_ip4(service.addr);
        sa.set_user_port(service.port);
    }
    ALLOW
}
