//! Each setting's check: the flag's value parser and the config file's
//! parser (`crate::config`) call the same one, so a value is taken or
//! refused alike wherever it comes from. An error is the message; the
//! caller names the flag or field.

/// `--kube-api-content-type`: kube-proxy's two values.
pub(crate) fn content_type(value: &str) -> Result<crate::source::listwatch::ContentType, String> {
    use crate::source::listwatch::ContentType;
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

/// `--healthz-bind-address` of kube-proxy's command line.
pub(crate) fn healthz_address(text: &str) -> Result<std::net::SocketAddr, String> {
    crate::config::bind_address("--healthz-bind-address", Some(text), super::default_healthz().port())
        .map_err(|(_, e)| e)?
        .ok_or_else(|| "empty".to_owned())
}

/// `--metrics-bind-address` of kube-proxy's command line.
pub(crate) fn metrics_address(text: &str) -> Result<std::net::SocketAddr, String> {
    crate::config::bind_address("--metrics-bind-address", Some(text), super::default_metrics().port())
        .map_err(|(_, e)| e)?
        .ok_or_else(|| "empty".to_owned())
}

/// `--audit-interval`: a Go duration.
pub(crate) fn duration(text: &str) -> Result<std::time::Duration, String> {
    crate::config::parse_duration(text)
}

/// The most entries a map size flag takes: 64 times the largest default, and
/// a connection-tracking map of this size (allocated whole at start) takes
/// about 2 GiB.
pub(crate) const MAX_MAP_SIZE: u32 = 1 << 24;

/// Map sizes: 1 to `MAX_MAP_SIZE` (the kernel refuses 0).
pub(crate) fn map_size() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(1..=i64::from(MAX_MAP_SIZE))
}

/// The same check for the config file's map sizes.
pub(crate) fn check_map_size(n: u32) -> Result<u32, String> {
    if (1..=MAX_MAP_SIZE).contains(&n) { Ok(n) } else { Err(format!("{n} is not in 1..={MAX_MAP_SIZE}")) }
}

/// `--nodeport-addresses`: comma-separated CIDRs, or `primary`.
pub(crate) fn nodeport_addresses(text: &str) -> Result<crate::node::nodeport_addresses::NodePortAddresses, String> {
    let values: Vec<&str> = text.split(',').collect();
    crate::node::nodeport_addresses::NodePortAddresses::parse(&values).map_err(|(_, e)| e.to_string())
}

/// One of `--cluster-cidr`'s CIDRs.
pub(crate) fn cidr(text: &str) -> Result<ipnet::IpNet, String> {
    text.trim()
        .parse::<ipnet::IpNet>()
        .map(|n| n.trunc())
        .map_err(|e| format!("{text:?}: {e} (expected a CIDR such as 10.244.0.0/16)"))
}

/// `--maglev-table-size`: one of the primes `maglev::SIZES`.
pub(crate) fn maglev_table_size(text: &str) -> Result<usize, String> {
    let n: usize = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    crate::reconcile::maglev::check_size(n).map_err(|e| e.to_string())
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
}
