//! Command-line arguments.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::paths::DEFAULT_PIN_DIR;

/// `--version`: the package version and the commit it is built from
/// (`git describe`, "unknown" when built outside a git checkout; see build.rs).
pub(crate) const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("EBPF_PROXY_COMMIT"), ")");

/// Kubernetes service proxy that translates service addresses with eBPF at
/// the socket, instead of iptables DNAT.
///
/// With a subcommand, does what it says. Without one, takes kube-proxy's
/// flags that apply and runs the agent (`ebpf-proxy
/// --config=/var/lib/kube-proxy/config.conf --hostname-override=NODE` is
/// kubeadm's kube-proxy DaemonSet with the binary swapped).
#[derive(Debug, Parser)]
#[command(name = "ebpf-proxy", version = VERSION)]
pub struct Cli {
    /// Log format [default: the config file's logging.format, else text].
    #[arg(long, value_enum, global = true)]
    pub log_format: Option<LogFormat>,
    #[command(subcommand)]
    #[allow(
        missing_docs,
        reason = "clap prints a doc comment here as help text, which would change the command line's help"
    )]
    pub command: Option<Command>,
    #[command(flatten)]
    #[allow(
        missing_docs,
        reason = "clap prints a doc comment here as help text, which would change the command line's help"
    )]
    pub kube_proxy: KubeProxyArgs,
}

impl Cli {
    /// kube-proxy's flags go without a subcommand.
    pub fn check(&self) -> Result<(), String> {
        if self.command.is_some() && !self.kube_proxy.is_empty() {
            return Err("kube-proxy's flags (--config, --hostname-override, ...) go before no subcommand; \
                        after `run`, give them after it (`ebpf-proxy run --config FILE`)"
                .into());
        }
        Ok(())
    }
}

/// kube-proxy's flags that apply, for a drop-in `kube-proxy` command line.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "kube-proxy's flags (no subcommand: run the agent, as `run` does)")]
pub struct KubeProxyArgs {
    /// The configuration file (a KubeProxyConfiguration, v1alpha1 or v1alpha2).
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// This node's name (overrides the file's hostnameOverride).
    #[arg(long, value_name = "NAME")]
    pub(crate) hostname_override: Option<String>,
    /// Kubeconfig for the API server (overrides clientConnection.kubeconfig).
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The API server's address (overrides the kubeconfig's): `https://HOST:PORT` or `HOST:PORT`.
    #[arg(long, value_name = "URL", value_parser = parse_endpoint)]
    pub(crate) master: Option<String>,
    /// Where to serve /healthz and /livez: IP:PORT or IP.
    #[arg(long, value_name = "ADDR", value_parser = parse_healthz)]
    pub(crate) healthz_bind_address: Option<std::net::SocketAddr>,
    /// Where to serve /metrics and /proxyMode: IP:PORT or IP.
    #[arg(long, value_name = "ADDR", value_parser = parse_metrics)]
    pub(crate) metrics_bind_address: Option<std::net::SocketAddr>,
    /// Which of the node's local addresses serve NodePorts (kube-proxy's
    /// --nodeport-addresses, overrides the config file's
    /// nodePortAddresses): comma-separated CIDRs (the local addresses
    /// inside them; a family no CIDR names is not narrowed; 127.0.0.1 only
    /// if a CIDR covers it), or `primary` (the node's first IP of each
    /// family, no 127.0.0.1). Default: every local address of every device
    /// and 127.0.0.1, followed as addresses come and go.
    #[arg(long, value_name = "CIDRS|primary", value_parser = parse_nodeport_addresses)]
    pub(crate) nodeport_addresses: Option<crate::node::nodeport_addresses::NodePortAddresses>,
    /// The cluster's pod CIDRs, one per family, comma-separated (overrides
    /// the config file's clusterCIDR): packets routed to this node for a
    /// ClusterIP are translated, with source NAT when they come from
    /// outside them.
    #[arg(long = "cluster-cidr", value_name = "CIDRS", value_delimiter = ',', value_parser = parse_cidr)]
    pub(crate) cluster_cidr: Vec<ipnet::IpNet>,
    /// klog's verbosity: 0-2 info, 3-4 debug, 5 and above trace (`RUST_LOG` wins).
    #[arg(short = 'v', long = "v", value_name = "LEVEL")]
    pub verbosity: Option<u32>,
    /// Remove the datapath (as `ebpf-proxy cleanup`) and exit.
    #[arg(long)]
    pub cleanup: bool,
}

impl KubeProxyArgs {
    /// Whether any flag was given.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.config.is_none()
            && self.hostname_override.is_none()
            && self.kubeconfig.is_none()
            && self.master.is_none()
            && self.healthz_bind_address.is_none()
            && self.metrics_bind_address.is_none()
            && self.nodeport_addresses.is_none()
            && self.cluster_cidr.is_empty()
            && self.verbosity.is_none()
            && !self.cleanup
    }

    /// The `run` arguments these flags mean; the rest as `ebpf-proxy run`
    /// with no flag takes them, environment variables included
    /// (`EBPF_PROXY_EXPLAIN_SOCKET`, and `NODE_NAME` without
    /// `--hostname-override`).
    ///
    /// # Errors
    ///
    /// When such a variable cannot be read (not UTF-8).
    pub fn into_run_args(self) -> Result<RunArgs, clap::Error> {
        use clap::FromArgMatches as _;
        let matches = RunArgs::augment_args(clap::Command::new("run")).try_get_matches_from(["run"])?;
        let from_env = RunArgs::from_arg_matches(&matches)?;
        Ok(RunArgs {
            config: self.config,
            kubeconfig: self.kubeconfig,
            node_name: self.hostname_override.or(from_env.node_name.clone()),
            api_server_endpoint: self.master,
            healthz_bind_address: self.healthz_bind_address,
            metrics_bind_address: self.metrics_bind_address,
            nodeport_addresses: self.nodeport_addresses,
            cluster_cidr: self.cluster_cidr,
            ..from_env
        })
    }
}

/// kube-proxy flags that change behaviour and have no counterpart here,
/// with the reason (a flag kube-proxy does not have is left to clap).
const REFUSED_KUBE_PROXY_FLAGS: &[(&str, &str)] = &[
    ("proxy-mode", "ebpf-proxy has one datapath (eBPF at the socket and on the devices); remove the flag"),
    (
        "iptables-",
        "ebpf-proxy writes no iptables rules; sync periods go in the --config file (minSyncPeriod, syncPeriod)",
    ),
    ("ipvs-", "ebpf-proxy uses no IPVS; sync periods go in the --config file (minSyncPeriod, syncPeriod)"),
    ("nftables-", "ebpf-proxy writes no nftables rules; remove the flag"),
    ("masquerade-all", "ebpf-proxy does not masquerade pod traffic to services; remove the flag"),
    ("detect-local-mode", "ebpf-proxy does not classify local traffic; remove the flag"),
    ("pod-bridge-interface", "ebpf-proxy does not classify local traffic; remove the flag"),
    ("pod-interface-name-prefix", "ebpf-proxy does not classify local traffic; remove the flag"),
    ("conntrack-", "ebpf-proxy does not tune netfilter conntrack; remove the flag"),
    ("kube-api-qps", "ebpf-proxy has no client-side rate limiter; remove the flag"),
    ("kube-api-burst", "ebpf-proxy has no client-side rate limiter; remove the flag"),
    (
        "kube-api-content-type",
        "ebpf-proxy asks for protobuf, as kube-proxy does by default; give the flag to `ebpf-proxy run`",
    ),
    ("bind-address", "use --healthz-bind-address and --metrics-bind-address (and --node-ip with `run`)"),
    ("oom-score-adj", "set the pod's resources instead; remove the flag"),
    ("proxy-port-range", "ebpf-proxy proxies no ports in userspace; remove the flag"),
    ("udp-timeout", "ebpf-proxy proxies no UDP in userspace; remove the flag"),
    ("config-sync-period", "ebpf-proxy's watches never resync on a timer; remove the flag"),
    ("feature-gates", "ebpf-proxy has no feature gates; remove the flag"),
    ("logging-format", "use --log-format"),
    ("write-config-to", "ebpf-proxy writes no config; remove the flag"),
];

/// The refusal of a kube-proxy flag ebpf-proxy does not take (only before
/// a subcommand: subcommands have their own flags).
#[must_use]
pub fn refused_kube_proxy_flag(args: &[std::ffi::OsString]) -> Option<String> {
    use clap::CommandFactory as _;
    let cli = Cli::command();
    for arg in args.iter().skip(1) {
        let arg = arg.to_string_lossy();
        if cli.find_subcommand(arg.as_ref()).is_some() {
            return None;
        }
        let Some(name) = arg.strip_prefix("--") else { continue };
        let name = name.split('=').next().unwrap_or(name);
        if let Some((flag, reason)) = REFUSED_KUBE_PROXY_FLAGS
            .iter()
            .find(|(flag, _)| if flag.ends_with('-') { name.starts_with(flag) } else { name == *flag })
        {
            let shown = if flag.ends_with('-') { format!("--{flag}*") } else { format!("--{flag}") };
            return Some(format!("kube-proxy's flag --{name} is not supported ({shown}): {reason}"));
        }
    }
    None
}

/// `--kube-api-content-type`: kube-proxy's two values.
fn parse_content_type(value: &str) -> Result<crate::source::listwatch::ContentType, String> {
    use crate::source::listwatch::ContentType;
    match value {
        "application/vnd.kubernetes.protobuf" => Ok(ContentType::Protobuf),
        "application/json" => Ok(ContentType::Json),
        _ => Err("give application/vnd.kubernetes.protobuf or application/json".to_owned()),
    }
}

/// `HOST:PORT` (an IPv6 host in brackets), or a URL `https://HOST:PORT`;
/// returned as `HOST:PORT`.
pub(crate) fn parse_endpoint(text: &str) -> Result<String, String> {
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

fn parse_healthz(text: &str) -> Result<std::net::SocketAddr, String> {
    crate::config::bind_address("--healthz-bind-address", Some(text), 10256)
        .map_err(|(_, e)| e)?
        .ok_or_else(|| "empty".to_owned())
}

fn parse_metrics(text: &str) -> Result<std::net::SocketAddr, String> {
    crate::config::bind_address("--metrics-bind-address", Some(text), 10249)
        .map_err(|(_, e)| e)?
        .ok_or_else(|| "empty".to_owned())
}

/// klog's verbosity as a `tracing` level filter.
#[must_use]
pub fn level_for_verbosity(v: u32) -> &'static str {
    match v {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}

/// `--nodeport-acceleration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum NodePortAcceleration {
    #[default]
    Disabled,
    Native,
    BestEffort,
}

impl From<NodePortAcceleration> for crate::datapath::acceleration::Acceleration {
    fn from(mode: NodePortAcceleration) -> Self {
        match mode {
            NodePortAcceleration::Disabled => Self::Disabled,
            NodePortAcceleration::Native => Self::Native,
            NodePortAcceleration::BestEffort => Self::BestEffort,
        }
    }
}

/// `--outside-handover`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum OutsideHandoverMode {
    #[default]
    Off,
    Defer,
    Handover,
}

impl OutsideHandoverMode {
    /// The datapath's mode; `seconds` (0: none) ends a handover.
    #[must_use]
    pub(crate) fn with_end(self, seconds: u64) -> crate::datapath::handover::OutsideHandover {
        use crate::datapath::handover::OutsideHandover;
        match self {
            Self::Off => OutsideHandover::Off,
            Self::Defer => OutsideHandover::Defer,
            Self::Handover => OutsideHandover::Handover {
                ends_after: (seconds != 0).then(|| std::time::Duration::from_secs(seconds)),
            },
        }
    }
}

/// `--socket-lb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum SocketLbMode {
    #[default]
    All,
    HostNamespace,
}

impl From<SocketLbMode> for crate::datapath::loader::SocketLb {
    fn from(mode: SocketLbMode) -> Self {
        match mode {
            SocketLbMode::All => Self::All,
            SocketLbMode::HostNamespace => Self::HostNamespace,
        }
    }
}

/// `--nodeport-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum NodePortMode {
    #[default]
    Snat,
    Dsr,
    Hybrid,
}

impl From<NodePortMode> for crate::datapath::loader::NodePortMode {
    fn from(mode: NodePortMode) -> Self {
        match mode {
            NodePortMode::Snat => Self::Snat,
            NodePortMode::Dsr => Self::Dsr,
            NodePortMode::Hybrid => Self::Hybrid,
        }
    }
}

/// `--dsr-dispatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum DsrDispatch {
    #[default]
    Option,
    Ipip,
}

impl From<DsrDispatch> for crate::datapath::loader::DsrDispatch {
    fn from(dispatch: DsrDispatch) -> Self {
        match dispatch {
            DsrDispatch::Option => Self::Option,
            DsrDispatch::Ipip => Self::Ipip,
        }
    }
}

/// The log records' format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[allow(
    missing_docs,
    reason = "clap prints a doc comment here as help text, which would change the command line's help"
)]
pub enum LogFormat {
    Text,
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load the programs, attach them and keep the maps equal to the services.
    /// On exit the datapath stays in place (see `cleanup`).
    Run(Box<RunArgs>),
    /// Run a self-contained demo in its own network namespace and cgroup.
    Demo(DemoArgs),
    /// Remove the datapath the agent leaves in place when it stops: detach
    /// the programs (unpin their links) and unpin the maps.
    Cleanup(PinDirArgs),
    /// Show what the kernel translates, read from the pinned maps (the
    /// agent need not be running).
    Service(ServiceArgs),
    /// Show the datapath in the kernel: the attached programs (pinned
    /// links) and what the maps hold (the agent need not be running).
    Status(StatusArgs),
    /// Print a shell completion script, e.g. `ebpf-proxy completion bash >
    /// /etc/bash_completion.d/ebpf-proxy`.
    #[allow(
        missing_docs,
        reason = "clap prints a doc comment here as help text, which would change the command line's help"
    )]
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Where a connection to a frontend goes and why: its service, type,
    /// policies and backends, and with --from the backend that client gets
    /// and its affinity entry (read from the pinned maps; the agent need
    /// not be running); which endpoints are not used and why (asked of the
    /// running agent on its local socket).
    Explain(ExplainArgs),
}

/// `ebpf-proxy service`'s arguments.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// The agent's pin directory.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR, global = true)]
    pub(crate) bpffs_dir: PathBuf,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table, global = true)]
    pub(crate) output: OutputFormat,
    #[command(subcommand)]
    pub(crate) command: ServiceCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ServiceCommand {
    /// Every frontend with its service, backends and their states.
    List {
        /// Only the frontends of this service: NAMESPACE/NAME, or
        /// NAMESPACE/NAME:PORT-NAME for one of its ports.
        #[arg(long, value_name = "NAMESPACE/NAME[:PORT]")]
        service: Option<String>,
    },
    /// One frontend: ADDR:PORT, `[IPv6]:PORT`, optionally /TCP or /UDP.
    Get { frontend: String },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum OutputFormat {
    Table,
    Json,
}

/// `ebpf-proxy status`'s arguments.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub(crate) pin: PinDirArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
}

/// Commands that only need the agent's pin directory.
#[derive(Debug, Args)]
pub struct PinDirArgs {
    /// The agent's pin directory.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
    pub bpffs_dir: PathBuf,
}

/// `ebpf-proxy run`'s arguments.
#[derive(Debug, Default, Args)]
pub struct RunArgs {
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
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_endpoint)]
    pub(crate) api_server_endpoint: Option<String>,
    /// What Services and EndpointSlices are asked of the API server in
    /// (kube-proxy's flag): protobuf, as kube-proxy and client-go ask
    /// (JSON is still read from a server that answers with it), or JSON.
    #[arg(
        long,
        value_name = "TYPE",
        default_value = "application/vnd.kubernetes.protobuf",
        value_parser = parse_content_type
    )]
    pub(crate) kube_api_content_type: crate::source::listwatch::ContentType,
    /// cgroup v2 directory to attach the socket programs to (they act on
    /// every process in it and below). Default: the root of the cgroup2
    /// hierarchy, mounted at /run/ebpf-proxy/cgroup2 if none is.
    #[arg(long, value_name = "DIR")]
    pub(crate) cgroup: Option<PathBuf>,
    /// Directory on a bpffs where the maps and links are pinned (bpffs is
    /// mounted at /sys/fs/bpf when this lies below it and none is mounted).
    /// Default: /sys/fs/bpf/ebpf-proxy.
    #[arg(long, value_name = "DIR")]
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
    #[arg(long, value_name = "IP")]
    pub(crate) node_ip: Vec<std::net::IpAddr>,
    /// Which of the node's local addresses serve NodePorts (kube-proxy's
    /// --nodeport-addresses, overrides the config file's
    /// nodePortAddresses): comma-separated CIDRs (the local addresses
    /// inside them; a family no CIDR names is not narrowed; 127.0.0.1 only
    /// if a CIDR covers it), or `primary` (the node's first IP of each
    /// family, no 127.0.0.1). Default: every local address of every device
    /// and 127.0.0.1, followed as addresses come and go.
    #[arg(long, value_name = "CIDRS|primary", value_parser = parse_nodeport_addresses)]
    pub(crate) nodeport_addresses: Option<crate::node::nodeport_addresses::NodePortAddresses>,
    /// When a backend leaves a UDP service, sockets still connected to it
    /// through the service are destroyed (their owners get an error and
    /// reconnect to a live backend): in the agent's network namespace, and
    /// in these (a namespace file, or a directory of them such as
    /// /var/run/netns). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub(crate) socket_netns: Vec<PathBuf>,
    /// Where to serve /healthz and /livez. Default: 0.0.0.0:10256 (kube-proxy's).
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) healthz_bind_address: Option<std::net::SocketAddr>,
    /// Where to serve /metrics and /proxyMode. Default: 127.0.0.1:10249 (kube-proxy's).
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) metrics_bind_address: Option<std::net::SocketAddr>,
    /// Seconds a change may wait unapplied before /healthz answers 503
    /// (at least 1). Default: 60.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) health_timeout: Option<u64>,
    /// Log every translation the eBPF programs make, at debug level under
    /// the target proxy_ebpf (RUST_LOG=info,proxy_ebpf=debug shows them).
    /// Costs time on every connect: for troubleshooting only.
    #[arg(long)]
    pub(crate) bpf_log: bool,
    /// Most entries of the services map (one per frontend plus one per
    /// four backend slots), 1 to 16777216. The map is sized from the table with
    /// room to spare and grows as needed, up to this; past it the services
    /// that do not fit are not written, /healthz turns 503 after
    /// --health-timeout, and ebpf_proxy_map_full_total counts the refused
    /// writes. Default: 4194304.
    #[arg(long, value_name = "N", value_parser = map_size())]
    pub(crate) services_map_size: Option<u32>,
    /// Most entries of the backends map (an array indexed by backend id
    /// from 1: it holds one distinct backend fewer than its size), 1 to
    /// 16777216, sized and grown as the services map is. Default: 2097152.
    #[arg(long, value_name = "N", value_parser = map_size())]
    pub(crate) backends_map_size: Option<u32>,
    /// A network device that traffic from outside arrives on: the TC
    /// programs serve NodePorts, LoadBalancer IPs and externalIPs there.
    /// Repeatable. Default: the devices holding this node's addresses and
    /// the default route (recomputed when the node's addresses change).
    #[arg(long = "devices", value_name = "DEV", value_delimiter = ',')]
    pub(crate) devices: Vec<String>,
    /// Entries of each Maglev table (traffic from outside picks backends
    /// with it): a prime from 251 to 131071. Changing it gives the agent a
    /// fresh set of maps (connection tracking starts afresh). Default: 16381.
    #[arg(long, value_name = "N", value_parser = parse_maglev_size)]
    pub(crate) maglev_table_size: Option<usize>,
    /// Entries of the connection-tracking map of the flows translated per
    /// packet (two per flow, LRU, allocated at start; a restart with
    /// another size copies the flows into a new map), 1 to 16777216.
    /// Default: 262144.
    #[arg(long, value_name = "N", value_parser = map_size())]
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
    #[arg(long, value_enum, value_name = "MODE", default_value_t = NodePortMode::Snat)]
    pub(crate) nodeport_mode: NodePortMode,
    /// How a DSR flow's packets reach the backend's node. `option`: the
    /// frontend in an IP option on the packets that open a flow (8 / 24
    /// bytes). `ipip`: every packet inside an outer IPv4 / IPv6 header to
    /// the backend (20 / 40 bytes; IPIP, IP6IP6, added and removed by the
    /// programs, no tunnel device), for networks that drop or slow down
    /// packets with IP options; a TCP segment the header makes too long for
    /// the route is answered with ICMP fragmentation needed. Every node must
    /// run the same dispatch.
    #[arg(long, value_enum, value_name = "DISPATCH", default_value_t = DsrDispatch::Option)]
    pub(crate) dsr_dispatch: DsrDispatch,
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
    #[arg(long = "cluster-cidr", value_name = "CIDRS", value_delimiter = ',', value_parser = parse_cidr)]
    pub(crate) cluster_cidr: Vec<ipnet::IpNet>,
    /// Frontends whose connection counter is exported as its own series
    /// (ebpf_proxy_service_connections_total), at most; past it the
    /// frontends with the highest ids are left out and counted in
    /// ebpf_proxy_service_series_omitted. 0: none. Default: 1000.
    #[arg(long, value_name = "N")]
    pub(crate) max_service_series: Option<usize>,
    /// How often the drift audit compares the maps in the kernel with the
    /// desired table and repairs what something else changed (logged, and
    /// counted in ebpf_proxy_datapath_drift_total): a duration such as 5m,
    /// 30s or 1h0m0s; 0 disables the timer (SIGHUP still audits at once).
    /// Default: the config file's syncPeriod, else 5m.
    #[arg(long, value_name = "DURATION", value_parser = parse_audit_interval)]
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
    /// The unix socket (mode 0600) where `ebpf-proxy explain` asks why
    /// endpoints are not used; "none": not served. Default:
    /// /run/ebpf-proxy/agent.sock.
    #[arg(long, value_name = "PATH", env = "EBPF_PROXY_EXPLAIN_SOCKET")]
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
}

/// `--lb-algorithm` (`crate::model::LbAlgorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum LbAlgorithm {
    #[default]
    Random,
    LeastConnections,
    Maglev,
}

impl From<LbAlgorithm> for crate::model::LbAlgorithm {
    fn from(algorithm: LbAlgorithm) -> Self {
        match algorithm {
            LbAlgorithm::Random => Self::Random,
            LbAlgorithm::LeastConnections => Self::LeastConnections,
            LbAlgorithm::Maglev => Self::Maglev,
        }
    }
}

fn parse_audit_interval(text: &str) -> Result<std::time::Duration, String> {
    crate::config::parse_duration(text)
}

/// The most entries a map size flag takes: 64 times the largest default, and
/// a connection-tracking map of this size (allocated whole at start) takes
/// about 2 GiB.
pub(crate) const MAX_MAP_SIZE: u32 = 1 << 24;

/// Map sizes: 1 to `MAX_MAP_SIZE` (the kernel refuses 0).
fn map_size() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(1..=i64::from(MAX_MAP_SIZE))
}

/// The same check for the config file's map sizes.
pub(crate) fn check_map_size(n: u32) -> Result<u32, String> {
    if (1..=MAX_MAP_SIZE).contains(&n) { Ok(n) } else { Err(format!("{n} is not in 1..={MAX_MAP_SIZE}")) }
}

fn parse_nodeport_addresses(text: &str) -> Result<crate::node::nodeport_addresses::NodePortAddresses, String> {
    let values: Vec<&str> = text.split(',').collect();
    crate::node::nodeport_addresses::NodePortAddresses::parse(&values).map_err(|(_, e)| e.to_string())
}

fn parse_cidr(text: &str) -> Result<ipnet::IpNet, String> {
    text.trim()
        .parse::<ipnet::IpNet>()
        .map(|n| n.trunc())
        .map_err(|e| format!("{text:?}: {e} (expected a CIDR such as 10.244.0.0/16)"))
}

fn parse_maglev_size(text: &str) -> Result<usize, String> {
    let n: usize = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    crate::reconcile::maglev::check_size(n).map_err(|e| e.to_string())
}

/// `ebpf-proxy demo`'s arguments.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Run the demo's check (requests spread over the backends), print the
    /// result and exit instead of waiting for Ctrl-C.
    #[arg(long)]
    pub(crate) check: bool,
}

/// `ebpf-proxy explain`'s arguments.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The frontend: ADDR:PORT, `[IPv6]:PORT`, optionally /TCP or /UDP.
    pub(crate) frontend: String,
    /// A client, IP or IP:PORT: the backend it would get (from outside the
    /// node: the Maglev entry its flow hashes to, which needs its port) and,
    /// for a client on this node, its affinity entry.
    #[arg(long, value_name = "IP[:PORT]")]
    pub(crate) from: Option<String>,
    /// The agent's pin directory.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
    pub(crate) bpffs_dir: PathBuf,
    /// The running agent's socket (its --explain-socket), asked which
    /// endpoints are not used and why.
    #[arg(long, value_name = "PATH", default_value = crate::paths::DEFAULT_EXPLAIN_SOCKET)]
    pub(crate) agent_socket: PathBuf,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub(crate) output: OutputFormat,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(Into::into).collect()
    }

    /// kubeadm's kube-proxy DaemonSet runs `kube-proxy
    /// --config=/var/lib/kube-proxy/config.conf --hostname-override=$(NODE_NAME)`.
    #[test]
    fn kubeadms_command_line_runs_the_agent() {
        let argv = ["ebpf-proxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=node-1"];
        assert_eq!(refused_kube_proxy_flag(&os(&argv)), None);
        let cli = Cli::try_parse_from(argv).unwrap();
        assert!(cli.command.is_none());
        let run = cli.kube_proxy.into_run_args().unwrap();
        assert_eq!(run.config.as_deref(), Some(std::path::Path::new("/var/lib/kube-proxy/config.conf")));
        assert_eq!(run.node_name.as_deref(), Some("node-1"));
        let cli = Cli::try_parse_from(["ebpf-proxy", "--master", "https://192.168.0.10:6443", "-v", "4"]).unwrap();
        assert_eq!(cli.kube_proxy.verbosity, Some(4));
        assert_eq!(cli.kube_proxy.into_run_args().unwrap().api_server_endpoint.as_deref(), Some("192.168.0.10:6443"));
        let cli = Cli::try_parse_from([
            "ebpf-proxy",
            "--healthz-bind-address=0.0.0.0:10256",
            "--metrics-bind-address",
            "127.0.0.1",
        ])
        .unwrap();
        assert_eq!(cli.kube_proxy.metrics_bind_address, Some("127.0.0.1:10249".parse().unwrap()));
    }

    #[test]
    fn subcommands_keep_their_flags() {
        let cli = Cli::try_parse_from(["ebpf-proxy", "--log-format", "json", "run", "--config", "c.yaml"]).unwrap();
        assert!(
            matches!(cli.command, Some(Command::Run(ref r)) if r.config.as_deref() == Some(std::path::Path::new("c.yaml")))
        );
        assert!(cli.kube_proxy.is_empty());
        assert_eq!(refused_kube_proxy_flag(&os(&["ebpf-proxy", "run", "--proxy-mode"])), None, "left to clap");
        assert!(
            Cli::try_parse_from(["ebpf-proxy", "--config", "x", "run"]).unwrap().check().is_err(),
            "one or the other"
        );
        assert!(cli.check().is_ok());
    }

    #[test]
    fn lb_algorithm_names_are_the_annotations() {
        for algorithm in crate::model::LbAlgorithm::ALL {
            let parsed = Cli::try_parse_from(["ebpf-proxy", "run", "--lb-algorithm", algorithm.as_str()]);
            match parsed.map(|c| c.command) {
                Ok(Some(Command::Run(r))) => {
                    assert_eq!(r.lb_algorithm.map(crate::model::LbAlgorithm::from), Some(algorithm));
                }
                other => panic!("{algorithm}: {other:?}"),
            }
        }
        assert!(Cli::try_parse_from(["ebpf-proxy", "run", "--lb-algorithm", "round-robin"]).is_err());
    }

    #[test]
    fn nodeport_mode_reaches_the_programs_value() {
        use crate::datapath::loader::NodePortMode as Mode;
        let mode = |extra: &[&str]| {
            let argv: Vec<&str> = ["ebpf-proxy", "run"].iter().chain(extra).copied().collect();
            match Cli::try_parse_from(argv).unwrap().command {
                Some(Command::Run(r)) => Mode::from(r.nodeport_mode).value(),
                _ => unreachable!("run"),
            }
        };
        assert_eq!(mode(&[]), proxy_common::nodeport_mode::SNAT, "snat by default");
        assert_eq!(mode(&["--nodeport-mode", "dsr"]), proxy_common::nodeport_mode::DSR);
        assert_eq!(mode(&["--nodeport-mode=hybrid"]), proxy_common::nodeport_mode::HYBRID);
        assert!(Cli::try_parse_from(["ebpf-proxy", "run", "--nodeport-mode", "tunnel"]).is_err());
    }

    #[test]
    fn kube_proxy_flags_that_do_not_apply_are_refused_with_the_reason() {
        for flag in
            ["--proxy-mode=ipvs", "--iptables-sync-period=1s", "--masquerade-all", "--detect-local-mode=NodeCIDR"]
        {
            let refusal = refused_kube_proxy_flag(&os(&["ebpf-proxy", "--config=c", flag])).expect(flag);
            assert!(refusal.contains(flag.split('=').next().unwrap()), "{refusal}");
        }
        assert!(Cli::try_parse_from(["ebpf-proxy", "--no-such-flag"]).is_err());
    }

    /// Out-of-range values are refused by the parser, naming the range,
    /// before anything reaches the kernel.
    #[test]
    fn out_of_range_flags_are_refused_with_the_valid_range() {
        let refused = |flag: &str, value: &str| {
            let err = Cli::try_parse_from(["ebpf-proxy", "run", flag, value]).map(|_| ()).unwrap_err().to_string();
            assert!(err.contains(flag), "{err}");
            err
        };
        for flag in ["--services-map-size", "--backends-map-size", "--ct-map-size"] {
            for value in ["0", "16777217"] {
                assert!(refused(flag, value).contains("1..=16777216"), "{flag} {value}");
            }
            assert!(Cli::try_parse_from(["ebpf-proxy", "run", flag, "16777216"]).is_ok());
        }
        assert!(refused("--health-timeout", "0").contains("1.."));
        for value in ["1000", "0", "131101"] {
            let err = refused("--maglev-table-size", value);
            assert!(err.contains("is not one of [251, 509,"), "{err}");
        }
        assert_eq!(check_map_size(0), Err("0 is not in 1..=16777216".into()));
        assert_eq!(check_map_size(4), Ok(4));
    }

    #[test]
    fn endpoints_are_host_and_port() {
        assert_eq!(parse_endpoint("10.0.0.1:6443").as_deref(), Ok("10.0.0.1:6443"));
        assert_eq!(parse_endpoint("https://cp.example:6443/").as_deref(), Ok("cp.example:6443"));
        assert_eq!(parse_endpoint("[fd00::1]:6443").as_deref(), Ok("[fd00::1]:6443"));
        for bad in ["10.0.0.1", "fd00::1:6443", ":6443", "h:0", "h:x"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }
}
