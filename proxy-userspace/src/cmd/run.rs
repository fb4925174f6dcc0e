//! `ebpf-proxy run`.
use std::time::Duration;

use anyhow::Context as _;
use proxy_common::map_sizes;
use tokio::sync::watch;

use crate::{
    agent::{self, AgentConfig},
    args::LogFormat,
    config::{self, FileConfig},
    datapath::loader::LoadOptions,
    paths::DEFAULT_PIN_DIR,
    reconcile::sizing::DEFAULT_BOUNDS,
    settings::{DEFAULT_HEALTH_TIMEOUT, Settings, default_healthz, default_metrics},
};

/// The `run` arguments and the config file they name, read before logging
/// starts (the file may choose the log format).
#[derive(Debug)]
pub struct Prepared {
    args: Settings,
    file: FileConfig,
}

/// Reads the config file `args` names.
pub fn prepare(args: Settings) -> Result<Prepared, config::ConfigError> {
    let file = match &args.config {
        Some(path) => config::load(path)?,
        None => FileConfig::default(),
    };
    Ok(Prepared { args, file })
}

impl Prepared {
    /// The file's `logging.format`.
    #[must_use]
    pub fn log_format(&self) -> Option<LogFormat> {
        self.file.log_format
    }

    /// The file's `logging.verbosity`.
    #[must_use]
    pub fn log_verbosity(&self) -> Option<u32> {
        self.file.log_verbosity
    }

    /// The pin directory (`--bpffs-dir`, else the file's, else the default).
    #[must_use]
    pub fn pin_dir(&self) -> std::path::PathBuf {
        self.args.bpffs_dir.clone().or_else(|| self.file.bpffs_dir.clone()).unwrap_or_else(|| DEFAULT_PIN_DIR.into())
    }
}

/// Runs the agent (`ebpf-proxy run`) until it is stopped.
pub async fn run(prepared: Prepared) -> anyhow::Result<()> {
    let Prepared { args, file } = prepared;
    if let Some(path) = &args.config {
        file.log_unused(path);
    }
    let config = merge(args, file)?;
    tracing::info!(
        source = ?config.source,
        cgroup = %config.load.cgroup.display(),
        node = %config.node_name,
        min_sync_period_ms = config.min_sync_period.as_millis(),
        audit_interval_seconds = config.audit_interval.map(|p| p.as_secs_f64()),
        "starting"
    );
    let (applied, _) = watch::channel(agent::Applied::default());
    agent::run(config, applied, shutdown_signal()).await
}

/// Flags, then the config file, then defaults.
fn merge(args: Settings, file: FileConfig) -> anyhow::Result<AgentConfig> {
    let services_file = args.services_file.or(file.services_file);
    let kubeconfig = args.kubeconfig.or(file.kubeconfig);
    let source = match services_file {
        Some(path) => agent::SourceConfig::File(path),
        None => agent::SourceConfig::Kube(crate::source::kube::ClientOptions {
            kubeconfig,
            api_server_endpoint: args.api_server_endpoint.or(file.api_server_endpoint),
            content_type: args.kube_api_content_type,
        }),
    };
    let cgroup = match args.cgroup.or(file.cgroup) {
        Some(path) => path,
        None => crate::node::fs::cgroup2_root()?,
    };
    let node_name = match args.node_name.or(file.node_name) {
        Some(name) => name,
        None => nix::unistd::gethostname()
            .context("no --node-name or NODE_NAME given and the hostname cannot be read")?
            .to_string_lossy()
            .into_owned(),
    };
    Ok(AgentConfig {
        source,
        node_name,
        load: LoadOptions {
            pin_dir: args.bpffs_dir.or(file.bpffs_dir).unwrap_or_else(|| DEFAULT_PIN_DIR.into()),
            cgroup,
            bpf_log: args.bpf_log || file.bpf_log.unwrap_or(false),
            services_map_size: args.services_map_size.or(file.services_map_size).unwrap_or(DEFAULT_BOUNDS.services),
            backends_map_size: args.backends_map_size.or(file.backends_map_size).unwrap_or(DEFAULT_BOUNDS.backends),
            maglev_size: args
                .maglev_table_size
                .or(file.maglev_table_size)
                .unwrap_or(crate::reconcile::maglev::DEFAULT_SIZE),
            ct_map_size: args.ct_map_size.or(file.ct_map_size).unwrap_or(map_sizes::CT),
            acceleration: args.nodeport_acceleration.into(),
            outside_handover: args.outside_handover.with_end(args.outside_handover_seconds),
            nodeport_mode: args.nodeport_mode.into(),
            socket_lb: args.socket_lb.or(file.socket_lb).unwrap_or_default().into(),
            cluster_cidrs: {
                let cidrs = flag_or_file(args.cluster_cidr, file.cluster_cidrs);
                crate::datapath::loader::check_cluster_cidrs(&cidrs)
                    .map_err(|e| anyhow::anyhow!("--cluster-cidr: {e}"))?;
                cidrs
            },
        },
        socket_netns: flag_or_file(args.socket_netns, file.socket_netns),
        node_ips: flag_or_file(args.node_ip, file.node_ips),
        node_port_addresses: args.nodeport_addresses.or(file.node_port_addresses).unwrap_or_default(),
        health_bind: Some(args.healthz_bind_address.or(file.healthz_bind_address).unwrap_or_else(default_healthz)),
        metrics_bind: Some(args.metrics_bind_address.or(file.metrics_bind_address).unwrap_or_else(default_metrics)),
        health_timeout: args
            .health_timeout
            .or(file.health_timeout_seconds)
            .map_or(DEFAULT_HEALTH_TIMEOUT, Duration::from_secs),
        devices: crate::node::devices::DeviceSelection::from_names(flag_or_file(args.devices, file.devices)),
        pod_devices: crate::node::pod_devices::PodDeviceSelection::from_names(flag_or_file(
            args.pod_devices,
            file.pod_devices,
        )),
        max_service_series: args
            .max_service_series
            .or(file.max_service_series)
            .unwrap_or(crate::observe::metrics::DEFAULT_MAX_SERVICE_SERIES),
        min_sync_period: file.min_sync_period.unwrap_or(agent::DEFAULT_MIN_SYNC_PERIOD),
        // One timer: the config file's syncPeriod (0s there is kube-proxy's
        // default) is the audit's interval unless the flag sets it.
        audit_interval: Some(
            args.audit_interval.or(file.sync_period).unwrap_or(crate::pipeline::DEFAULT_AUDIT_INTERVAL),
        )
        .filter(|d| !d.is_zero()),
        external_ips_local_only: args.external_ips_local_only,
        lb_algorithm: args.lb_algorithm.map(Into::into).or(file.lb_algorithm).unwrap_or_default(),
        take_over_from_kube_proxy: args.take_over_from_kube_proxy.then_some(
            (args.outside_handover_seconds != 0).then(|| Duration::from_secs(args.outside_handover_seconds)),
        ),
        explain_socket: match args.explain_socket {
            Some(path) if path.as_os_str() == "none" => None,
            Some(path) => Some(path),
            None => Some(crate::paths::DEFAULT_EXPLAIN_SOCKET.into()),
        },
    })
}

/// A repeatable flag given replaces the file's list.
fn flag_or_file<T>(flag: Vec<T>, file: Vec<T>) -> Vec<T> {
    if flag.is_empty() { file } else { flag }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this
/// is called, not when the future is first polled: a signal while the
/// agent loads and reads its maps, before it waits on the future, is kept
/// for it.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    async move {
        tokio::select! {
            _ = int.recv() => tracing::info!("SIGINT received"),
            _ = term.recv() => tracing::info!("SIGTERM received"),
        }
    }
}
