//! The network devices traffic from outside the node arrives on, where the
//! TC programs attach: those named by `--devices`, or by default the
//! devices holding the node's addresses and the default routes.
use std::{collections::BTreeSet, net::IpAddr};

use nix::ifaddrs::getifaddrs;

/// `ARPHRD_ETHER`: the TC programs parse Ethernet frames.
const ARPHRD_ETHER: u16 = 1;

/// Which devices to attach to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeviceSelection {
    /// Those holding the node's addresses and the default routes.
    Auto,
    /// These (empty: none, traffic from outside is not served).
    Named(Vec<String>),
}

impl DeviceSelection {
    /// From `--devices` (or the config file): nothing given is `Auto`, the
    /// single word `none` is an empty list.
    #[must_use]
    pub(crate) fn from_names(names: Vec<String>) -> Self {
        match names.as_slice() {
            [] => Self::Auto,
            [only] if only == "none" => Self::Named(Vec::new()),
            _ => Self::Named(names),
        }
    }
}

/// The devices to attach to, and the ones left out (not Ethernet, or not
/// found) with the reason.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Devices {
    pub(crate) chosen: Vec<String>,
    pub(crate) skipped: Vec<(String, &'static str)>,
}

/// Resolves `selection` in this network namespace.
///
/// Devices holding only other addresses serving NodePorts (a pod bridge's,
/// a second NIC's) are not chosen: traffic arriving on a pod bridge is the
/// pods' own (the socket programs translate it), and a second NIC
/// carrying traffic from outside is named with `--devices`.
#[must_use]
pub(crate) fn resolve(selection: &DeviceSelection, node_ips: &[IpAddr]) -> Devices {
    let links = links();
    let candidates: BTreeSet<String> = match selection {
        DeviceSelection::Named(names) => names.iter().cloned().collect(),
        DeviceSelection::Auto => {
            let mut found: BTreeSet<String> = holding(node_ips).into_iter().collect();
            found.extend(default_route_devices());
            found.remove("lo");
            found
        }
    };
    let mut out = Devices::default();
    for name in candidates {
        match links.iter().find(|(n, _)| *n == name) {
            None => out.skipped.push((name, "no such device")),
            Some((_, hatype)) if *hatype != ARPHRD_ETHER => out.skipped.push((name, "not an Ethernet device")),
            Some(_) => out.chosen.push(name),
        }
    }
    out
}

/// Every device and its link-layer type.
fn links() -> Vec<(String, u16)> {
    let Ok(addrs) = getifaddrs() else { return Vec::new() };
    addrs
        .filter_map(|a| {
            let link = a.address?.as_link_addr().copied()?;
            Some((a.interface_name, link.hatype()))
        })
        .collect()
}

/// Devices holding one of `ips`.
fn holding(ips: &[IpAddr]) -> Vec<String> {
    crate::node::local_addrs::read().into_iter().filter(|a| ips.contains(&a.ip)).map(|a| a.device).collect()
}

/// Devices of the IPv4 and IPv6 default routes (`/proc/net/route`,
/// `/proc/net/ipv6_route`, as this network namespace sees them).
fn default_route_devices() -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(text) = std::fs::read_to_string("/proc/self/net/route") {
        out.extend(default_v4(&text));
    }
    if let Ok(text) = std::fs::read_to_string("/proc/self/net/ipv6_route") {
        out.extend(default_v6(&text));
    }
    out
}

/// `Iface Destination Gateway Flags RefCnt Use Metric Mask ...`: rows
/// with destination and mask 0.
fn default_v4(text: &str) -> Vec<String> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_owned())
        })
        .collect()
}

/// `dest plen src splen nexthop metric refcnt use flags iface`: rows with
/// an all-zero destination of length 0.
fn default_v6(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 10 && f[0].bytes().all(|b| b == b'0') && f[1] == "00").then(|| f[9].to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_routes_are_read() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(default_v4(v4), vec!["eth0"]);
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 ens3\n\
                  fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 ens3\n";
        assert_eq!(default_v6(v6), vec!["ens3"]);
    }

    #[test]
    fn none_is_an_empty_list() {
        assert_eq!(DeviceSelection::from_names(vec!["none".into()]), DeviceSelection::Named(Vec::new()));
        assert_eq!(DeviceSelection::from_names(Vec::new()), DeviceSelection::Auto);
    }

    #[test]
    fn loopback_is_never_chosen() {
        // lo holds 127.0.0.1, yet traffic from outside never arrives there.
        let devices = resolve(&DeviceSelection::Auto, &["127.0.0.1".parse().unwrap()]);
        assert!(!devices.chosen.contains(&"lo".to_owned()), "{devices:?}");
    }
}
