//! Each setting's check: the flag's value parser and the config file's
//! parser (`crate::config`) call the same one, so a value is taken or
//! refused alike wherever it comes from. An error is the message; the
//! caller names the flag or field. Where the file's YAML gives a number,
//! the check takes the number and the flag's parser (`parse_...`) reads it
//! from the text first.
use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use ipnet::IpNet;

use crate::{
    node::{nodeport_addresses::NodePortAddresses, reserved_ports::NodePortRange},
    reconcile::maglev,
    source::listwatch::ContentType,
};

/// `--kube-api-content-type`: kube-proxy's two values.
pub(crate) fn content_type(value: &str) -> Result<ContentType, String> {
    match value {
        "application/vnd.kubernetes.protobuf" => Ok(ContentType::Protobuf),
        "application/json" => Ok(ContentType::Json),
        _ => Err("give application/vnd.kubernetes.protobuf or application/json".to_owned()),
    }
}

/// `HOST:PORT` (an IPv6 host in brackets), or a URL `https://HOST:PORT`;
/// returned as `HOST:PORT`.
pub(crate) fn endpoint(text: &str) -> Result<String, String> {
    let rest = text.strip_prefix("https://").unwrap_or(text).trim_end_matches('/');
    let bad = || format!("{text:?}: expected HOST:PORT (e.g. 192.168.0.10:6443 or [fd00::10]:6443)");
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains('/') || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(bad());
    }
    Ok(rest.to_owned())
}

/// kube-proxy's `IP:PORT`, or `IP` with `default_port`.
fn bind_address(text: &str, default_port: u16) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, default_port))
        .map_err(|_| format!("{text:?} is not IP or IP:PORT"))
}

/// Where to serve /healthz and /livez: `IP:PORT`, or `IP` with the
/// default's port.
pub(crate) fn healthz_address(text: &str) -> Result<SocketAddr, String> {
    bind_address(text, super::default_healthz().port())
}

/// Where to serve /metrics and /proxyMode: `IP:PORT`, or `IP` with the
/// default's port.
pub(crate) fn metrics_address(text: &str) -> Result<SocketAddr, String> {
    bind_address(text, super::default_metrics().port())
}

/// An address of this node.
pub(crate) fn ip(text: &str) -> Result<IpAddr, String> {
    text.parse().map_err(|_| format!("{text:?} is not an IP address"))
}

/// The most entries a map size takes: 64 times the largest default, and
/// a connection-tracking map of this size (allocated whole at start) takes
/// about 2 GiB.
pub(crate) const MAX_MAP_SIZE: u32 = 1 << 24;

/// Map sizes: 1 to `MAX_MAP_SIZE` (the kernel refuses 0).
pub(crate) fn map_size(n: i64) -> Result<u32, String> {
    u32::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_MAP_SIZE).contains(n))
        .ok_or_else(|| format!("{n} is not in 1..={MAX_MAP_SIZE}"))
}

/// `map_size` of a flag's value.
pub(crate) fn parse_map_size(text: &str) -> Result<u32, String> {
    map_size(text.parse().map_err(|e: std::num::ParseIntError| e.to_string())?)
}

/// Seconds a change may wait unapplied before /healthz answers 503: at
/// least 1.
pub(crate) fn health_timeout(seconds: u64) -> Result<u64, String> {
    if seconds == 0 { Err(format!("{seconds} is not in 1..{}", u64::MAX)) } else { Ok(seconds) }
}

/// `health_timeout` of a flag's value.
pub(crate) fn parse_health_timeout(text: &str) -> Result<u64, String> {
    health_timeout(text.parse().map_err(|e: std::num::ParseIntError| e.to_string())?)
}

/// Entries of each Maglev table: one of the primes `maglev::SIZES`.
pub(crate) fn maglev_table_size(n: usize) -> Result<usize, String> {
    maglev::check_size(n).map_err(|e| e.to_string())
}

/// `maglev_table_size` of a flag's value.
pub(crate) fn parse_maglev_table_size(text: &str) -> Result<usize, String> {
    maglev_table_size(text.parse().map_err(|e| format!("{text:?}: {e}"))?)
}

/// Which local addresses serve NodePorts: CIDRs, or `primary` alone (the
/// file's list, or the flag's value split at commas).
pub(crate) fn nodeport_addresses(text: &str) -> Result<NodePortAddresses, String> {
    let values: Vec<&str> = text.split(',').collect();
    NodePortAddresses::parse(&values).map_err(|(_, e)| e.to_string())
}

/// `--node-port-range`: `MIN-MAX` or `none`.
pub(crate) fn node_port_range(text: &str) -> Result<NodePortRange, String> {
    NodePortRange::parse(text.trim())
}

/// One of the cluster's pod CIDRs.
pub(crate) fn cidr(text: &str) -> Result<IpNet, String> {
    text.trim()
        .parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|e| format!("{text:?}: {e} (expected a CIDR such as 10.244.0.0/16)"))
}

/// The cluster's pod CIDRs together: at most one per family, as the
/// programs hold them, none of prefix 0 (every address: no cluster is
/// that).
pub(crate) fn cluster_cidrs(cidrs: &[IpNet]) -> Result<(), String> {
    if let Some(all) = cidrs.iter().find(|c| c.prefix_len() == 0) {
        return Err(format!("{all} is every address, not a cluster's pod CIDR"));
    }
    for v4 in [true, false] {
        let of: Vec<String> =
            cidrs.iter().filter(|c| matches!(c, IpNet::V4(_)) == v4).map(ToString::to_string).collect();
        if of.len() > 1 {
            return Err(format!("{} are of one family: give at most one CIDR per family", of.join(" and ")));
        }
    }
    Ok(())
}

/// A Go duration (`metav1.Duration`): `30s`, `1m0s`, `250ms`, `1h0m0s`, `1.5s`.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration such as 30s, 1m0s or 250ms");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "\u{b5}s" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_end..];
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_host_and_port() {
        assert_eq!(endpoint("10.0.0.1:6443").as_deref(), Ok("10.0.0.1:6443"));
        assert_eq!(endpoint("https://cp.example:6443/").as_deref(), Ok("cp.example:6443"));
        assert_eq!(endpoint("[fd00::1]:6443").as_deref(), Ok("[fd00::1]:6443"));
        for bad in ["10.0.0.1", "fd00::1:6443", ":6443", "h:0", "h:x"] {
            assert!(endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn go_durations_parse() {
        for (text, ms) in [
            ("0s", 0),
            ("0", 0),
            ("250ms", 250),
            ("30s", 30_000),
            ("1m0s", 60_000),
            ("1h0m0s", 3_600_000),
            ("1.5s", 1500),
        ] {
            assert_eq!(duration(text), Ok(Duration::from_millis(ms)), "{text}");
        }
        for bad in ["", "s", "10", "1x", "1m 0s"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bare_ip_takes_the_default_port() {
        assert_eq!(healthz_address("127.0.0.1"), Ok("127.0.0.1:10256".parse().unwrap()));
        assert_eq!(metrics_address("[::1]:9000"), Ok("[::1]:9000".parse().unwrap()));
        assert_eq!(metrics_address(""), Err("\"\" is not IP or IP:PORT".to_owned()));
    }

    #[test]
    fn ranges_are_named() {
        assert_eq!(parse_map_size("-1"), Err("-1 is not in 1..=16777216".to_owned()));
        assert_eq!(parse_map_size("lots"), Err("invalid digit found in string".to_owned()));
        assert_eq!(parse_health_timeout("0"), Err("0 is not in 1..18446744073709551615".to_owned()));
        assert_eq!(parse_maglev_table_size("251"), Ok(251));
    }
}
