//! Command-line arguments.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{
    paths::DEFAULT_PIN_DIR,
    settings::{Settings, check},
};

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
    #[arg(long, value_name = "URL", value_parser = check::endpoint)]
    pub(crate) master: Option<String>,
    /// Where to serve /healthz and /livez: IP:PORT or IP.
    #[arg(long, value_name = "ADDR", value_parser = check::healthz_address)]
    pub(crate) healthz_bind_address: Option<std::net::SocketAddr>,
    /// Where to serve /metrics and /proxyMode: IP:PORT or IP.
    #[arg(long, value_name = "ADDR", value_parser = check::metrics_address)]
    pub(crate) metrics_bind_address: Option<std::net::SocketAddr>,
    /// Which of the node's local addresses serve NodePorts (kube-proxy's
    /// --nodeport-addresses, overrides the config file's
    /// nodePortAddresses): comma-separated CIDRs (the local addresses
    /// inside them; a family no CIDR names is not narrowed; 127.0.0.1 only
    /// if a CIDR covers it), or `primary` (the node's first IP of each
    /// family, no 127.0.0.1). Default: every local address of every device
    /// and 127.0.0.1, followed as addresses come and go.
    #[arg(long, value_name = "CIDRS|primary", value_parser = check::nodeport_addresses)]
    pub(crate) nodeport_addresses: Option<crate::node::nodeport_addresses::NodePortAddresses>,
    /// The cluster's pod CIDRs, one per family, comma-separated (overrides
    /// the config file's clusterCIDR): packets routed to this node for a
    /// ClusterIP are translated, with source NAT when they come from
    /// outside them.
    #[arg(long = "cluster-cidr", value_name = "CIDRS", value_delimiter = ',', value_parser = check::cidr)]
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

    /// The settings these flags mean; the rest as `ebpf-proxy run`
    /// with no flag takes them, environment variables included
    /// (`EBPF_PROXY_EXPLAIN_SOCKET`, and `NODE_NAME` without
    /// `--hostname-override`).
    ///
    /// # Errors
    ///
    /// When such a variable cannot be read (not UTF-8).
    pub fn into_settings(self) -> Result<Settings, clap::Error> {
        use clap::FromArgMatches as _;
        let matches = Settings::augment_args(clap::Command::new("run")).try_get_matches_from(["run"])?;
        let from_env = Settings::from_arg_matches(&matches)?;
        Ok(Settings {
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

/// klog's verbosity as a `tracing` level filter.
#[must_use]
pub fn level_for_verbosity(v: u32) -> &'static str {
    match v {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
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
    Run(Box<Settings>),
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
        let run = cli.kube_proxy.into_settings().unwrap();
        assert_eq!(run.config.as_deref(), Some(std::path::Path::new("/var/lib/kube-proxy/config.conf")));
        assert_eq!(run.node_name.as_deref(), Some("node-1"));
        let cli = Cli::try_parse_from(["ebpf-proxy", "--master", "https://192.168.0.10:6443", "-v", "4"]).unwrap();
        assert_eq!(cli.kube_proxy.verbosity, Some(4));
        assert_eq!(cli.kube_proxy.into_settings().unwrap().api_server_endpoint.as_deref(), Some("192.168.0.10:6443"));
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
                Some(Command::Run(r)) => Mode::from(r.nodeport_mode.unwrap_or_default()).value(),
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
        assert_eq!(check::map_size(0), Err("0 is not in 1..=16777216".into()));
        assert_eq!(check::map_size(4), Ok(4));
    }
}
