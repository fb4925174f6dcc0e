//! Thin wrappers around the raw context and helpers: the only `unsafe` code.
use aya_ebpf::{
    EbpfContext as _,
    helpers::generated::{
        bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_ktime_get_ns, bpf_set_retval,
    },
    programs::SockAddrContext,
};
use proxy_common::{Addr, as_v4, mapped_v4};

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
            Family::V6 => {
                let mut addr = [0u8; 16];
                for (i, word) in sa.user_ip6.iter().enumerate() {
                    addr[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
                }
                addr
            }
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
                for i in 0..4 {
                    sa.user_ip6[i] =
                        u32::from_ne_bytes([addr[i * 4], addr[i * 4 + 1], addr[i * 4 + 2], addr[i * 4 + 3]]);
                }
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

/// The cookie of the socket's network namespace: the client identity for
/// session affinity (one pod, one namespace).
#[inline(always)]
pub fn netns_cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: valid for sock_addr programs (5.7+).
    unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }
}

/// Monotonic time in nanoseconds.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: takes no arguments and cannot fail.
    unsafe { bpf_ktime_get_ns() }
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
