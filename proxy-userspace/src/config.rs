//! The configuration file (`--config`): ebpf-proxy's own fields, and the
//! fields of kube-proxy's `KubeProxyConfiguration` (v1alpha1 and v1alpha2)
//! that apply, so an operator can reuse theirs (kubeadm's `kube-proxy`
//! ConfigMap key `config.conf` as it is). kube-proxy fields that change
//! behaviour are honoured or refused with the reason; fields that tune a
//! datapath ebpf-proxy does not have (iptables rules, IPVS, conntrack
//! sysctls, ...) are noted and ignored; unknown fields are named in a
//! warning; invalid values stop startup.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    args::LogFormat,
    node::nodeport_addresses::NodePortAddresses,
    settings::{LbAlgorithm, Settings, SocketLbMode, check, default_healthz, default_metrics},
};

use ipnet::IpNet;
use serde::Deserialize;
use serde_norway::Value;

/// The `KubeProxyConfiguration` versions understood.
pub(crate) const KUBE_PROXY_API_VERSIONS: &[&str] =
    &["kubeproxy.config.k8s.io/v1alpha1", "kubeproxy.config.k8s.io/v1alpha2"];

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs, reason = "each field is named in its variant's #[error] message")]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    /// A field of the file is not valid.
    #[error("config file {path}: {field}: {message}")]
    Invalid { path: String, field: String, message: String },
}

/// Fields of kube-proxy's configuration that do not apply to ebpf-proxy.
pub(crate) const NOT_APPLICABLE: &[&str] = &[
    "mode",
    "bindAddress",
    "bindAddressHardFail",
    "configHardFail",
    "configSyncPeriod",
    "conntrack",
    "detectLocal",
    "detectLocalMode",
    "enableProfiling",
    "featureGates",
    "linux",
    "nodeIPOverride",
    "oomScoreAdj",
    "portRange",
    "showHiddenMetricsForVersion",
    "udpIdleTimeout",
    "winkernel",
    "windows",
];

/// The file: the settings it gives (their layer under the flags, see
/// `Settings::over`), and the fields it holds that are not used.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FileConfig {
    /// What the file sets; a field it leaves out is the field's default.
    pub(crate) settings: Settings,
    /// Fields seen that are kube-proxy's but mean nothing here.
    pub(crate) ignored: Vec<String>,
    /// Fields nobody knows.
    pub unknown: Vec<String>,
}

/// The file as written: ebpf-proxy's fields and a `KubeProxyConfiguration`'s
/// (`parse` turns it into `Settings`, naming the field of a bad value by its
/// path here).
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
    #[serde(rename = "socketLB")]
    socket_lb: Option<String>,
    nodeport_mode: Option<String>,
    dsr_dispatch: Option<String>,
    #[serde(default)]
    pod_devices: Vec<String>,
    #[serde(rename = "clusterCIDR")]
    cluster_cidr: Option<String>,
    maglev_table_size: Option<usize>,
    ct_map_size: Option<u32>,
    max_service_series: Option<usize>,
    api_server_endpoint: Option<String>,
    lb_algorithm: Option<String>,
    node_port_range: Option<String>,
    // kube-proxy's
    healthz_bind_address: Option<String>,
    metrics_bind_address: Option<String>,
    // kube-proxy's v1alpha2: CIDRs and a port
    // kubeadm writes `null` for an empty list
    healthz_bind_addresses: Option<Vec<String>>,
    healthz_bind_port: Option<u16>,
    // kubeadm writes `null` for an empty list
    metrics_bind_addresses: Option<Vec<String>>,
    metrics_bind_port: Option<u16>,
    min_sync_period: Option<String>,
    sync_period: Option<String>,
    iptables: Option<ModeConfig>,
    nftables: Option<ModeConfig>,
    ipvs: Option<ModeConfig>,
    logging: Option<Logging>,
    // kubeadm writes `null` for an empty list
    node_port_addresses: Option<Vec<String>>,
    hostname_override: Option<String>,
    client_connection: Option<ClientConnection>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClientConnection {
    kubeconfig: Option<PathBuf>,
    qps: Option<f64>,
    burst: Option<i64>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

/// kube-proxy's `iptables`, `nftables` and `ipvs` sections: the sync
/// periods of the mode in use apply (v1alpha1), and `localhostNodePorts`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ModeConfig {
    min_sync_period: Option<String>,
    sync_period: Option<String>,
    localhost_node_ports: Option<bool>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

/// component-base's `LoggingConfiguration`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Logging {
    format: Option<String>,
    verbosity: Option<u32>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

pub(crate) fn load(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
    parse(&text).map_err(|(field, message)| ConfigError::Invalid { path: path.display().to_string(), field, message })
}

/// `check`'s error as the field's.
fn field(name: &str) -> impl FnOnce(String) -> (String, String) + '_ {
    move |message| (name.to_owned(), message)
}

/// kube-proxy's `iptables.localhostNodePorts`: only its default (true).
fn localhost_node_ports(iptables: Option<&ModeConfig>) -> Result<(), (String, String)> {
    if let Some(false) = iptables.and_then(|i| i.localhost_node_ports) {
        return Err((
            "iptables.localhostNodePorts".into(),
            "false is not supported: ebpf-proxy serves NodePorts on 127.0.0.1 whenever nodePortAddresses \
             admits it (unset, or a CIDR covering 127.0.0.0/8); remove the field, and to keep NodePorts off \
             127.0.0.1 set nodePortAddresses to CIDRs that do not cover it (or `primary`)"
                .into(),
        ));
    }
    Ok(())
}

/// Field `name`'s `value`, one of its flag's values (exactly as written).
fn one_of<T: clap::ValueEnum>(name: &str, value: Option<String>) -> Result<Option<T>, (String, String)> {
    let Some(value) = value else { return Ok(None) };
    T::from_str(&value, false).map(Some).map_err(|_| {
        let known: Vec<String> = T::value_variants()
            .iter()
            .filter_map(clap::ValueEnum::to_possible_value)
            .map(|p| format!("{:?}", p.get_name()))
            .collect();
        (name.to_owned(), format!("{value:?}: expected {}", known.join(" or ")))
    })
}

/// A field's value through its check, if given.
fn checked<V, T>(
    name: &str,
    value: Option<V>,
    check: impl FnOnce(V) -> Result<T, String>,
) -> Result<Option<T>, (String, String)> {
    value.map(check).transpose().map_err(field(name))
}

/// `socketLB` and `podDevices`: which of the pods' traffic is translated
/// at the socket, and where the rest is translated per packet;
/// `clusterCIDR`: whether traffic routed to the node for a ClusterIP is.
fn pod_path(
    s: &mut Settings,
    socket_lb: Option<&str>,
    pod_devices: Vec<String>,
    cluster_cidr: Option<&str>,
) -> Result<(), (String, String)> {
    use clap::ValueEnum as _;
    for cidr in cluster_cidr.unwrap_or_default().split(',').map(str::trim).filter(|c| !c.is_empty()) {
        s.cluster_cidr.push(check::cidr(cidr).map_err(field("clusterCIDR"))?);
    }
    check::cluster_cidrs(&s.cluster_cidr).map_err(field("clusterCIDR"))?;
    if let Some(mode) = socket_lb {
        s.socket_lb = Some(
            SocketLbMode::from_str(mode, false)
                .map_err(|_| ("socketLB".to_owned(), format!("{mode:?}: expected \"all\" or \"host-namespace\"")))?,
        );
    }
    s.pod_devices = pod_devices;
    Ok(())
}

/// `lbAlgorithm`: one of `--lb-algorithm`'s values.
fn lb_algorithm(value: &str) -> Result<LbAlgorithm, (String, String)> {
    use clap::ValueEnum as _;
    LbAlgorithm::from_str(value, false).map_err(|_| {
        let known: Vec<&str> = crate::model::LbAlgorithm::ALL.iter().map(|a| a.as_str()).collect();
        ("lbAlgorithm".to_owned(), format!("{value:?}: expected one of {}", known.join(", ")))
    })
}

/// Parses the file; an error is (field, message).
pub fn parse(text: &str) -> Result<FileConfig, (String, String)> {
    let raw: Raw = serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(text))
        .map_err(|e| (e.path().to_string(), e.into_inner().to_string()))?;
    if let Some(kind) = raw.kind.as_deref()
        && kind != "KubeProxyConfiguration"
    {
        return Err(("kind".into(), format!("{kind:?}: expected KubeProxyConfiguration or no kind")));
    }
    if let Some(v) = raw.api_version.as_deref()
        && !KUBE_PROXY_API_VERSIONS.contains(&v)
    {
        return Err(("apiVersion".into(), format!("{v:?}: expected one of {KUBE_PROXY_API_VERSIONS:?}")));
    }
    let map_size = |name: &str, n: Option<u32>| n.map(|n| check::map_size(n.into())).transpose().map_err(field(name));
    // An empty string is unset, as kube-proxy reads it.
    let given = |text: Option<String>| text.filter(|t| !t.is_empty());
    let mut s = Settings {
        services_file: raw.services_file,
        kubeconfig: raw.kubeconfig.or(raw.client_connection.as_ref().and_then(|c| c.kubeconfig.clone())),
        cgroup: raw.cgroup,
        bpffs_dir: raw.bpffs_dir,
        node_name: given(raw.node_name.or(raw.hostname_override)),
        socket_netns: raw.socket_netns,
        bpf_log: raw.bpf_log.unwrap_or_default(),
        devices: raw.devices,
        max_service_series: raw.max_service_series,
        api_server_endpoint: given(raw.api_server_endpoint)
            .map(|e| check::endpoint(&e))
            .transpose()
            .map_err(field("apiServerEndpoint"))?,
        services_map_size: map_size("servicesMapSize", raw.services_map_size)?,
        backends_map_size: map_size("backendsMapSize", raw.backends_map_size)?,
        ct_map_size: map_size("ctMapSize", raw.ct_map_size)?,
        health_timeout: checked("healthTimeoutSeconds", raw.health_timeout_seconds, check::health_timeout)?,
        node_port_range: checked("nodePortRange", raw.node_port_range.as_deref(), check::node_port_range)?,
        ..Settings::default()
    };
    pod_path(&mut s, raw.socket_lb.as_deref(), raw.pod_devices, raw.cluster_cidr.as_deref())?;
    (s.nodeport_mode, s.dsr_dispatch) =
        (one_of("nodeportMode", raw.nodeport_mode)?, one_of("dsrDispatch", raw.dsr_dispatch)?);
    s.lb_algorithm = raw.lb_algorithm.as_deref().map(lb_algorithm).transpose()?;
    s.maglev_table_size =
        raw.maglev_table_size.map(check::maglev_table_size).transpose().map_err(field("maglevTableSize"))?;
    for (i, ip) in raw.node_ips.iter().enumerate() {
        s.node_ip.push(check::ip(ip).map_err(|e| (format!("nodeIPs[{i}]"), e))?);
    }
    if let Some(values) = &raw.node_port_addresses {
        s.nodeport_addresses = Some(
            NodePortAddresses::parse(values).map_err(|(i, e)| (format!("nodePortAddresses[{i}]"), e.to_string()))?,
        );
    }
    s.healthz_bind_address = bind_address(
        ("healthzBindAddress", raw.healthz_bind_address.as_deref()),
        ("healthzBindAddresses", raw.healthz_bind_addresses.as_deref().unwrap_or_default(), raw.healthz_bind_port),
        check::healthz_address,
        default_healthz().port(),
    )?;
    s.metrics_bind_address = bind_address(
        ("metricsBindAddress", raw.metrics_bind_address.as_deref()),
        ("metricsBindAddresses", raw.metrics_bind_addresses.as_deref().unwrap_or_default(), raw.metrics_bind_port),
        check::metrics_address,
        default_metrics().port(),
    )?;
    let mode = raw.rest.get("mode").and_then(Value::as_str);
    sync_periods(
        &mut s,
        mode,
        [raw.iptables.as_ref(), raw.nftables.as_ref(), raw.ipvs.as_ref()],
        raw.min_sync_period.as_deref(),
        raw.sync_period.as_deref(),
    )?;
    localhost_node_ports(raw.iptables.as_ref())?;
    let mut cfg = FileConfig { settings: s, ..FileConfig::default() };
    for (name, section) in [("iptables", &raw.iptables), ("nftables", &raw.nftables), ("ipvs", &raw.ipvs)] {
        if let Some(section) = section {
            cfg.ignored.extend(section.rest.keys().map(|k| format!("{name}.{k}")));
        }
    }
    if let Some(logging) = raw.logging {
        apply_logging(&mut cfg, &logging)?;
    }
    for key in raw.rest.keys() {
        if NOT_APPLICABLE.contains(&key.as_str()) {
            cfg.ignored.push(key.clone());
        } else {
            cfg.unknown.push(key.clone());
        }
    }
    if let Some(c) = raw.client_connection {
        client_rate(c.qps, c.burst)?;
        cfg.ignored.extend(c.rest.keys().map(|k| format!("clientConnection.{k}")));
    }
    Ok(cfg)
}

/// An address to serve on: v1alpha2's CIDRs and port (`bind_cidrs`) if
/// given, else v1alpha1's `IP:PORT` or `IP` (empty: unset).
fn bind_address(
    (name, address): (&str, Option<&str>),
    (cidrs_name, cidrs, port): (&str, &[String], Option<u16>),
    check: fn(&str) -> Result<SocketAddr, String>,
    default_port: u16,
) -> Result<Option<SocketAddr>, (String, String)> {
    let address = address.filter(|a| !a.is_empty()).map(check).transpose().map_err(field(name))?;
    Ok(bind_cidrs(cidrs_name, cidrs, port, default_port)?.or(address))
}

/// component-base's `logging`: the format and verbosity apply.
fn apply_logging(cfg: &mut FileConfig, logging: &Logging) -> Result<(), (String, String)> {
    cfg.settings.log_format = match logging.format.as_deref() {
        None | Some("") => None,
        Some("text") => Some(LogFormat::Text),
        Some("json") => Some(LogFormat::Json),
        Some(other) => {
            return Err(("logging.format".into(), format!("{other:?}: ebpf-proxy logs as \"text\" or \"json\"")));
        }
    };
    cfg.settings.log_verbosity = logging.verbosity;
    cfg.ignored.extend(logging.rest.keys().map(|k| format!("logging.{k}")));
    Ok(())
}

/// `clientConnection.qps`/`burst`: the agent has no client-side rate
/// limiter; it makes 7 requests at start (3 lists, 3 watches, 1 event) and
/// then one per watch reconnect, each watch backing off from 0.8 s
/// (kube-runtime's default backoff): at most 4 a second. A limit it always
/// stays under (qps >= 4, burst >= 7; 0 means kube-proxy's default, 5/10)
/// holds as it is; a lower one cannot be honoured and is refused.
pub(crate) const MIN_QPS: f64 = 4.0;
pub(crate) const MIN_BURST: i64 = 7;

fn client_rate(qps: Option<f64>, burst: Option<i64>) -> Result<(), (String, String)> {
    let why = |what: &str| {
        format!(
            "ebpf-proxy has no client-side rate limiter and makes up to {MIN_BURST} requests at once and {MIN_QPS} \
             a second; {what} lower than that cannot be honoured: remove the field, set 0, or raise it"
        )
    };
    if qps.is_some_and(|q| q != 0.0 && q < MIN_QPS) {
        return Err(("clientConnection.qps".into(), why(&format!("a qps of {}", qps.unwrap_or_default()))));
    }
    if burst.is_some_and(|b| b != 0 && b < MIN_BURST) {
        return Err(("clientConnection.burst".into(), why(&format!("a burst of {}", burst.unwrap_or_default()))));
    }
    Ok(())
}

/// kube-proxy's sync periods: v1alpha2's top-level fields, else (v1alpha1)
/// those of the mode's section (`mode` empty or `iptables`: `iptables`). A
/// zero duration is unset, as kube-proxy's defaulting reads it.
fn sync_periods(
    settings: &mut Settings,
    mode: Option<&str>,
    [iptables, nftables, ipvs]: [Option<&ModeConfig>; 3],
    min_sync: Option<&str>,
    sync: Option<&str>,
) -> Result<(), (String, String)> {
    let (name, section) = match mode {
        Some("nftables") => ("nftables", nftables),
        Some("ipvs") => ("ipvs", ipvs),
        _ => ("iptables", iptables),
    };
    let field = |top: Option<&str>, in_mode: Option<&str>, field: &str| -> Result<Option<Duration>, (String, String)> {
        let (path, value) = match (top, in_mode) {
            (Some(v), _) => (field.to_owned(), v),
            (None, Some(v)) => (format!("{name}.{field}"), v),
            _ => return Ok(None),
        };
        let d = check::duration(value).map_err(|e| (path, e))?;
        Ok(Some(d).filter(|d| !d.is_zero()))
    };
    settings.min_sync_period = field(min_sync, section.and_then(|s| s.min_sync_period.as_deref()), "minSyncPeriod")?;
    // One timer: kube-proxy's syncPeriod is the drift audit's interval.
    settings.audit_interval = field(sync, section.and_then(|s| s.sync_period.as_deref()), "syncPeriod")?;
    Ok(())
}

/// v1alpha2's `healthzBindAddresses`/`metricsBindAddresses` (CIDRs) and
/// port, as one address to bind: `0.0.0.0/0` all IPv4, `::/0` all (IPv6
/// and IPv4), a single address (`/32`, `/128`) or the loopback range that
/// one. Ranges to pick node addresses from are refused: name one.
fn bind_cidrs(
    field: &str,
    cidrs: &[String],
    port: Option<u16>,
    default_port: u16,
) -> Result<Option<SocketAddr>, (String, String)> {
    let port = port.filter(|p| *p != 0).unwrap_or(default_port);
    let mut nets = Vec::new();
    for (i, c) in cidrs.iter().enumerate() {
        nets.push(c.parse::<IpNet>().map_err(|_| (format!("{field}[{i}]"), format!("{c:?} is not a CIDR")))?);
    }
    let ip = match nets.as_slice() {
        [] => return Ok(None),
        [net] if net.prefix_len() == 0 => net.addr(),
        [a, b] if a.prefix_len() == 0 && b.prefix_len() == 0 && a.addr().is_ipv4() != b.addr().is_ipv4() => {
            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
        }
        [net] if net.prefix_len() == net.max_prefix_len() => net.addr(),
        [net] if net.contains(&IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)) && net.addr().is_loopback() => {
            IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        }
        [net] if net.addr() == IpAddr::V6(std::net::Ipv6Addr::LOCALHOST) => net.addr(),
        _ => {
            return Err((
                field.to_owned(),
                format!(
                    "{cidrs:?}: ebpf-proxy binds one address; give 0.0.0.0/0, ::/0, both, or a single address \
                     (/32 or /128)"
                ),
            ));
        }
    };
    Ok(Some(SocketAddr::new(ip, port)))
}

impl FileConfig {
    /// Logs what the file holds that is not used.
    pub(crate) fn log_unused(&self, path: &Path) {
        if !self.ignored.is_empty() {
            tracing::info!(config = %path.display(), fields = ?self.ignored, "kube-proxy settings that do not apply to ebpf-proxy are ignored");
        }
        if !self.unknown.is_empty() {
            tracing::warn!(config = %path.display(), fields = ?self.unknown, "unknown fields in the config file are ignored; check their spelling");
        }
    }
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
        assert_eq!(cfg.settings.kubeconfig.as_deref(), Some(Path::new("/var/lib/kube-proxy/kubeconfig.conf")));
        assert_eq!(cfg.settings.healthz_bind_address, Some("0.0.0.0:10256".parse().unwrap()));
        assert_eq!(cfg.settings.metrics_bind_address, Some("127.0.0.1:10249".parse().unwrap()));
        assert_eq!(
            cfg.settings.nodeport_addresses,
            Some(NodePortAddresses::Cidrs(vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]))
        );
        assert_eq!(cfg.settings.node_name, None, "an empty hostnameOverride means the default");
        assert!(cfg.unknown.is_empty(), "{:?}", cfg.unknown);
        assert!(
            cfg.ignored.contains(&"iptables.masqueradeBit".to_owned()) && cfg.ignored.contains(&"conntrack".to_owned())
        );
        assert_eq!(
            cfg.settings.audit_interval,
            Some(Duration::from_secs(30)),
            "iptables.syncPeriod, the mode's (\"\": iptables)"
        );
    }

    #[test]
    fn unknown_fields_are_named_and_invalid_ones_fail() {
        let cfg = parse("healthzBindAdress: 1.2.3.4\nnodeName: n1\n").unwrap();
        assert_eq!(cfg.unknown, vec!["healthzBindAdress".to_owned()]);
        assert_eq!(cfg.settings.node_name.as_deref(), Some("n1"));
        assert_eq!(parse("metricsBindAddress: nowhere\n").unwrap_err().0, "metricsBindAddress");
        assert_eq!(parse("nodePortAddresses: [10.0.0.0/33]\n").unwrap_err().0, "nodePortAddresses[0]");
        assert_eq!(parse("servicesMapSize: lots\n").unwrap_err().0, "servicesMapSize");
        let out_of_range = parse("ctMapSize: 0\n").unwrap_err();
        assert_eq!(out_of_range, ("ctMapSize".into(), "0 is not in 1..=16777216".into()));
        assert_eq!(parse("backendsMapSize: 16777217\n").unwrap_err().0, "backendsMapSize");
        assert_eq!(parse("healthTimeoutSeconds: 0\n").unwrap_err().0, "healthTimeoutSeconds");
        assert_eq!(parse("kind: Deployment\n").unwrap_err().0, "kind");
        assert_eq!(
            parse("nodeportMode: tunnel\n").unwrap_err(),
            ("nodeportMode".into(), r#""tunnel": expected "snat" or "dsr" or "hybrid""#.into())
        );
        assert_eq!(parse("dsrDispatch: geneve\n").unwrap_err().0, "dsrDispatch");
        assert_eq!(parse("maglevTableSize: 1000\n").unwrap_err().0, "maglevTableSize");
        assert_eq!(parse("maglevTableSize: 1021\ndevices: [eth0]\n").unwrap().settings.maglev_table_size, Some(1021));
        assert_eq!(
            parse("lbAlgorithm: least-connections\n")
                .unwrap()
                .settings
                .lb_algorithm
                .map(crate::model::LbAlgorithm::from),
            Some(crate::model::LbAlgorithm::LeastConnections)
        );
        assert_eq!(parse("nodeName: n1\n").unwrap().settings.lb_algorithm, None);
        assert_eq!(parse("lbAlgorithm: fastest\n").unwrap_err().0, "lbAlgorithm");
        assert_eq!(
            parse("nodePortRange: 20000-22767\n").unwrap().settings.node_port_range.map(|r| r.to_string()).as_deref(),
            Some("20000-22767")
        );
        assert_eq!(
            parse("nodePortRange: none\n").unwrap().settings.node_port_range,
            Some(crate::node::reserved_ports::NodePortRange::None)
        );
        assert_eq!(parse("nodePortRange: 30000\n").unwrap_err().0, "nodePortRange");
    }

    #[test]
    fn a_bare_ip_takes_the_default_port() {
        let cfg = parse("healthzBindAddress: 127.0.0.1\n").unwrap();
        assert_eq!(cfg.settings.healthz_bind_address, Some("127.0.0.1:10256".parse().unwrap()));
    }

    /// kubeadm's `kube-proxy` ConfigMap, key `config.conf`, as kubeadm
    /// (v1.31) writes it: every field present, zero values for defaults.
    pub(crate) const KUBEADM_V1ALPHA1: &str = include_str!("../tests/fixtures/kubeadm/config.conf");

    #[test]
    fn kubeadms_config_conf_is_understood() {
        let cfg = parse(KUBEADM_V1ALPHA1).unwrap();
        assert_eq!(cfg.settings.kubeconfig.as_deref(), Some(Path::new("/var/lib/kube-proxy/kubeconfig.conf")));
        assert_eq!(cfg.settings.healthz_bind_address, None, "empty: the default");
        assert_eq!(cfg.settings.node_name, None);
        // kube-proxy's defaulting reads 0s as unset.
        assert_eq!((cfg.settings.min_sync_period, cfg.settings.audit_interval), (None, None));
        assert_eq!(cfg.settings.log_format, None);
        assert_eq!(cfg.settings.log_verbosity, Some(0));
        assert!(cfg.unknown.is_empty(), "{:?}", cfg.unknown);
        for noted in ["iptables.masqueradeBit", "conntrack", "mode", "logging.flushFrequency", "winkernel"] {
            assert!(cfg.ignored.iter().any(|i| i == noted), "{noted} in {:?}", cfg.ignored);
        }
    }

    #[test]
    fn v1alpha2_is_understood() {
        let text = KUBEADM_V1ALPHA1
            .replace("kubeproxy.config.k8s.io/v1alpha1", "kubeproxy.config.k8s.io/v1alpha2")
            .replace("healthzBindAddress: \"\"", "healthzBindAddresses: [0.0.0.0/0, \"::/0\"]\nhealthzBindPort: 10256")
            .replace("metricsBindAddress: \"\"", "metricsBindAddresses: [127.0.0.1/32]\nmetricsBindPort: 10249")
            .replace("mode: \"\"", "mode: \"\"\nminSyncPeriod: 1s\nsyncPeriod: 1m0s")
            .replace("logging:\n", "logging:\n  format: json\n");
        let cfg = parse(&text).unwrap();
        assert_eq!(cfg.settings.healthz_bind_address, Some("[::]:10256".parse().unwrap()));
        assert_eq!(cfg.settings.metrics_bind_address, Some("127.0.0.1:10249".parse().unwrap()));
        assert_eq!(cfg.settings.min_sync_period, Some(Duration::from_secs(1)));
        assert_eq!(cfg.settings.audit_interval, Some(Duration::from_mins(1)));
        assert_eq!(cfg.settings.log_format, Some(LogFormat::Json));
        let ranged = text.replace("[127.0.0.1/32]", "[10.0.0.0/8]");
        assert_eq!(parse(&ranged).unwrap_err().0, "metricsBindAddresses");
    }

    /// v1alpha1 keeps the sync periods in the section of the proxy mode.
    #[test]
    fn the_sync_periods_of_the_mode_apply() {
        let text = "iptables: {minSyncPeriod: 1s, syncPeriod: 30s}\nnftables: {minSyncPeriod: 250ms}\n";
        let cfg = parse(text).unwrap();
        assert_eq!(
            (cfg.settings.min_sync_period, cfg.settings.audit_interval),
            (Some(Duration::from_secs(1)), Some(Duration::from_secs(30)))
        );
        let cfg = parse(&format!("mode: nftables\n{text}")).unwrap();
        assert_eq!(
            (cfg.settings.min_sync_period, cfg.settings.audit_interval),
            (Some(Duration::from_millis(250)), None)
        );
        assert_eq!(parse("iptables: {syncPeriod: soon}\n").unwrap_err().0, "iptables.syncPeriod");
    }

    /// Fields that would change behaviour and cannot be honoured stop
    /// startup with the field named (kube-proxy itself refuses invalid
    /// configurations the same way).
    #[test]
    fn what_cannot_be_honoured_is_refused() {
        assert_eq!(parse("iptables: {localhostNodePorts: false}\n").unwrap_err().0, "iptables.localhostNodePorts");
        assert!(parse("iptables: {localhostNodePorts: true}\n").is_ok());
        assert_eq!(parse("logging: {format: klog}\n").unwrap_err().0, "logging.format");
        assert_eq!(parse("clientConnection: {qps: 1}\n").unwrap_err().0, "clientConnection.qps");
        assert_eq!(parse("clientConnection: {burst: 2}\n").unwrap_err().0, "clientConnection.burst");
        assert!(parse("clientConnection: {qps: 5, burst: 10}\n").is_ok(), "kube-proxy's defaults hold");
        assert_eq!(parse("apiServerEndpoint: 10.0.0.1\n").unwrap_err().0, "apiServerEndpoint");
        assert_eq!(
            parse("apiServerEndpoint: 10.0.0.1:6443\n").unwrap().settings.api_server_endpoint.as_deref(),
            Some("10.0.0.1:6443")
        );
    }

    #[test]
    fn node_port_addresses_take_primary_alone() {
        assert_eq!(
            parse("nodePortAddresses: [primary]\n").unwrap().settings.nodeport_addresses,
            Some(NodePortAddresses::Primary)
        );
        assert_eq!(parse("nodePortAddresses: []\n").unwrap().settings.nodeport_addresses, Some(NodePortAddresses::All));
        assert_eq!(parse("{}\n").unwrap().settings.nodeport_addresses, None);
        // kube-proxy's validation refuses `primary` among CIDRs.
        let (field, message) = parse("nodePortAddresses: [10.0.0.0/8, primary]\n").unwrap_err();
        assert_eq!(field, "nodePortAddresses[1]");
        assert!(message.contains("primary"), "{message}");
    }
}
