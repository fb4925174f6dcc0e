//! The devices the pods' own traffic passes on this node, where the
//! per-packet programs attach (`proxy-ebpf/src/pod.rs`): those named by
//! `--pod-devices`, or by default (`auto`) every veth (the host side of a
//! pod's interface, a bridge's port) and every bridge (holding pod routes,
//! or a VM's tap) that is not a device traffic from outside arrives on.
//! Pods come and go, so the choice is made again whenever a link or an
//! address changes (`Watch`, a netlink subscription to those groups), not
//! at every sync.
use std::{io, os::fd::OwnedFd, time::Duration};

use tokio::io::unix::AsyncFd;
use tracing::warn;

use crate::{
    datapath::netlink::{self, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, Netlink},
    node::local_addrs,
};

/// Which devices face pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PodDeviceSelection {
    /// Every veth and bridge that is not an external device.
    Auto,
    /// These (empty: none, the pods' traffic is translated only at their
    /// sockets).
    Named(Vec<String>),
}

impl PodDeviceSelection {
    /// From `--pod-devices` (or the config file): nothing given, or the
    /// word `auto`, is `Auto`; the word `none` is an empty list.
    #[must_use]
    pub(crate) fn from_names(names: Vec<String>) -> Self {
        match names.as_slice() {
            [] => Self::Auto,
            [only] if only == "auto" => Self::Auto,
            [only] if only == "none" => Self::Named(Vec::new()),
            _ => Self::Named(names),
        }
    }
}

/// A device of this network namespace and its kind (`IFLA_INFO_KIND`:
/// "veth", "bridge", ...; empty for a physical device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) name: String,
    pub(crate) kind: String,
}

/// The devices of `selection` among `links`, sorted; `external`: the
/// devices the outside path serves, never also pod-facing in `Auto`.
#[must_use]
pub(crate) fn resolve(selection: &PodDeviceSelection, links: &[Link], external: &[String]) -> Vec<String> {
    let mut chosen: Vec<String> = match selection {
        PodDeviceSelection::Auto => links
            .iter()
            .filter(|l| (l.kind == "veth" || l.kind == "bridge") && !external.contains(&l.name))
            .map(|l| l.name.clone())
            .collect(),
        PodDeviceSelection::Named(names) => {
            names.iter().filter(|n| links.iter().any(|l| &l.name == *n)).cloned().collect()
        }
    };
    chosen.sort();
    chosen.dedup();
    chosen
}

/// `RTM_NEWLINK`, `RTM_GETLINK` (linux/rtnetlink.h).
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
/// `struct ifinfomsg`.
const IFINFOMSG_LEN: usize = 16;
/// Link attributes (linux/if_link.h).
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
/// The attribute type's flag bits (`NLA_F_NESTED`, `NLA_F_NET_BYTEORDER`).
const NLA_TYPE_MASK: u16 = 0x3fff;

/// Every device of this network namespace with its kind (one
/// `RTM_GETLINK` dump).
pub(crate) fn links() -> io::Result<Vec<Link>> {
    let socket = Netlink::open(libc::NETLINK_ROUTE)?;
    let mut request = [0u8; IFINFOMSG_LEN];
    request[0] = u8::try_from(libc::AF_UNSPEC).expect("0");
    socket.send(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, &request)?;
    let mut buf = vec![0u8; 32 * 1024];
    let mut out = Vec::new();
    loop {
        let n = socket.recv(&mut buf)?;
        for message in netlink::messages(&buf[..n]) {
            let (kind, payload) = message.map_err(|()| io::Error::other("a malformed netlink message"))?;
            match kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR if netlink::error_code(payload) != 0 => {
                    return Err(io::Error::from_raw_os_error(-netlink::error_code(payload)));
                }
                RTM_NEWLINK => out.extend(parse_link(payload)),
                _ => {}
            }
        }
    }
}

/// A link from an `RTM_NEWLINK` payload; `None` without a name.
fn parse_link(payload: &[u8]) -> Option<Link> {
    let mut name = None;
    let mut kind = String::new();
    for (ty, data) in attributes(payload.get(IFINFOMSG_LEN..)?) {
        match ty {
            IFLA_IFNAME => name = Some(c_string(data)),
            IFLA_LINKINFO => {
                if let Some((_, k)) = attributes(data).find(|(t, _)| *t == IFLA_INFO_KIND) {
                    kind = c_string(k);
                }
            }
            _ => {}
        }
    }
    Some(Link { name: name?, kind })
}

/// The attributes (`struct rtattr`: length, type, data) in `data`, until
/// one does not fit.
fn attributes(mut data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes(data.get(0..2)?.try_into().ok()?));
        let ty = u16::from_ne_bytes(data.get(2..4)?.try_into().ok()?) & NLA_TYPE_MASK;
        let value = data.get(4..len)?;
        data = data.get(netlink::align(len)..).unwrap_or(&[]);
        Some((ty, value))
    })
}

/// A NUL-terminated string attribute.
fn c_string(data: &[u8]) -> String {
    let end = data.iter().position(|b| *b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

/// Without a subscription, how often the devices are read again.
const POLL_PERIOD: Duration = Duration::from_secs(5);
/// Notifications this soon after one are read as one change (a veth pair
/// made, renamed, moved into a pod's namespace, set up and addressed).
const SETTLE: Duration = Duration::from_millis(50);

/// Follows the node's links and addresses (which decide what is an
/// external device): `changed` resolves when one appeared, went or
/// changed, and the selection is resolved again.
pub(crate) struct Watch {
    socket: Option<AsyncFd<OwnedFd>>,
}

impl Watch {
    /// Subscribes to the link and address groups; without them, `changed`
    /// resolves every `POLL_PERIOD`.
    #[must_use]
    pub(crate) fn start() -> Self {
        let groups = (libc::RTMGRP_LINK | libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
        let socket = local_addrs::subscribe(groups)
            .inspect_err(|err| {
                warn!(%err, period_s = POLL_PERIOD.as_secs(), "cannot subscribe to link changes (netlink); reading the pod-facing devices periodically instead");
            })
            .ok();
        Self { socket }
    }

    /// Resolves after a change (or a poll period). Cancel-safe: a
    /// notification left unread resolves the next call.
    pub(crate) async fn changed(&mut self) {
        if let Some(socket) = &self.socket {
            if let Err(err) = local_addrs::wait_and_drain(socket).await {
                warn!(%err, "link change notifications failed; reading the pod-facing devices periodically instead");
                self.socket = None;
            }
            tokio::time::sleep(SETTLE).await;
            if let Some(socket) = &self.socket {
                let _ = local_addrs::drain(socket);
            }
        } else {
            tokio::time::sleep(POLL_PERIOD).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, kind: &str) -> Link {
        Link { name: name.into(), kind: kind.into() }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn selection_from_names() {
        assert_eq!(PodDeviceSelection::from_names(vec![]), PodDeviceSelection::Auto);
        assert_eq!(PodDeviceSelection::from_names(names(&["auto"])), PodDeviceSelection::Auto);
        assert_eq!(PodDeviceSelection::from_names(names(&["none"])), PodDeviceSelection::Named(vec![]));
        assert_eq!(
            PodDeviceSelection::from_names(names(&["cni0", "veth1"])),
            PodDeviceSelection::Named(names(&["cni0", "veth1"]))
        );
    }

    /// Auto takes veths and bridges, never an external device, never a
    /// physical device or loopback; named devices only where they exist.
    #[test]
    fn resolve_table() {
        let links = [
            link("lo", ""),
            link("eth0", ""),
            link("cni0", "bridge"),
            link("veth1", "veth"),
            link("vn1", "veth"),
            link("vxlan0", "vxlan"),
        ];
        let external = names(&["eth0", "vn1"]);
        for (selection, want) in [
            (PodDeviceSelection::Auto, names(&["cni0", "veth1"])),
            (PodDeviceSelection::Named(names(&["veth1", "gone", "eth0"])), names(&["eth0", "veth1"])),
            (PodDeviceSelection::Named(vec![]), vec![]),
        ] {
            assert_eq!(resolve(&selection, &links, &external), want, "{selection:?}");
        }
    }

    fn attr(ty: u16, data: &[u8]) -> Vec<u8> {
        let mut a = u16::try_from(4 + data.len()).unwrap().to_ne_bytes().to_vec();
        a.extend_from_slice(&ty.to_ne_bytes());
        a.extend_from_slice(data);
        a.resize(netlink::align(a.len()), 0);
        a
    }

    #[test]
    fn parses_a_link_message() {
        let mut payload = vec![0u8; IFINFOMSG_LEN];
        payload.extend(attr(IFLA_IFNAME, b"veth9\0"));
        payload.extend(attr(4, &1500u32.to_ne_bytes()));
        let info = attr(IFLA_INFO_KIND, b"veth\0");
        payload.extend(attr(IFLA_LINKINFO | 0x8000, &info));
        assert_eq!(parse_link(&payload), Some(link("veth9", "veth")));
        // No kind: a physical device.
        let mut bare = vec![0u8; IFINFOMSG_LEN];
        bare.extend(attr(IFLA_IFNAME, b"eth0\0"));
        assert_eq!(parse_link(&bare), Some(link("eth0", "")));
        // No name, or a cut header: nothing.
        assert_eq!(parse_link(&[0u8; IFINFOMSG_LEN]), None);
        assert_eq!(parse_link(&[0u8; 3]), None);
    }

    /// The dump of this namespace names at least its loopback.
    #[test]
    fn dumps_this_namespace() {
        let links = links().expect("RTM_GETLINK dump");
        assert!(links.iter().any(|l| l.name == "lo"), "{links:?}");
    }
}
