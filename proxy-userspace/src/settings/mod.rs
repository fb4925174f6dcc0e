//! The agent's settings (`ebpf-proxy run`): one struct that the flags,
//! the environment and the config file fill. Each field has its flag and
//! help here, one check in `check` (the flag's parser and the file's call
//! it), and its default applied once in `resolve`, from the constant its
//! help is written from.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Args;

use crate::{
    args::LogFormat,
    observe::metrics::DEFAULT_MAX_SERVICE_SERIES,
    paths::{BPFFS_ROOT, DEFAULT_EXPLAIN_SOCKET, DEFAULT_HEALTHZ, DEFAULT_METRICS, DEFAULT_PIN_DIR},
    reconcile::{maglev, sizing::DEFAULT_BOUNDS},
};

pub(crate) mod check;
mod modes;
mod resolve;

use check::MAX_MAP_SIZE;

pub(crate) use modes::{
    DsrDispatch, LbAlgorithm, NodePortAcceleration, NodePortMode, OutsideHandoverMode, SocketLbMode,
};

/// How long a change may wait unapplied before /healthz answers 503, unless
/// set.
pub(crate) const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_mins(1);

/// Where /healthz and /livez are served unless set; its port is the one an
/// address given without one takes.
pub(crate) fn default_healthz() -> SocketAddr {
    DEFAULT_HEALTHZ.parse().expect("DEFAULT_HEALTHZ is IP:PORT")
}

/// Where /metrics and /proxyMode are served unless set; its port is the one
/// an address given without one takes.
pub(crate) fn default_metrics() -> SocketAddr {
    DEFAULT_METRICS.parse().expect("DEFAULT_METRICS is IP:PORT")
}

/// The agent's settings, one field each: `ebpf-proxy run`'s flags (and
/// their environment variables) fill one, the config file another
/// (`crate::config`), and `over` lays the first over the second. A field
/// unset in both is its default, applied where the agent's parts take
/// them (`agent_config`, `load_options`).
#[derive(Debug, Default, Clone, PartialEq, Args)]
pub struct Settings {
    /// Configuration file: ebpf-proxy's fields (camelCase, as the flags
    /// here) and/or a kube-proxy KubeProxyConfiguration, whose applicable
    /// fields are used (healthzBindAddress, metricsBindAddress,
    /// nodePortAddresses, hostnameOverride, clientConnection.kubeconfig).
    /// Flags override it.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Read Services and EndpointSlices from this file instead of the
    /// Kubernetes API: a YAML stream of v1 Service and discovery.k8s.io/v1
    /// EndpointSlice objects (as `kubectl get -o yaml` prints them),
    /// re-read when it changes.
    #[arg(long, value_name = "FILE", conflicts_with = "kubeconfig")]
    pub(crate) services_file: Option<PathBuf>,
    /// Kubeconfig for the API server. Default: in-cluster service account,
    /// else KUBECONFIG, else ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The API server to dial, instead of the one the in-cluster config
    /// (the `kubernetes` Service's ClusterIP, which nothing translates
    /// before this agent has synced) or the kubeconfig names; the service
    /// account token and CA are kept. The control plane's real endpoint,
    /// e.g. 192.168.0.10:6443.
    #[arg(long, value_name = "HOST:PORT", value_parser = check::endpoint)]
    pub(crate) api_server_endpoint: Option<String>,
    /// What Services and EndpointSlices are asked of the API server in
    /// (kube-proxy's flag): protobuf, as kube-proxy and client-go ask
    /// (JSON is still read from a server that answers with it), or JSON.
    #[arg(
        long,
        value_name = "TYPE",
        default_value = "application/vnd.kubernetes.protobuf",
        value_parser = check::content_type
    )]
    pub(crate) kube_api_content_type: crate::source::listwatch::ContentType,
    /// cgroup v2 directory to attach the socket programs to (they act on
    /// every process in it and below). Default: the root of the cgroup2
    /// hierarchy, mounted at /run/ebpf-proxy/cgroup2 if none is.
    #[arg(long, value_name = "DIR")]
    pub(crate) cgroup: Option<PathBuf>,
    #[arg(long, value_name = "DIR", help = format!(
        "Directory on a bpffs where the maps and links are pinned (bpffs is mounted at {BPFFS_ROOT} when this \
         lies below it and none is mounted). Default: {DEFAULT_PIN_DIR}"
    ))]
    pub(crate) bpffs_dir: Option<PathBuf>,
    /// Name of this node, for internalTrafficPolicy: Local, its zone and its
    /// addresses. Default: the NODE_NAME environment variable, else the
    /// hostname.
    #[arg(long, env = "NODE_NAME")]
    pub(crate) node_name: Option<String>,
    /// An address of this node: NodePorts are served on it (as on the
    /// node's local addresses, see --nodeport-addresses; with `primary`,
    /// the first of each family); with --external-ips-local-only, an
    /// externalIP is served to clients on the node only if it is one of
    /// them. Repeatable. Default: the InternalIP and ExternalIP addresses
    /// of this node's Node object.
    #[arg(long, value_name = "IP", value_parser = check::ip)]
    pub(crate) node_ip: Vec<std::net::IpAddr>,
    /// Which of the node's local addresses serve NodePorts (kube-proxy's
    /// --nodeport-addresses, overrides the config file's
    /// nodePortAddresses): comma-separated CIDRs (the local addresses
    /// inside them; a family no CIDR names is not narrowed; 127.0.0.1 only
    /// if a CIDR covers it), or `primary` (the node's first IP of each
    /// family, no 127.0.0.1). Default: every local address of every device
    /// and 127.0.0.1, followed as addresses come and go.
    #[arg(long, value_name = "CIDRS|primary", value_parser = check::nodeport_addresses)]
    pub(crate) nodeport_addresses: Option<crate::node::nodeport_addresses::NodePortAddresses>,
    /// When a backend leaves a UDP service, sockets still connected to it
    /// through the service are destroyed (their owners get an error and
    /// reconnect to a live backend): in the agent's network namespace, and
    /// in these (a namespace file, or a directory of them such as
    /// /var/run/netns). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub(crate) socket_netns: Vec<PathBuf>,
    #[arg(long, value_name = "ADDR:PORT", value_parser = check::healthz_address, help = format!(
        "Where to serve /healthz and /livez. Default: {DEFAULT_HEALTHZ} (kube-proxy's)"
    ))]
    pub(crate) healthz_bind_address: Option<std::net::SocketAddr>,
    #[arg(long, value_name = "ADDR:PORT", value_parser = check::metrics_address, help = format!(
        "Where to serve /metrics and /proxyMode. Default: {DEFAULT_METRICS} (kube-proxy's)"
    ))]
    pub(crate) metrics_bind_address: Option<std::net::SocketAddr>,
    #[arg(long, value_name = "SECONDS", value_parser = check::parse_health_timeout, help = format!(
        "Seconds a change may wait unapplied before /healthz answers 503 (at least 1). Default: {}",
        DEFAULT_HEALTH_TIMEOUT.as_secs()
    ))]
    pub(crate) health_timeout: Option<u64>,
    /// Log every translation the eBPF programs make, at debug level under
    /// the target proxy_ebpf (RUST_LOG=info,proxy_ebpf=debug shows them).
    /// Costs time on every connect: for troubleshooting only.
    #[arg(long)]
    pub(crate) bpf_log: bool,
    #[arg(long, value_name = "N", value_parser = check::parse_map_size, help = format!(
        "Most entries of the services map (one per frontend plus one per four backend slots), 1 to {MAX_MAP_SIZE}. \
         The map is sized from the table with room to spare and grows as needed, up to this; past it the services \
         that do not fit are not written, /healthz turns 503 after --health-timeout, and ebpf_proxy_map_full_total \
         counts the refused writes. Default: {}",
        DEFAULT_BOUNDS.services
    ))]
    pub(crate) services_map_size: Option<u32>,
    #[arg(long, value_name = "N", value_parser = check::parse_map_size, help = format!(
        "Most entries of the backends map (an array indexed by backend id from 1: it holds one distinct backend \
         fewer than its size), 1 to {MAX_MAP_SIZE}, sized and grown as the services map is. Default: {}",
        DEFAULT_BOUNDS.backends
    ))]
    pub(crate) backends_map_size: Option<u32>,
    /// A network device that traffic from outside arrives on: the TC
    /// programs serve NodePorts, LoadBalancer IPs and externalIPs there.
    /// Repeatable. Default: the devices holding this node's addresses and
    /// the default route (recomputed when the node's addresses change).
    #[arg(long = "devices", value_name = "DEV", value_delimiter = ',')]
    pub(crate) devices: Vec<String>,
    #[arg(long, value_name = "N", value_parser = check::parse_maglev_table_size, help = format!(
        "Entries of each Maglev table (traffic from outside picks backends with it): a prime from {} to {}. \
         Changing it gives the agent a fresh set of maps (connection tracking starts afresh). Default: {}",
        maglev::SIZES[0],
        maglev::SIZES[maglev::SIZES.len() - 1],
        maglev::DEFAULT_SIZE
    ))]
    pub(crate) maglev_table_size: Option<usize>,
    #[arg(long, value_name = "N", value_parser = check::parse_map_size, help = format!(
        "Entries of the connection-tracking map of the flows translated per packet (two per flow, LRU, allocated \
         at start; a restart with another size copies the flows into a new map), 1 to {MAX_MAP_SIZE}. Default: \
         from the node's memory, as Cilium sizes its maps: 0.25% of it (or of the agent's cgroup memory limit, if \
         lower) at 160 bytes an entry, down to a power of two from {} to {} (262,144 on a 24 GiB node), then \
         doubled (up to {}, its flows carried) each time it is nearly full; a size set here is kept as it is",
        crate::node::memory::MIN_ENTRIES,
        crate::node::memory::MAX_ENTRIES,
        crate::node::memory::MAX_ENTRIES
    ))]
    pub(crate) ct_map_size: Option<u32>,
    /// XDP in front of the TC programs on the --devices, for traffic from
    /// outside (NodePorts, LoadBalancer IPs, externalIPs): the same
    /// translation before the kernel allocates a socket buffer; what XDP
    /// cannot finish (fragments, ICMP errors, rejections, a next hop whose
    /// link-layer address is unknown) passes to the TC programs. `native`:
    /// a device whose driver has no native XDP is an error (logged; TC
    /// alone serves it); `best-effort`: such a device is served by TC
    /// alone, with a warning, and so is a veth, where XDP is slower than TC.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = NodePortAcceleration::Disabled)]
    pub(crate) nodeport_acceleration: NodePortAcceleration,
    /// Sharing traffic from outside with a kube-proxy still running on the
    /// node (for a live takeover; docs/design.md, "Taking over from
    /// kube-proxy"). `defer`: the TC/XDP programs leave every packet to a
    /// NodePort, LoadBalancer IP or externalIP to the kernel (kube-proxy's
    /// rules serve it) and remember each flow they see as netfilter's (and
    /// those conntrack holds, read once they are attached);
    /// `handover`: new flows are the programs', netfilter's flows (those
    /// remembered, and TCP packets without SYN of connections the programs
    /// do not know) go on through the kernel's conntrack; `off`: normal
    /// service. Set at every start; a takeover sequence changes it while
    /// running.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = OutsideHandoverMode::Off)]
    pub(crate) outside_handover: OutsideHandoverMode,
    /// With --outside-handover=handover (or the handover after
    /// --take-over-from-kube-proxy): after this many seconds the
    /// programs serve every flow again (as `off`; flows remembered as
    /// netfilter's still go to the kernel until they end). 0: until the
    /// mode is changed or the agent restarts.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    pub(crate) outside_handover_seconds: u64,
    /// How traffic from outside (externalTrafficPolicy: Cluster) reaches a
    /// backend on another node. `snat`: the source becomes this node's
    /// address, replies come back through this node. `dsr`: direct server
    /// return: the client's address is kept, the frontend travels in an
    /// IPv4 option / IPv6 Destination Options header (8 / 24 more bytes on
    /// each TCP SYN and UDP datagram), and the backend's node answers the
    /// client itself (every node must run the agent, in any mode, forward
    /// IP, and route to the clients). `hybrid`: DSR for TCP, SNAT for UDP.
    /// A service's annotation ebpf-proxy.io/nodeport-mode (snat, dsr)
    /// overrides it. Default: the config file's nodeportMode, else snat.
    #[arg(long, value_enum, value_name = "MODE")]
    pub(crate) nodeport_mode: Option<NodePortMode>,
    /// How a DSR flow's packets reach the backend's node. `option`: the
    /// frontend in an IP option on the packets that open a flow (8 / 24
    /// bytes). `ipip`: every packet inside an outer IPv4 / IPv6 header to
    /// the backend (20 / 40 bytes; IPIP, IP6IP6, added and removed by the
    /// programs, no tunnel device), for networks that drop or slow down
    /// packets with IP options; a TCP segment the header makes too long for
    /// the route is answered with ICMP fragmentation needed. Every node must
    /// run the same dispatch. Default: the config file's dsrDispatch, else
    /// option.
    #[arg(long, value_enum, value_name = "DISPATCH")]
    pub(crate) dsr_dispatch: Option<DsrDispatch>,
    /// Which sockets the socket programs translate at connect()/sendmsg().
    /// `all`: every socket in the --cgroup. `host-namespace`: only those in
    /// the agent's own network namespace (the node's); pods' sockets keep
    /// the service address and their packets are translated on the
    /// pod-facing devices (--pod-devices), as a service mesh's sidecar
    /// needs (its SO_ORIGINAL_DST must be the service, not a backend).
    /// Default: the config file's socketLB, else all.
    #[arg(long, value_enum, value_name = "MODE")]
    pub(crate) socket_lb: Option<SocketLbMode>,
    /// A device the pods' own traffic passes (the host side of a pod's
    /// veth, a bridge holding pod routes): the per-packet programs
    /// translate packets to services there (pods the socket programs do not
    /// translate, VMs, meshes). Repeatable. `auto` (the default): every
    /// veth and bridge that is not one of the --devices, followed as pods
    /// come and go; `none`: no device.
    #[arg(long = "pod-devices", value_name = "DEV", value_delimiter = ',')]
    pub(crate) pod_devices: Vec<String>,
    /// The cluster's pod CIDRs, at most one per family, comma-separated
    /// (kube-proxy's --cluster-cidr): packets routed to this node for a
    /// ClusterIP (from a router, a VM, another node) are translated on the
    /// --devices, with source NAT to this node's address when their source
    /// is outside them (kube-proxy's detectLocalMode ClusterCIDR). Unset
    /// (the default, and the config file's clusterCIDR unset): a ClusterIP
    /// is not served to traffic arriving from outside.
    #[arg(long = "cluster-cidr", value_name = "CIDRS", value_delimiter = ',', value_parser = check::cidr)]
    pub(crate) cluster_cidr: Vec<ipnet::IpNet>,
    #[arg(long, value_name = "MIN-MAX|none", value_parser = check::node_port_range, help = format!(
        "The cluster's NodePort range (kube-apiserver's --service-node-port-range), kept out of the node's \
         ephemeral ports so that no connection the node opens takes a NodePort as its local port (Cilium's \
         enable-auto-protect-node-port-range): when it overlaps net.ipv4.ip_local_port_range, the agent adds it \
         to net.ipv4.ip_local_reserved_ports of its network namespace at start (logged with the old and new \
         value), and `ebpf-proxy cleanup` takes out again what it added (recorded under --bpffs-dir/reserved-ports). `none`: the sysctl is left alone. \
         Default: {}",
        crate::node::reserved_ports::NodePortRange::Range(crate::node::reserved_ports::PortRange::DEFAULT_NODE_PORTS)
    ))]
    pub(crate) node_port_range: Option<crate::node::reserved_ports::NodePortRange>,
    #[arg(long, value_name = "N", help = format!(
        "Frontends whose connection counter is exported as its own series (ebpf_proxy_service_connections_total), \
         at most; past it the frontends with the highest ids are left out and counted in \
         ebpf_proxy_service_series_omitted. 0: none. Default: {DEFAULT_MAX_SERVICE_SERIES}"
    ))]
    pub(crate) max_service_series: Option<usize>,
    /// How often the drift audit compares the maps in the kernel with the
    /// desired table and repairs what something else changed (logged, and
    /// counted in ebpf_proxy_datapath_drift_total): a duration such as 5m,
    /// 30s or 1h0m0s; 0 disables the timer (SIGHUP still audits at once).
    /// Default: the config file's syncPeriod, else 5m.
    #[arg(long, value_name = "DURATION", value_parser = check::duration)]
    pub(crate) audit_interval: Option<std::time::Duration>,
    /// Take over connections from this node (its pods and itself) to an
    /// externalIP only when it is one of this node's addresses; to any
    /// other externalIP they reach that address itself (a mitigation of
    /// CVE-2020-8554 on this node alone; the DenyServiceExternalIPs
    /// admission plugin is the cluster-wide one). Default: every
    /// externalIP of every service is taken over, as kube-proxy does.
    /// Traffic from outside is served on every externalIP either way.
    #[arg(long)]
    pub(crate) external_ips_local_only: bool,
    /// Take this node over from kube-proxy (stopped, its rules still in
    /// place): once the maps hold the whole table, read kube-proxy's rules
    /// (iptables nat/filter of iptables-nft and iptables-legacy, both
    /// families; nftables tables ip/ip6 kube-proxy), check that every
    /// frontend they serve is in the maps with the same backends, and only
    /// then remove them as `kube-proxy --cleanup` does, one transaction per
    /// table. A difference is logged (one warning each) and the rules stay;
    /// the check runs again every 10 s (while the maps hold the table).
    /// Meanwhile traffic from outside is left to kube-proxy's rules
    /// (`--outside-handover defer`); once they are gone new flows are the
    /// programs' and those conntrack translated finish through it
    /// (`handover`, for --outside-handover-seconds if set). With no rule of
    /// kube-proxy's on the node the flag does nothing.
    #[arg(long)]
    pub(crate) take_over_from_kube_proxy: bool,
    #[arg(long, value_name = "PATH", env = "EBPF_PROXY_EXPLAIN_SOCKET", help = format!(
        "The unix socket (mode 0600) where `ebpf-proxy explain` asks why endpoints are not used; \"none\": not \
         served. Default: {DEFAULT_EXPLAIN_SOCKET}"
    ))]
    pub(crate) explain_socket: Option<PathBuf>,
    /// How a service picks a backend for each new connection unless its
    /// annotation ebpf-proxy.io/lb-algorithm says otherwise. `random`: a
    /// backend at random (traffic from outside: by the Maglev table), as
    /// kube-proxy does. `least-connections`: of two backends picked at
    /// random, the one with fewer active connections (open sockets on this
    /// node and flows from outside it serves; traffic from outside with
    /// --nodeport-mode dsr, or hybrid for TCP, keeps the Maglev table).
    /// `maglev`: as random (Cilium's name). Default: the config file's
    /// lbAlgorithm, else random.
    #[arg(long, value_enum, value_name = "ALGORITHM")]
    pub(crate) lb_algorithm: Option<LbAlgorithm>,
    /// kube-proxy's minSyncPeriod: syncs start at most this often (the
    /// config file's alone).
    #[arg(skip)]
    pub(crate) min_sync_period: Option<Duration>,
    /// kube-proxy's logging.format (the config file's alone: `--log-format`
    /// is the command line's, before the subcommand).
    #[arg(skip)]
    pub(crate) log_format: Option<LogFormat>,
    /// kube-proxy's logging.verbosity, klog's `-v` (the config file's alone:
    /// `-v` is kube-proxy's command line's).
    #[arg(skip)]
    pub(crate) log_verbosity: Option<u32>,
}

impl Settings {
    /// These settings (the command line's) over `file`'s: a flag given
    /// wins, a repeatable flag given replaces the file's list, and
    /// `--bpf-log` turns on what the file's bpfLog may also turn on. Every
    /// field is named here, so a new one must say which layer it takes.
    #[must_use]
    pub(crate) fn over(self, file: Settings) -> Settings {
        let Settings {
            config,
            services_file,
            kubeconfig,
            api_server_endpoint,
            kube_api_content_type,
            cgroup,
            bpffs_dir,
            node_name,
            node_ip,
            nodeport_addresses,
            socket_netns,
            healthz_bind_address,
            metrics_bind_address,
            health_timeout,
            bpf_log,
            services_map_size,
            backends_map_size,
            devices,
            maglev_table_size,
            ct_map_size,
            nodeport_acceleration,
            outside_handover,
            outside_handover_seconds,
            nodeport_mode,
            dsr_dispatch,
            socket_lb,
            pod_devices,
            cluster_cidr,
            node_port_range,
            max_service_series,
            audit_interval,
            external_ips_local_only,
            take_over_from_kube_proxy,
            explain_socket,
            lb_algorithm,
            min_sync_period: _,
            log_format: _,
            log_verbosity: _,
        } = self;
        Settings {
            // The command line's alone: the file has no field for these.
            config,
            kube_api_content_type,
            nodeport_acceleration,
            outside_handover,
            outside_handover_seconds,
            external_ips_local_only,
            take_over_from_kube_proxy,
            explain_socket,
            // The file's alone.
            min_sync_period: file.min_sync_period,
            log_format: file.log_format,
            log_verbosity: file.log_verbosity,
            // Both: the flag wins.
            nodeport_mode: nodeport_mode.or(file.nodeport_mode),
            dsr_dispatch: dsr_dispatch.or(file.dsr_dispatch),
            services_file: services_file.or(file.services_file),
            kubeconfig: kubeconfig.or(file.kubeconfig),
            api_server_endpoint: api_server_endpoint.or(file.api_server_endpoint),
            cgroup: cgroup.or(file.cgroup),
            bpffs_dir: bpffs_dir.or(file.bpffs_dir),
            node_name: node_name.or(file.node_name),
            node_ip: list(node_ip, file.node_ip),
            nodeport_addresses: nodeport_addresses.or(file.nodeport_addresses),
            socket_netns: list(socket_netns, file.socket_netns),
            healthz_bind_address: healthz_bind_address.or(file.healthz_bind_address),
            metrics_bind_address: metrics_bind_address.or(file.metrics_bind_address),
            health_timeout: health_timeout.or(file.health_timeout),
            bpf_log: bpf_log || file.bpf_log,
            services_map_size: services_map_size.or(file.services_map_size),
            backends_map_size: backends_map_size.or(file.backends_map_size),
            devices: list(devices, file.devices),
            maglev_table_size: maglev_table_size.or(file.maglev_table_size),
            ct_map_size: ct_map_size.or(file.ct_map_size),
            socket_lb: socket_lb.or(file.socket_lb),
            pod_devices: list(pod_devices, file.pod_devices),
            cluster_cidr: list(cluster_cidr, file.cluster_cidr),
            node_port_range: node_port_range.or(file.node_port_range),
            max_service_series: max_service_series.or(file.max_service_series),
            audit_interval: audit_interval.or(file.audit_interval),
            lb_algorithm: lb_algorithm.or(file.lb_algorithm),
        }
    }
}

/// A repeatable flag given replaces the file's list.
fn list<T>(flag: Vec<T>, file: Vec<T>) -> Vec<T> {
    if flag.is_empty() { file } else { flag }
}

#[cfg(test)]
mod tests {
    use std::{net::IpAddr, path::Path};

    use clap::FromArgMatches as _;

    use super::*;

    /// `run`'s flags as clap reads them, without the environment
    /// (`NODE_NAME`, `EBPF_PROXY_EXPLAIN_SOCKET`).
    fn flags(argv: &[&str]) -> Settings {
        let command = Settings::augment_args(clap::Command::new("run"))
            .mut_arg("node_name", |a| a.env(None))
            .mut_arg("explain_socket", |a| a.env(None));
        let matches = command.try_get_matches_from(std::iter::once("run").chain(argv.iter().copied())).unwrap();
        Settings::from_arg_matches(&matches).unwrap()
    }

    fn file(yaml: &str) -> Settings {
        crate::config::parse(yaml).unwrap().settings
    }

    fn ips(ips: &[&str]) -> Vec<IpAddr> {
        ips.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    #[test]
    fn no_flag_and_no_file_are_the_default_settings() {
        assert_eq!(flags(&[]), Settings::default());
        assert_eq!(file(""), Settings::default());
    }

    /// Flag (or environment) over file over default; a repeatable flag
    /// given replaces the file's list; `--bpf-log` or the file's bpfLog;
    /// a zero sync period in the file is unset; nodeName beats
    /// hostnameOverride.
    #[test]
    fn flags_go_over_the_file() {
        let d = Settings::default;
        let cases: Vec<(&[&str], &str, Settings)> = vec![
            (&["--ct-map-size", "1024"], "ctMapSize: 2048\n", Settings { ct_map_size: Some(1024), ..d() }),
            (&[], "ctMapSize: 2048\n", Settings { ct_map_size: Some(2048), ..d() }),
            (&["--ct-map-size", "1024"], "", Settings { ct_map_size: Some(1024), ..d() }),
            (&["--devices", "eth1"], "devices: [eth0, eth2]\n", Settings { devices: vec!["eth1".into()], ..d() }),
            (&[], "devices: [eth0, eth2]\n", Settings { devices: vec!["eth0".into(), "eth2".into()], ..d() }),
            (
                &["--node-ip", "10.0.0.1"],
                "nodeIPs: [10.0.0.2, fd00::2]\n",
                Settings { node_ip: ips(&["10.0.0.1"]), ..d() },
            ),
            (&[], "nodeIPs: [10.0.0.2, fd00::2]\n", Settings { node_ip: ips(&["10.0.0.2", "fd00::2"]), ..d() }),
            (
                &["--cluster-cidr", "10.0.0.0/8"],
                "clusterCIDR: 10.244.0.0/16\n",
                Settings { cluster_cidr: vec!["10.0.0.0/8".parse().unwrap()], ..d() },
            ),
            (&["--bpf-log"], "bpfLog: false\n", Settings { bpf_log: true, ..d() }),
            (&[], "bpfLog: true\n", Settings { bpf_log: true, ..d() }),
            (&[], "syncPeriod: 0s\n", d()),
            (&["--audit-interval", "0"], "syncPeriod: 30s\n", Settings { audit_interval: Some(Duration::ZERO), ..d() }),
            (&[], "syncPeriod: 30s\n", Settings { audit_interval: Some(Duration::from_secs(30)), ..d() }),
            (&[], "nodeName: a\nhostnameOverride: b\n", Settings { node_name: Some("a".into()), ..d() }),
            (&[], "hostnameOverride: b\n", Settings { node_name: Some("b".into()), ..d() }),
            (&["--node-name", "c"], "nodeName: a\n", Settings { node_name: Some("c".into()), ..d() }),
            (&[], "minSyncPeriod: 1s\n", Settings { min_sync_period: Some(Duration::from_secs(1)), ..d() }),
            (&["--nodeport-mode", "dsr"], "", Settings { nodeport_mode: Some(NodePortMode::Dsr), ..d() }),
            (&[], "nodeportMode: hybrid\n", Settings { nodeport_mode: Some(NodePortMode::Hybrid), ..d() }),
            (
                &["--nodeport-mode", "snat"],
                "nodeportMode: dsr\ndsrDispatch: ipip\n",
                Settings { nodeport_mode: Some(NodePortMode::Snat), dsr_dispatch: Some(DsrDispatch::Ipip), ..d() },
            ),
            (
                &["--node-port-range", "none"],
                "nodePortRange: 20000-22767\n",
                Settings { node_port_range: Some(crate::node::reserved_ports::NodePortRange::None), ..d() },
            ),
            (
                &["--socket-lb", "all"],
                "socketLB: host-namespace\n",
                Settings { socket_lb: Some(SocketLbMode::All), ..d() },
            ),
        ];
        for (argv, yaml, want) in cases {
            assert_eq!(flags(argv).over(file(yaml)), want, "{argv:?} over {yaml:?}");
        }
    }

    /// What neither the flags nor the file set is the default, as the
    /// help says.
    #[test]
    fn unset_is_the_default() {
        let settings = Settings { cgroup: Some("/cg".into()), node_name: Some("n".into()), ..Settings::default() };
        let config = settings.agent_config().unwrap();
        assert_eq!(config.health_bind, Some("0.0.0.0:10256".parse().unwrap()));
        assert_eq!(config.metrics_bind, Some("127.0.0.1:10249".parse().unwrap()));
        assert_eq!(config.health_timeout, Duration::from_mins(1));
        assert_eq!(config.audit_interval, Some(Duration::from_mins(5)));
        assert_eq!(config.explain_socket.as_deref(), Some(Path::new("/run/ebpf-proxy/agent.sock")));
        assert_eq!(config.max_service_series, 1000);
        assert_eq!(config.load.pin_dir, Path::new("/sys/fs/bpf/ebpf-proxy"));
        assert_eq!(config.load.cgroup, Path::new("/cg"));
        assert_eq!((config.load.services_map_size, config.load.backends_map_size), (4_194_304, 2_097_152));
        assert_eq!(config.load.ct_map_size, crate::node::memory::ct_entries_here(), "from the node's memory");
        assert_eq!(config.load.maglev_size, 16_381);
        assert_eq!(config.node_name, "n");
        assert_eq!(config.node_port_range.map(|r| (r.min, r.max)), Some((30000, 32767)));
    }

    #[test]
    fn zero_and_none_turn_off() {
        let settings = flags(&["--audit-interval", "0s", "--explain-socket", "none", "--node-port-range", "none"]);
        assert_eq!((settings.audit_interval(), settings.explain_socket()), (None, None));
        assert_eq!(settings.node_port_range(), None);
    }

    #[test]
    fn two_cluster_cidrs_of_a_family_are_refused() {
        let settings = flags(&["--cluster-cidr", "10.0.0.0/8,10.1.0.0/16", "--cgroup", "/cg", "--node-name", "n"]);
        let err = settings.agent_config().unwrap_err().to_string();
        assert!(err.starts_with("--cluster-cidr: ") && err.contains("one family"), "{err}");
    }
}
