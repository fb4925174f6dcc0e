//! Command-line arguments.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::paths::DEFAULT_PIN_DIR;

/// `--version`: the package version and the commit it is built from
/// (`git describe`, "unknown" when built outside a git checkout; see build.rs).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("EBPF_PROXY_COMMIT"), ")");

/// Kubernetes service proxy that translates service addresses with eBPF at
/// the socket, instead of iptables DNAT.
#[derive(Debug, Parser)]
#[command(name = "ebpf-proxy", version = VERSION)]
pub struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

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
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// The agent's pin directory.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR, global = true)]
    pub bpffs_dir: PathBuf,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table, global = true)]
    pub output: OutputFormat,
    #[command(subcommand)]
    pub command: ServiceCommand,
}

#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Every frontend with its service, backends and their states.
    List {
        /// Only the frontends of this service: NAMESPACE/NAME, or
        /// NAMESPACE/NAME:PORT-NAME for one of its ports.
        #[arg(long, value_name = "NAMESPACE/NAME[:PORT]")]
        service: Option<String>,
    },
    /// One frontend: ADDR:PORT, [IPv6]:PORT, optionally /TCP or /UDP.
    Get { frontend: String },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub pin: PinDirArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// Commands that only need the agent's pin directory.
#[derive(Debug, Args)]
pub struct PinDirArgs {
    /// The agent's pin directory.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
    pub bpffs_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Configuration file: ebpf-proxy's fields (camelCase, as the flags
    /// here) and/or a kube-proxy KubeProxyConfiguration, whose applicable
    /// fields are used (healthzBindAddress, metricsBindAddress,
    /// nodePortAddresses, hostnameOverride, clientConnection.kubeconfig).
    /// Flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Read Services and EndpointSlices from this file instead of the
    /// Kubernetes API: a YAML stream of v1 Service and discovery.k8s.io/v1
    /// EndpointSlice objects (as `kubectl get -o yaml` prints them),
    /// re-read when it changes.
    #[arg(long, value_name = "FILE", conflicts_with = "kubeconfig")]
    pub services_file: Option<PathBuf>,
    /// Kubeconfig for the API server. Default: in-cluster service account,
    /// else KUBECONFIG, else ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// cgroup v2 directory to attach the socket programs to (they act on
    /// every process in it and below). Default: the root of the cgroup2
    /// hierarchy, mounted at /run/ebpf-proxy/cgroup2 if none is.
    #[arg(long, value_name = "DIR")]
    pub cgroup: Option<PathBuf>,
    /// Directory on a bpffs where the maps and links are pinned (bpffs is
    /// mounted at /sys/fs/bpf when this lies below it and none is mounted).
    /// Default: /sys/fs/bpf/ebpf-proxy.
    #[arg(long, value_name = "DIR")]
    pub bpffs_dir: Option<PathBuf>,
    /// Name of this node, for internalTrafficPolicy: Local, its zone and its
    /// addresses. Default: the NODE_NAME environment variable, else the
    /// hostname.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// An address of this node: NodePorts are served on it (and on
    /// 127.0.0.1), and an externalIP is served only if it is one of them.
    /// Repeatable. Default: the InternalIP and ExternalIP addresses of this
    /// node's Node object.
    #[arg(long, value_name = "IP")]
    pub node_ip: Vec<std::net::IpAddr>,
    /// When a backend leaves a UDP service, sockets still connected to it
    /// through the service are destroyed (their owners get an error and
    /// reconnect to a live backend): in the agent's network namespace, and
    /// in these (a namespace file, or a directory of them such as
    /// /var/run/netns). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub socket_netns: Vec<PathBuf>,
    /// Where to serve /healthz and /livez. Default: 0.0.0.0:10256 (kube-proxy's).
    #[arg(long, value_name = "ADDR:PORT")]
    pub healthz_bind_address: Option<std::net::SocketAddr>,
    /// Where to serve /metrics and /proxyMode. Default: 127.0.0.1:10249 (kube-proxy's).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_bind_address: Option<std::net::SocketAddr>,
    /// Seconds a change may wait unapplied before /healthz answers 503.
    /// Default: 60.
    #[arg(long, value_name = "SECONDS")]
    pub health_timeout: Option<u64>,
    /// Log every translation the eBPF programs make, at debug level under
    /// the target proxy_ebpf (RUST_LOG=info,proxy_ebpf=debug shows them).
    /// Costs time on every connect: for troubleshooting only.
    #[arg(long)]
    pub bpf_log: bool,
    /// Entries of the services map: one per frontend plus one per backend
    /// slot (allocated as used). Default: 262144.
    #[arg(long)]
    pub services_map_size: Option<u32>,
    /// Entries of the backends map (allocated as used). Default: 131072.
    #[arg(long)]
    pub backends_map_size: Option<u32>,
    /// A network device that traffic from outside arrives on: the TC
    /// programs serve NodePorts, LoadBalancer IPs and externalIPs there.
    /// Repeatable. Default: the devices holding this node's addresses and
    /// the default route (recomputed when the node's addresses change).
    #[arg(long = "devices", value_name = "DEV", value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Entries of each Maglev table (traffic from outside picks backends
    /// with it): a prime from 251 to 131071. Changing it gives the agent a
    /// fresh set of maps (connection tracking starts afresh). Default: 16381.
    #[arg(long, value_name = "N", value_parser = parse_maglev_size)]
    pub maglev_table_size: Option<usize>,
    /// Entries of the connection-tracking map of traffic from outside (two
    /// per flow, LRU). Default: 262144.
    #[arg(long, value_name = "N")]
    pub ct_map_size: Option<u32>,
    /// Frontends whose connection counter is exported as its own series
    /// (ebpf_proxy_service_connections_total), at most; past it the
    /// frontends with the highest ids are left out and counted in
    /// ebpf_proxy_service_series_omitted. 0: none. Default: 1000.
    #[arg(long, value_name = "N")]
    pub max_service_series: Option<usize>,
}

fn parse_maglev_size(text: &str) -> Result<usize, String> {
    let n: usize = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    crate::maglev::check_size(n).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Run the demo's check (requests spread over the backends), print the
    /// result and exit instead of waiting for Ctrl-C.
    #[arg(long)]
    pub check: bool,
}
