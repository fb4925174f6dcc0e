//! Which network namespaces a client address lives in, for `ebpf-proxy
//! explain --from`: the socket programs know a client by its network
//! namespace's cookie (`AFFINITY`), an operator by its IP. Every namespace
//! on the machine (those of running processes, `/proc/*/ns/net`, and the
//! named ones, `/run/netns`) is entered in turn, and those with the address
//! on an interface give their cookie.
use std::{
    collections::HashSet,
    io,
    net::IpAddr,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::PathBuf,
};

use crate::datapath::sock_destroy::in_namespace;

/// Directories of named network namespaces (`ip netns`).
const NAMED_NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];

/// A network namespace that holds the client's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClientNetns {
    /// A file that names it (`/proc/PID/ns/net` or `/run/netns/NAME`).
    pub(crate) path: PathBuf,
    /// Its cookie (`SO_NETNS_COOKIE`), the client's key in `AFFINITY`.
    pub(crate) cookie: u64,
}

/// The namespaces with `ip` on one of their interfaces (pods never share an
/// address, but test namespaces and hosts with private networks may).
#[must_use]
pub(crate) fn holding(ip: IpAddr) -> Vec<ClientNetns> {
    candidates()
        .into_iter()
        .filter_map(|path| {
            let cookie = in_namespace(&path, || if has_address(ip)? { netns_cookie().map(Some) } else { Ok(None) });
            Some(ClientNetns { cookie: cookie.ok()??, path })
        })
        .collect()
}

/// One file per distinct network namespace.
fn candidates() -> Vec<PathBuf> {
    let processes = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .map(|e| e.path().join("ns/net"));
    let named = NAMED_NETNS_DIRS.iter().flat_map(|d| std::fs::read_dir(d).into_iter().flatten().filter_map(Result::ok));
    let mut seen = HashSet::new();
    named
        .map(|e| e.path())
        .chain(processes)
        .filter(|path| std::fs::metadata(path).is_ok_and(|m| seen.insert((m.dev(), m.ino()))))
        .collect()
}

/// Whether an interface of the current thread's namespace has `ip`.
fn has_address(ip: IpAddr) -> io::Result<bool> {
    Ok(crate::node::local_addrs::try_read().map_err(io::Error::from)?.iter().any(|a| a.ip == ip))
}

/// The cookie of the current thread's network namespace.
fn netns_cookie() -> io::Result<u64> {
    // Unbound: a namespace whose loopback is down has no address to bind.
    let socket = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    let mut cookie: u64 = 0;
    let mut len = libc::socklen_t::try_from(size_of::<u64>()).expect("8 bytes");
    // SAFETY: `cookie` and `len` are valid for writes of the sizes given;
    // the fd is open for the call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc == 0 { Ok(cookie) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback is in every namespace: this process's is among those that
    /// hold it, with the cookie its own sockets get.
    #[test]
    fn the_own_namespace_holds_loopback() {
        let Ok(own_cookie) = netns_cookie() else { return }; // a kernel before 5.14
        let found = holding("127.0.0.1".parse().unwrap());
        if nix::unistd::geteuid().is_root() {
            assert!(found.iter().any(|n| n.cookie == own_cookie), "{found:?}");
        }
        assert!(holding("192.0.2.250".parse().unwrap()).iter().all(|n| n.cookie != own_cookie));
    }
}
