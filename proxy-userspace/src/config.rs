//! The configuration file (`--config`): ebpf-proxy's own fields, and the
//! fields of kube-proxy's `KubeProxyConfiguration` that apply, so an
//! operator can reuse theirs. Fields of kube-proxy that have no meaning here
//! (iptables, IPVS, conntrack tuning, ...) are noted and ignored; unknown
//! fields are named in a warning; invalid values stop startup.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
};

use ipnet::IpNet;
use serde::Deserialize;
use serde_yaml::Value;

pub const KUBE_PROXY_API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path}: {field}: {message}")]
    Invalid { path: String, field: String, message: String },
}

/// Fields of kube-proxy's configuration that do not apply to ebpf-proxy.
const NOT_APPLICABLE: &[&str] = &[
    "mode",
    "bindAddress",
    "bindAddressHardFail",
    "configSyncPeriod",
    "conntrack",
    "detectLocal",
    "detectLocalMode",
    "enableProfiling",
    "featureGates",
    "iptables",
    "ipvs",
    "linux",
    "logging",
    "nftables",
    "oomScoreAdj",
    "portRange",
    "showHiddenMetricsForVersion",
    "syncPeriod",
    "minSyncPeriod",
    "udpIdleTimeout",
    "winkernel",
    "windows",
    "clusterCIDR",
];

/// The file, with every field optional (flags override it, defaults fill
/// what neither gives).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FileConfig {
    pub services_file: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub cgroup: Option<PathBuf>,
    pub bpffs_dir: Option<PathBuf>,
    pub node_name: Option<String>,
    pub node_ips: Vec<IpAddr>,
    /// kube-proxy's nodePortAddresses: node addresses in these ranges serve
    /// NodePorts (empty: all).
    pub node_port_cidrs: Vec<IpNet>,
    pub socket_netns: Vec<PathBuf>,
    pub healthz_bind_address: Option<SocketAddr>,
    pub metrics_bind_address: Option<SocketAddr>,
    pub health_timeout_seconds: Option<u64>,
    pub services_map_size: Option<u32>,
    pub backends_map_size: Option<u32>,
    pub bpf_log: Option<bool>,
    /// Devices the TC programs attach to (empty: found from the node's
    /// addresses and default route).
    pub devices: Vec<String>,
    pub maglev_table_size: Option<usize>,
    pub ct_map_size: Option<u32>,
    pub max_service_series: Option<usize>,
    /// Fields seen that are kube-proxy's but mean nothing here.
    pub ignored: Vec<String>,
    /// Fields nobody knows.
    pub unknown: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    api_version: Option<String>,
    kind: Option<String>,
    // ebpf-proxy's own
    services_file: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
    cgroup: Option<PathBuf>,
    bpffs_dir: Option<PathBuf>,
    node_name: Option<String>,
    #[serde(rename = "nodeIPs", default)]
    node_ips: Vec<String>,
    #[serde(default)]
    socket_netns: Vec<PathBuf>,
    health_timeout_seconds: Option<u64>,
    services_map_size: Option<u32>,
    backends_map_size: Option<u32>,
    bpf_log: Option<bool>,
    #[serde(default)]
    devices: Vec<String>,
    maglev_table_size: Option<usize>,
    ct_map_size: Option<u32>,
    max_service_series: Option<usize>,
    // kube-proxy's
    healthz_bind_address: Option<String>,
    metrics_bind_address: Option<String>,
    #[serde(default)]
    node_port_addresses: Vec<String>,
    hostname_override: Option<String>,
    client_connection: Option<ClientConnection>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClientConnection {
    kubeconfig: Option<PathBuf>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
    parse(&text).map_err(|(field, message)| ConfigError::Invalid { path: path.display().to_string(), field, message })
}

/// Parses the file; an error is (field, message).
pub fn parse(text: &str) -> Result<FileConfig, (String, String)> {
    let raw: Raw = serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text))
        .map_err(|e| (e.path().to_string(), e.into_inner().to_string()))?;
    if let Some(kind) = raw.kind.as_deref()
        && kind != "KubeProxyConfiguration"
    {
        return Err(("kind".into(), format!("{kind:?}: expected KubeProxyConfiguration or no kind")));
    }
    if let Some(v) = raw.api_version.as_deref()
        && v != KUBE_PROXY_API_VERSION
    {
        return Err(("apiVersion".into(), format!("{v:?}: expected {KUBE_PROXY_API_VERSION}")));
    }
    let mut cfg = FileConfig {
        services_file: raw.services_file,
        kubeconfig: raw.kubeconfig.or(raw.client_connection.as_ref().and_then(|c| c.kubeconfig.clone())),
        cgroup: raw.cgroup,
        bpffs_dir: raw.bpffs_dir,
        node_name: raw.node_name.or(raw.hostname_override).filter(|n| !n.is_empty()),
        socket_netns: raw.socket_netns,
        health_timeout_seconds: raw.health_timeout_seconds,
        services_map_size: raw.services_map_size,
        backends_map_size: raw.backends_map_size,
        bpf_log: raw.bpf_log,
        devices: raw.devices,
        ct_map_size: raw.ct_map_size,
        max_service_series: raw.max_service_series,
        ..FileConfig::default()
    };
    if let Some(m) = raw.maglev_table_size {
        cfg.maglev_table_size =
            Some(crate::maglev::check_size(m).map_err(|e| ("maglevTableSize".to_owned(), e.to_string()))?);
    }
    for (i, ip) in raw.node_ips.iter().enumerate() {
        cfg.node_ips.push(ip.parse().map_err(|_| (format!("nodeIPs[{i}]"), format!("{ip:?} is not an IP address")))?);
    }
    for (i, cidr) in raw.node_port_addresses.iter().enumerate() {
        if cidr == "primary" {
            continue; // the node's primary addresses: what node IPs are anyway
        }
        cfg.node_port_cidrs
            .push(cidr.parse().map_err(|_| (format!("nodePortAddresses[{i}]"), format!("{cidr:?} is not a CIDR")))?);
    }
    cfg.healthz_bind_address = bind_address("healthzBindAddress", raw.healthz_bind_address.as_deref(), 10256)?;
    cfg.metrics_bind_address = bind_address("metricsBindAddress", raw.metrics_bind_address.as_deref(), 10249)?;
    for key in raw.rest.keys() {
        if NOT_APPLICABLE.contains(&key.as_str()) {
            cfg.ignored.push(key.clone());
        } else {
            cfg.unknown.push(key.clone());
        }
    }
    if let Some(c) = raw.client_connection {
        cfg.ignored.extend(c.rest.keys().map(|k| format!("clientConnection.{k}")));
    }
    Ok(cfg)
}

/// kube-proxy's `IP:PORT` or `IP` (the port defaults); empty means unset.
fn bind_address(field: &str, value: Option<&str>, default_port: u16) -> Result<Option<SocketAddr>, (String, String)> {
    let Some(value) = value.filter(|v| !v.is_empty()) else { return Ok(None) };
    if let Ok(addr) = value.parse::<SocketAddr>() {
        return Ok(Some(addr));
    }
    value
        .parse::<IpAddr>()
        .map(|ip| Some(SocketAddr::new(ip, default_port)))
        .map_err(|_| (field.to_owned(), format!("{value:?} is not IP or IP:PORT")))
}

impl FileConfig {
    /// Logs what the file holds that is not used.
    pub fn log_unused(&self, path: &Path) {
        if !self.ignored.is_empty() {
            tracing::info!(config = %path.display(), fields = ?self.ignored, "kube-proxy settings that do not apply to ebpf-proxy are ignored");
        }
        if !self.unknown.is_empty() {
            tracing::warn!(config = %path.display(), fields = ?self.unknown, "unknown fields in the config file are ignored; check their spelling");
        }
    }
}

/// Node addresses that serve NodePorts: those in `cidrs` (all when empty).
#[must_use]
pub fn node_port_addresses(node_ips: &[IpAddr], cidrs: &[IpNet]) -> Vec<IpAddr> {
    node_ips.iter().copied().filter(|ip| cidrs.is_empty() || cidrs.iter().any(|c| c.contains(ip))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A KubeProxyConfiguration as operators write them (kube-proxy docs).
    const KUBE_PROXY: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  acceptContentTypes: \"\"
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 5
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: \"\"
iptables:
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 0s
  syncPeriod: 30s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: \"\"
  syncPeriod: 30s
metricsBindAddress: 127.0.0.1:10249
mode: \"\"
nodePortAddresses: [10.0.0.0/8]
oomScoreAdj: -999
portRange: \"\"
udpIdleTimeout: 250ms
";

    #[test]
    fn a_kube_proxy_configuration_is_understood() {
        let cfg = parse(KUBE_PROXY).unwrap();
        assert_eq!(cfg.kubeconfig.as_deref(), Some(Path::new("/var/lib/kube-proxy/kubeconfig.conf")));
        assert_eq!(cfg.healthz_bind_address, Some("0.0.0.0:10256".parse().unwrap()));
        assert_eq!(cfg.metrics_bind_address, Some("127.0.0.1:10249".parse().unwrap()));
        assert_eq!(cfg.node_port_cidrs, vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]);
        assert_eq!(cfg.node_name, None, "an empty hostnameOverride means the default");
        assert!(cfg.unknown.is_empty(), "{:?}", cfg.unknown);
        assert!(cfg.ignored.contains(&"iptables".to_owned()) && cfg.ignored.contains(&"conntrack".to_owned()));
    }

    #[test]
    fn unknown_fields_are_named_and_invalid_ones_fail() {
        let cfg = parse("healthzBindAdress: 1.2.3.4\nnodeName: n1\n").unwrap();
        assert_eq!(cfg.unknown, vec!["healthzBindAdress".to_owned()]);
        assert_eq!(cfg.node_name.as_deref(), Some("n1"));
        assert_eq!(parse("metricsBindAddress: nowhere\n").unwrap_err().0, "metricsBindAddress");
        assert_eq!(parse("nodePortAddresses: [10.0.0.0/33]\n").unwrap_err().0, "nodePortAddresses[0]");
        assert_eq!(parse("servicesMapSize: lots\n").unwrap_err().0, "servicesMapSize");
        assert_eq!(parse("kind: Deployment\n").unwrap_err().0, "kind");
        assert_eq!(parse("maglevTableSize: 1000\n").unwrap_err().0, "maglevTableSize");
        assert_eq!(parse("maglevTableSize: 1021\ndevices: [eth0]\n").unwrap().maglev_table_size, Some(1021));
    }

    #[test]
    fn a_bare_ip_takes_the_default_port() {
        let cfg = parse("healthzBindAddress: 127.0.0.1\n").unwrap();
        assert_eq!(cfg.healthz_bind_address, Some("127.0.0.1:10256".parse().unwrap()));
    }

    #[test]
    fn node_port_addresses_filter_node_ips() {
        let ips: Vec<IpAddr> = vec!["10.1.2.3".parse().unwrap(), "192.168.1.1".parse().unwrap()];
        assert_eq!(node_port_addresses(&ips, &["10.0.0.0/8".parse().unwrap()]), vec![ips[0]]);
        assert_eq!(node_port_addresses(&ips, &[]), ips);
    }
}
