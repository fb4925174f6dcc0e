//! `ebpf-proxy run`.
use anyhow::Context as _;
use tokio::sync::watch;

use crate::{
    agent::{self, AgentConfig},
    args::RunArgs,
    datapath::loader::LoadOptions,
};

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let cgroup = match args.cgroup {
        Some(path) => path,
        None => crate::fs::cgroup2_root()?,
    };
    let node_name = match args.node_name {
        Some(name) => name,
        None => nix::unistd::gethostname()
            .context("no --node-name or NODE_NAME given and the hostname cannot be read")?
            .to_string_lossy()
            .into_owned(),
    };
    let source = match args.services_file {
        Some(path) => agent::SourceConfig::File(path),
        None => agent::SourceConfig::Kube { kubeconfig: args.kubeconfig },
    };
    let config = AgentConfig {
        source,
        node_name,
        load: LoadOptions {
            pin_dir: args.bpffs_dir,
            cgroup,
            bpf_log: args.bpf_log,
            services_map_size: args.services_map_size,
            backends_map_size: args.backends_map_size,
        },
        socket_netns: args.socket_netns,
        node_ips: args.node_ip,
        health_bind: Some(args.healthz_bind_address),
        metrics_bind: Some(args.metrics_bind_address),
        health_timeout: std::time::Duration::from_secs(args.health_timeout),
    };
    tracing::info!(
        source = ?config.source,
        cgroup = %config.load.cgroup.display(),
        node = %config.node_name,
        "starting"
    );
    let (applied, _) = watch::channel(agent::Applied::default());
    agent::run(config, applied, shutdown_signal()).await
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        _ = term.recv() => tracing::info!("SIGTERM received"),
    }
}
