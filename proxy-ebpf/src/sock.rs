//! Socket-address hooks: translate a service address into a backend once,
//! when the socket connects.
use aya_ebpf::programs::SockAddrContext;
use aya_log_ebpf::debug;
use proxy_common::{ServiceKeyV4, proto};

use crate::{
    access::{SockAddr, random_u32, set_syscall_error},
    log_enabled,
    maps::{backend_v4, service_v4},
};

/// Let the syscall go on.
const ALLOW: i32 = 1;
/// Fail the syscall (with the error set by `set_syscall_error`).
const REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;

#[inline(always)]
pub fn connect4(ctx: &SockAddrContext) -> i32 {
    let sa = SockAddr::new(ctx);
    let Ok(protocol) = u8::try_from(sa.protocol()) else {
        return ALLOW;
    };
    if protocol != proto::TCP && protocol != proto::UDP {
        return ALLOW;
    }
    let mut key = ServiceKeyV4::new(sa.user_ip4(), sa.user_port(), protocol, 0);
    let Some(frontend) = service_v4(&key) else {
        return ALLOW;
    };
    if frontend.count == 0 {
        // A service without endpoints: refuse, as kube-proxy's REJECT rule does.
        if log_enabled() {
            debug!(ctx, "connect4 {:i}:{} refused: no backends", u32::from_be(key.addr), u16::from_be(key.port));
        }
        set_syscall_error(ECONNREFUSED);
        return REJECT;
    }
    #[expect(clippy::cast_possible_truncation, reason = "the remainder is below count, a u16")]
    let slot = (random_u32() % u32::from(frontend.count)) as u16;
    key.slot = slot + 1;
    // Slots 1..=count are written before slot 0 announces count, so these
    // lookups miss only if the agent broke that order; then leave the
    // destination alone (it has no route and fails on its own).
    let Some(entry) = service_v4(&key) else {
        return ALLOW;
    };
    let Some(backend) = backend_v4(entry.backend_id) else {
        return ALLOW;
    };
    if log_enabled() {
        debug!(
            ctx,
            "connect4 {:i}:{} -> {:i}:{} (slot {})",
            u32::from_be(key.addr),
            u16::from_be(key.port),
            u32::from_be(backend.addr),
            u16::from_be(backend.port),
            key.slot
        );
    }
    sa.set_user_ip4(backend.addr);
    sa.set_user_port(backend.port);
    ALLOW
}
