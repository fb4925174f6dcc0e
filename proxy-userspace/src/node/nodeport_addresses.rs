//! Which of the node's addresses serve NodePorts: kube-proxy's
//! `nodePortAddresses` (`--nodeport-addresses`) applied to the node's
//! local addresses (`crate::node::local_addrs`) and its node IPs. Pure: the
//! caller reads the addresses.
use std::{fmt, net::IpAddr};

use ipnet::IpNet;

/// kube-proxy's `nodePortAddresses` setting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Unset: every local address of the node (kube-proxy's iptables and
    /// ipvs modes, its default mode).
    #[default]
    All,
    /// `primary`: the node's primary IP of each family (the first node IP
    /// of that family: `--node-ip`, else the Node object's addresses).
    Primary,
    /// The local addresses inside these ranges; a family no range names
    /// is not narrowed (kube-proxy adds `0.0.0.0/0` or `::/0` for it).
    Cidrs(Vec<IpNet>),
}

/// The keyword for the primary node IPs (kube-proxy's
/// `NodePortAddressesPrimary`).
pub(crate) const PRIMARY: &str = "primary";

/// A `nodePortAddresses` value that is neither CIDRs nor `primary` alone.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// A value that is not a CIDR.
    #[error("{0:?} is not a CIDR (e.g. 10.0.0.0/8) nor `primary`")]
    NotACidr(String),
    /// `primary` given with CIDRs.
    #[error("`primary` cannot be combined with CIDRs: give either `primary` alone or CIDRs")]
    PrimaryWithCidrs,
}

impl NodePortAddresses {
    /// From the config file's list or the flag's values: empty is `All`,
    /// `primary` alone is `Primary`, else CIDRs. On error, the index of the
    /// bad entry too.
    pub fn parse<S: AsRef<str>>(values: &[S]) -> Result<Self, (usize, ParseError)> {
        // Blank entries are skipped; an error names the entry's place in
        // the list as written.
        let values: Vec<(usize, &str)> =
            values.iter().map(|v| v.as_ref().trim()).enumerate().filter(|(_, v)| !v.is_empty()).collect();
        if values.is_empty() {
            return Ok(Self::All);
        }
        if let Some((i, _)) = values.iter().find(|(_, v)| *v == PRIMARY) {
            return if values.len() == 1 { Ok(Self::Primary) } else { Err((*i, ParseError::PrimaryWithCidrs)) };
        }
        let cidrs = values
            .iter()
            .map(|(i, v)| v.parse().map_err(|_| (*i, ParseError::NotACidr((*v).to_owned()))))
            .collect::<Result<_, _>>()?;
        Ok(Self::Cidrs(cidrs))
    }
}

impl fmt::Display for NodePortAddresses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("all local addresses"),
            Self::Primary => f.write_str(PRIMARY),
            Self::Cidrs(cidrs) => {
                let cidrs: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
                f.write_str(&cidrs.join(","))
            }
        }
    }
}

/// The addresses that serve NodePorts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Serving {
    /// Node addresses (never a loopback one), sorted.
    pub(crate) addrs: Vec<IpAddr>,
    /// 127.0.0.1 serves NodePorts too (IPv4 only).
    pub(crate) loopback: bool,
}

/// The addresses that serve NodePorts, from the node's `local` addresses
/// (all devices) and its `node_ips` (`--node-ip`, else the Node object's;
/// counted as local even when no device holds them, e.g. a cloud's NAT'd
/// address, so naming one is enough).
///
/// As kube-proxy v1.29 and later in its default (iptables) mode
/// (pkg/proxy/util/nodeport_addresses.go and the iptables proxier; its
/// nftables mode defaults to `primary` instead): unset means every local
/// address; CIDRs
/// narrow the family they name; `primary` is the first node IP of each
/// family. IPv4 loopback serves (as 127.0.0.1) when the setting admits
/// 127.0.0.0/8 (unset, or a CIDR covering it; never with `primary`), as
/// kube-proxy's `localhostNodePorts` with route_localnet; IPv6 loopback
/// never does (kube-proxy cannot either). IPv6 link-local addresses never
/// serve: they name a link, not the node, and every veth has one.
#[must_use]
pub(crate) fn serving(setting: &NodePortAddresses, local: &[IpAddr], node_ips: &[IpAddr]) -> Serving {
    let mut candidates: Vec<IpAddr> = local.iter().chain(node_ips).copied().filter(|ip| usable(*ip)).collect();
    candidates.sort_unstable();
    candidates.dedup();
    let loopback_v4 = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let (addrs, loopback): (Vec<IpAddr>, bool) = match setting {
        NodePortAddresses::All => (candidates, true),
        NodePortAddresses::Primary => {
            let first = |v6: bool| node_ips.iter().copied().find(|ip| ip.is_ipv6() == v6 && usable(*ip));
            let mut addrs: Vec<IpAddr> = [first(false), first(true)].into_iter().flatten().collect();
            addrs.retain(|ip| !ip.is_loopback());
            (addrs, false)
        }
        NodePortAddresses::Cidrs(cidrs) => {
            let admits = |ip: &IpAddr| {
                let family: Vec<&IpNet> = cidrs.iter().filter(|c| c.addr().is_ipv6() == ip.is_ipv6()).collect();
                family.is_empty() || family.iter().any(|c| c.contains(ip))
            };
            let loopback = admits(&loopback_v4)
                || cidrs.iter().any(|c| matches!(c, IpNet::V4(net) if net.network().is_loopback()));
            (candidates.into_iter().filter(admits).collect(), loopback)
        }
    };
    Serving { addrs: addrs.into_iter().filter(|ip| !ip.is_loopback()).collect(), loopback }
}

/// An address a NodePort can be reached at: not unspecified, multicast,
/// IPv6 loopback or IPv6 link-local.
fn usable(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !v4.is_unspecified() && !v4.is_multicast() && !v4.is_broadcast(),
        IpAddr::V6(v6) => {
            !v6.is_unspecified() && !v6.is_multicast() && !v6.is_loopback() && !v6.is_unicast_link_local()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn cidrs(list: &[&str]) -> NodePortAddresses {
        NodePortAddresses::Cidrs(list.iter().map(|s| s.parse().unwrap()).collect())
    }

    /// A node with eth0 (192.168.1.10, 2001:db8::10 and a link-local
    /// address), eth1 (10.0.0.10), lo and a pod bridge (10.244.0.1).
    const LOCAL: &[&str] = &["127.0.0.1", "::1", "192.168.1.10", "2001:db8::10", "fe80::1", "10.0.0.10", "10.244.0.1"];

    #[test]
    fn the_setting_picks_the_addresses() {
        // (setting, node IPs, addresses serving NodePorts, 127.0.0.1 too)
        let cases: &[(NodePortAddresses, &[&str], &[&str], bool)] = &[
            // Unset: every local address, loopback (IPv4) included, as
            // kube-proxy's iptables mode (`-m addrtype --dst-type LOCAL`,
            // `! -d ::1/128` for IPv6).
            (NodePortAddresses::All, &[], &["10.0.0.10", "10.244.0.1", "192.168.1.10", "2001:db8::10"], true),
            // A node IP no device holds serves too.
            (
                NodePortAddresses::All,
                &["203.0.113.7"],
                &["10.0.0.10", "10.244.0.1", "192.168.1.10", "203.0.113.7", "2001:db8::10"],
                true,
            ),
            // CIDRs: the local addresses inside them; IPv6, named by no
            // range, is not narrowed; 127.0.0.0/8 is outside: no loopback.
            (cidrs(&["10.0.0.0/8"]), &[], &["10.0.0.10", "10.244.0.1", "2001:db8::10"], false),
            (cidrs(&["10.0.0.0/24", "2001:db8::/64"]), &[], &["10.0.0.10", "2001:db8::10"], false),
            // A range covering loopback admits 127.0.0.1 (kube-proxy's
            // ContainsIPv4Loopback).
            (cidrs(&["127.0.0.0/8", "192.168.0.0/16"]), &[], &["192.168.1.10", "2001:db8::10"], true),
            (cidrs(&["127.0.0.1/32"]), &[], &["2001:db8::10"], true),
            (cidrs(&["0.0.0.0/0"]), &[], &["10.0.0.10", "10.244.0.1", "192.168.1.10", "2001:db8::10"], true),
            // Only IPv6 named: IPv4 (loopback too) is not narrowed.
            (cidrs(&["2001:db8::/32"]), &[], &["10.0.0.10", "10.244.0.1", "192.168.1.10", "2001:db8::10"], true),
            // A range with no local address in it: none of that family.
            (cidrs(&["172.16.0.0/12"]), &[], &["2001:db8::10"], false),
            // primary: the first node IP of each family, no loopback
            // (kube-proxy turns it into IP/32 and IP/128).
            (NodePortAddresses::Primary, &["192.168.1.10", "10.0.0.10"], &["192.168.1.10"], false),
            (
                NodePortAddresses::Primary,
                &["2001:db8::10", "192.168.1.10", "10.0.0.10"],
                &["192.168.1.10", "2001:db8::10"],
                false,
            ),
            // No node IP known: nothing but what the operator names.
            (NodePortAddresses::Primary, &[], &[], false),
            (NodePortAddresses::Primary, &["127.0.0.1"], &[], false),
        ];
        for (setting, node_ips, want, loopback) in cases {
            let got = serving(setting, &ips(LOCAL), &ips(node_ips));
            assert_eq!(got.addrs, ips(want), "{setting} with node IPs {node_ips:?}");
            assert_eq!(got.loopback, *loopback, "{setting} with node IPs {node_ips:?}: loopback");
        }
    }

    #[test]
    fn link_local_multicast_and_unspecified_never_serve() {
        let local = ips(&["fe80::2", "::", "0.0.0.0", "ff02::1", "224.0.0.1", "::1"]);
        assert_eq!(serving(&NodePortAddresses::All, &local, &[]).addrs, Vec::<IpAddr>::new());
        assert_eq!(serving(&cidrs(&["::/0"]), &local, &[]).addrs, Vec::<IpAddr>::new());
    }

    #[test]
    fn parse_takes_cidrs_or_primary_alone() {
        let none: [&str; 0] = [];
        assert_eq!(NodePortAddresses::parse(&none), Ok(NodePortAddresses::All));
        assert_eq!(NodePortAddresses::parse(&["primary"]), Ok(NodePortAddresses::Primary));
        assert_eq!(NodePortAddresses::parse(&["10.0.0.0/8", " ::/0"]), Ok(cidrs(&["10.0.0.0/8", "::/0"])));
        assert_eq!(
            NodePortAddresses::parse(&["10.0.0.0/8", "primary"]),
            Err((1, ParseError::PrimaryWithCidrs)),
            "kube-proxy refuses primary with CIDRs"
        );
        assert_eq!(NodePortAddresses::parse(&["10.0.0.0/33"]), Err((0, ParseError::NotACidr("10.0.0.0/33".into()))));
        assert_eq!(NodePortAddresses::parse(&["10.0.0.1"]), Err((0, ParseError::NotACidr("10.0.0.1".into()))));
        // The index is the entry's place as written, blanks counted.
        assert_eq!(
            NodePortAddresses::parse(&["", "10.0.0.0/8", " ", "bad"]),
            Err((3, ParseError::NotACidr("bad".into())))
        );
        assert_eq!(NodePortAddresses::parse(&["", "10.0.0.0/8", "primary"]), Err((2, ParseError::PrimaryWithCidrs)));
    }
}
