//! The node's local addresses (every device's, in this network namespace),
//! read with getifaddrs and followed through a netlink socket subscribed
//! to the kernel's address notifications (`RTNLGRP_IPV4_IFADDR`,
//! `RTNLGRP_IPV6_IFADDR`): a notification only says "read again", so no
//! netlink message is parsed.
use std::{
    net::IpAddr,
    os::fd::{AsRawFd as _, OwnedFd},
    time::Duration,
};

use nix::{
    errno::Errno,
    ifaddrs::getifaddrs,
    sys::socket::{
        AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, SockaddrLike as _, bind, recv, socket,
    },
};
use tokio::io::unix::AsyncFd;
use tracing::warn;

/// A local address and the device holding it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LocalAddr {
    pub(crate) device: String,
    pub(crate) ip: IpAddr,
}

/// Every address of every device in this network namespace (empty when
/// they cannot be read).
#[must_use]
pub(crate) fn read() -> Vec<LocalAddr> {
    try_read().unwrap_or_default()
}

/// Every address of every device in this network namespace.
///
/// # Errors
/// When getifaddrs fails (out of descriptors or memory).
pub(crate) fn try_read() -> nix::Result<Vec<LocalAddr>> {
    let addrs = getifaddrs()?;
    let mut out: Vec<LocalAddr> = addrs
        .filter_map(|a| {
            let addr = a.address?;
            let ip = match addr.family()? {
                AddressFamily::Inet => IpAddr::V4(addr.as_sockaddr_in()?.ip()),
                AddressFamily::Inet6 => IpAddr::V6(addr.as_sockaddr_in6()?.ip()),
                _ => return None,
            };
            Some(LocalAddr { device: a.interface_name, ip })
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// The addresses alone, sorted.
#[must_use]
pub(crate) fn ips(addrs: &[LocalAddr]) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = addrs.iter().map(|a| a.ip).collect();
    ips.sort_unstable();
    ips.dedup();
    ips
}

/// How often the addresses are read again when the netlink subscription
/// cannot be made (a kernel or sandbox without it).
pub(crate) const POLL_PERIOD: Duration = Duration::from_secs(5);

/// Notifications arriving this soon after one are read as one change (an
/// address added with its routes, a device going down with all its
/// addresses).
const SETTLE: Duration = Duration::from_millis(50);

/// Follows the local addresses: `changed` resolves with them when they
/// differ from the last ones it returned (or read at the start).
pub(crate) struct Watch {
    socket: Option<AsyncFd<OwnedFd>>,
    last: Vec<LocalAddr>,
    /// A notification was taken and the addresses not read since: when
    /// to read them (kept across a `changed` dropped half-way, as
    /// `select!` drops it, so a busy loop does not put the read off).
    pending: Option<tokio::time::Instant>,
    /// Without a subscription: when the addresses are read next.
    next_poll: tokio::time::Instant,
}

impl Watch {
    /// Subscribes, then reads the addresses (so no change between the two
    /// is missed). Without a subscription, `changed` re-reads every
    /// `POLL_PERIOD`.
    #[must_use]
    pub(crate) fn start() -> Self {
        let groups = (libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
        let socket = subscribe(groups)
            .inspect_err(|err| {
                warn!(%err, period_s = POLL_PERIOD.as_secs(), "cannot subscribe to address changes (netlink); reading the node's addresses periodically instead");
            })
            .ok();
        Self { socket, last: read(), pending: None, next_poll: tokio::time::Instant::now() + POLL_PERIOD }
    }

    /// The addresses as last returned (or read at the start).
    #[must_use]
    pub(crate) fn current(&self) -> &[LocalAddr] {
        &self.last
    }

    /// Resolves with the addresses once they changed. Cancel-safe: a call
    /// dropped before it resolves loses no change.
    pub(crate) async fn changed(&mut self) -> Vec<LocalAddr> {
        loop {
            let read_at = if let Some(at) = self.pending {
                at
            } else {
                if let Some(socket) = &self.socket {
                    if let Err(err) = wait_and_drain(socket).await {
                        warn!(%err, period_s = POLL_PERIOD.as_secs(), "address change notifications failed; reading the node's addresses periodically instead");
                        self.socket = None;
                    }
                } else {
                    tokio::time::sleep_until(self.next_poll).await;
                    self.next_poll = tokio::time::Instant::now() + POLL_PERIOD;
                }
                *self.pending.insert(tokio::time::Instant::now() + SETTLE)
            };
            tokio::time::sleep_until(read_at).await;
            if let Some(socket) = &self.socket {
                let _ = drain(socket);
            }
            self.pending = None;
            match try_read() {
                Ok(now) if now != self.last => {
                    self.last.clone_from(&now);
                    return now;
                }
                Ok(_) => {}
                // Not "no addresses": the last ones stay, and the next
                // poll (or notification) reads again.
                Err(err) => {
                    warn!(%err, "cannot read the node's addresses; keeping the last ones");
                    self.pending = Some(tokio::time::Instant::now() + POLL_PERIOD);
                }
            }
        }
    }
}

/// A netlink route socket in the notification `groups` (`RTMGRP_*`),
/// read by `wait_and_drain` (also `crate::node::pod_devices`' link watch).
pub(crate) fn subscribe(groups: u32) -> std::io::Result<AsyncFd<OwnedFd>> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
    // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open
    // and the same for as long as it is registered.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.map_err(std::io::Error::from)
}

/// Waits for a notification, then reads every one queued.
pub(crate) async fn wait_and_drain(socket: &AsyncFd<OwnedFd>) -> std::io::Result<()> {
    loop {
        let mut guard = socket.readable().await?;
        match drain(socket) {
            Ok(0) => guard.clear_ready(),
            Ok(_) => return Ok(()),
            Err(err) => return Err(err),
        }
    }
}

/// Reads the queued notifications: how many. A queue that overflowed
/// (`ENOBUFS`: notifications were lost) counts as one: the addresses are
/// read again anyway.
pub(crate) fn drain(socket: &AsyncFd<OwnedFd>) -> std::io::Result<usize> {
    let mut buf = [0u8; 8192];
    let mut n = 0;
    loop {
        match recv(socket.get_ref().as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Err(Errno::EAGAIN) => return Ok(n),
            Ok(_) | Err(Errno::ENOBUFS | Errno::EINTR) => n += 1,
            Err(err) => return Err(err.into()),
        }
    }
}
