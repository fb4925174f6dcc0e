//! Destroys sockets still connected, through a service, to a backend that
//! left it, so their owners see an error at once and reconnect (through
//! connect4, to a live backend) instead of sending into the void: the
//! classic case is a resolver's long-lived connected UDP socket. (The agent
//! asks this for UDP only: TCP connections to a terminating backend may
//! still be draining.)
//!
//! Sockets are found with a netlink `SOCK_DIAG_BY_FAMILY` dump and
//! destroyed with `SOCK_DESTROY` (kernel option INET_DIAG_DESTROY), for
//! both address families. Only sockets the programs translated are
//! touched: their cookie and backend must be in `SOCK_REVNAT`, and the service it names must have lost
//! that backend. The host namespace is searched, and each namespace named
//! by `--socket-netns` (pods' sockets live there).
use std::{
    collections::HashSet,
    fs::File,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use nix::sched::{CloneFlags, setns};
use tracing::{debug, info, warn};

use crate::model::{FrontendKey, Protocol};

/// One socket found by the dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SocketId {
    pub(crate) protocol: Protocol,
    /// `AF_INET` or `AF_INET6`.
    family: u8,
    pub(crate) src: IpAddr,
    pub(crate) sport: u16,
    pub(crate) dst: IpAddr,
    pub(crate) dport: u16,
    pub(crate) ifindex: u32,
    pub(crate) cookie: u64,
    /// The raw `inet_diag_sockid`, echoed back to destroy exactly this one.
    raw_id: [u8; 48],
}

/// A backend that left a frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Removed {
    pub(crate) frontend: FrontendKey,
    pub(crate) backend: (IpAddr, u16),
}

pub(crate) struct SocketDestroyer {
    namespaces: Vec<PathBuf>,
    /// Set when the kernel lacks INET_DIAG_DESTROY (said once in the log).
    unsupported: bool,
}

impl SocketDestroyer {
    /// `namespaces`: network namespace files, or directories of them (like
    /// `/var/run/netns`), searched besides the agent's own namespace.
    #[must_use]
    pub(crate) fn new(namespaces: Vec<PathBuf>) -> Self {
        Self { namespaces, unsupported: false }
    }

    /// Destroys the sockets of `removed` pairs; `service_of(cookie, backend)`
    /// says which frontend a translated socket asked for. Returns how many.
    pub(crate) fn destroy(
        &mut self,
        removed: &HashSet<Removed>,
        service_of: &(dyn Fn(u64, IpAddr, u16, Protocol) -> Option<FrontendKey> + Sync),
    ) -> usize {
        if self.unsupported || removed.is_empty() {
            return 0;
        }
        let protocols: HashSet<Protocol> = removed.iter().map(|r| r.frontend.protocol).collect();
        let backends: HashSet<(IpAddr, u16, Protocol)> =
            removed.iter().map(|r| (r.backend.0, r.backend.1, r.frontend.protocol)).collect();
        let pick = |s: &SocketId| {
            backends.contains(&(s.dst, s.dport, s.protocol))
                && service_of(s.cookie, s.dst, s.dport, s.protocol)
                    .is_some_and(|frontend| removed.contains(&Removed { frontend, backend: (s.dst, s.dport) }))
        };
        let mut total = 0;
        let mut places: Vec<Option<PathBuf>> = vec![None];
        places.extend(self.namespace_files().into_iter().map(Some));
        for place in places {
            let result = match &place {
                None => destroy_here(&protocols, &pick),
                Some(ns) => in_namespace(ns, || destroy_here(&protocols, &pick)),
            };
            match result {
                Ok(n) => total += n,
                Err(err) if err.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    warn!(
                        "the kernel cannot destroy sockets (INET_DIAG_DESTROY is off): sockets connected to removed backends stay until their owners give up"
                    );
                    self.unsupported = true;
                    return total;
                }
                Err(err) => warn!(namespace = ?place, %err, "cannot destroy sockets of removed backends here"),
            }
        }
        if total > 0 {
            info!(sockets = total, "destroyed sockets connected to removed backends");
        }
        total
    }

    fn namespace_files(&self) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for path in &self.namespaces {
            if path.is_dir() {
                match std::fs::read_dir(path) {
                    Ok(entries) => files.extend(entries.filter_map(Result::ok).map(|e| e.path())),
                    Err(err) => debug!(path = %path.display(), %err, "cannot list namespaces"),
                }
            } else {
                files.push(path.clone());
            }
        }
        files
    }
}

/// Runs `f` on a thread inside the network namespace at `path`.
pub(crate) fn in_namespace<T: Send>(path: &Path, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let ns = File::open(path)?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                setns(&ns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                f()
            })
            .join()
            .map_err(|_| io::Error::other("namespace thread panicked"))?
    })
}

fn destroy_here(protocols: &HashSet<Protocol>, pick: &(dyn Fn(&SocketId) -> bool + Sync)) -> io::Result<usize> {
    let nl = diag::SockDiag::open()?;
    let mut n = 0;
    let families = [u8::try_from(libc::AF_INET).expect("2"), u8::try_from(libc::AF_INET6).expect("10")];
    for protocol in protocols {
        let mut sockets = Vec::new();
        for family in families {
            sockets.extend(nl.dump(family, *protocol)?);
        }
        for socket in sockets.into_iter().filter(|s| pick(s)) {
            match nl.destroy(&socket) {
                Ok(()) => {
                    debug!(?socket, "destroyed");
                    n += 1;
                }
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {} // closed meanwhile
                Err(err) => return Err(err),
            }
        }
    }
    Ok(n)
}

/// `NETLINK_SOCK_DIAG` messages, laid out as in linux/sock_diag.h and
/// linux/inet_diag.h, over the agent's netlink socket (`super::super::netlink`).
mod diag {
    use super::{IpAddr, Ipv4Addr, Ipv6Addr, Protocol, SocketId, io};
    use crate::datapath::netlink::{
        self as nl, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, Netlink,
    };

    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const SOCK_DESTROY: u16 = 21;
    /// `struct inet_diag_sockid`.
    const SOCKID_LEN: usize = 48;
    /// `struct inet_diag_msg` up to and including `id`: family, state,
    /// timer, retrans, then the sockid.
    const MSG_ID_OFFSET: usize = 4;

    pub(crate) struct SockDiag {
        socket: Netlink,
    }

    impl SockDiag {
        pub(crate) fn open() -> io::Result<Self> {
            Ok(Self { socket: Netlink::open(libc::NETLINK_SOCK_DIAG)? })
        }

        /// Every socket of `family` and `protocol` in this namespace.
        pub(crate) fn dump(&self, family: u8, protocol: Protocol) -> io::Result<Vec<SocketId>> {
            self.send(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, family, protocol, &[0; SOCKID_LEN])?;
            let mut sockets = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = self.socket.recv(&mut buf)?;
                for message in nl::messages(&buf[..n]) {
                    let (kind, body) = message.map_err(|()| io::Error::other("malformed netlink message"))?;
                    match kind {
                        NLMSG_DONE => return Ok(sockets),
                        NLMSG_ERROR => return Err(error_of(body)),
                        SOCK_DIAG_BY_FAMILY if body.len() >= MSG_ID_OFFSET + SOCKID_LEN => {
                            let raw: [u8; SOCKID_LEN] =
                                body[MSG_ID_OFFSET..MSG_ID_OFFSET + SOCKID_LEN].try_into().expect("48 bytes");
                            sockets.push(parse_id(family, protocol, raw));
                        }
                        _ => {}
                    }
                }
            }
        }

        /// Destroys one socket (the kernel aborts it with ECONNABORTED).
        pub(crate) fn destroy(&self, socket: &SocketId) -> io::Result<()> {
            self.send(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, socket.family, socket.protocol, &socket.raw_id)?;
            let mut buf = [0u8; 1024];
            let n = self.socket.recv(&mut buf)?;
            match nl::messages(&buf[..n]).next() {
                Some(Ok((NLMSG_ERROR, body))) if nl::error_code(body) != 0 => Err(error_of(body)),
                _ => Ok(()),
            }
        }

        /// Sends `nlmsghdr` + `inet_diag_req_v2`.
        fn send(&self, kind: u16, flags: u16, family: u8, protocol: Protocol, id: &[u8; SOCKID_LEN]) -> io::Result<()> {
            let mut req = Vec::with_capacity(8 + SOCKID_LEN);
            // sdiag_family, sdiag_protocol, idiag_ext, pad, idiag_states (all)
            req.extend_from_slice(&[family, protocol.number(), 0, 0]);
            req.extend_from_slice(&u32::MAX.to_ne_bytes());
            req.extend_from_slice(id);
            self.socket.send(kind, flags, &req)
        }
    }

    /// `struct nlmsgerr`: a negative errno (0 for an ack) first.
    fn error_of(body: &[u8]) -> io::Error {
        io::Error::from_raw_os_error(-nl::error_code(body))
    }

    /// `inet_diag_sockid`: sport, dport (big endian), src[4], dst[4] (the
    /// first word for IPv4), if, cookie[2].
    fn parse_id(family: u8, protocol: Protocol, raw: [u8; SOCKID_LEN]) -> SocketId {
        let u32_at = |i: usize| u32::from_ne_bytes(raw[i..i + 4].try_into().expect("4 bytes"));
        let ip_at = |i: usize| -> IpAddr {
            if i32::from(family) == libc::AF_INET6 {
                let octets: [u8; 16] = raw[i..i + 16].try_into().expect("16 bytes");
                Ipv6Addr::from(octets).to_canonical()
            } else {
                Ipv4Addr::new(raw[i], raw[i + 1], raw[i + 2], raw[i + 3]).into()
            }
        };
        SocketId {
            protocol,
            family,
            sport: u16::from_be_bytes([raw[0], raw[1]]),
            dport: u16::from_be_bytes([raw[2], raw[3]]),
            src: ip_at(4),
            dst: ip_at(20),
            ifindex: u32_at(36),
            cookie: u64::from(u32_at(40)) | (u64::from(u32_at(44)) << 32),
            raw_id: raw,
        }
    }
}
