//! `ebpf-proxy run`.
use tokio::sync::watch;

use crate::{
    agent,
    args::LogFormat,
    config::{self, FileConfig},
    settings::Settings,
};

/// The settings of `run`: its flags over the config file they name, read
/// before logging starts (the file may choose the log format).
#[derive(Debug)]
pub struct Prepared {
    settings: Settings,
    /// The file, for the fields it holds that are not used.
    file: FileConfig,
}

/// Reads the config file `flags` names and lays the flags over it.
pub fn prepare(flags: Settings) -> Result<Prepared, config::ConfigError> {
    let mut file = match &flags.config {
        Some(path) => config::load(path)?,
        None => FileConfig::default(),
    };
    let settings = flags.over(std::mem::take(&mut file.settings));
    Ok(Prepared { settings, file })
}

impl Prepared {
    /// The file's `logging.format`.
    #[must_use]
    pub fn log_format(&self) -> Option<LogFormat> {
        self.settings.log_format
    }

    /// The file's `logging.verbosity`.
    #[must_use]
    pub fn log_verbosity(&self) -> Option<u32> {
        self.settings.log_verbosity
    }

    /// The pin directory (`--bpffs-dir`, else the file's, else the default).
    #[must_use]
    pub fn pin_dir(&self) -> std::path::PathBuf {
        self.settings.pin_dir()
    }
}

/// Runs the agent (`ebpf-proxy run`) until it is stopped.
pub async fn run(prepared: Prepared) -> anyhow::Result<()> {
    let Prepared { settings, file } = prepared;
    if let Some(path) = &settings.config {
        file.log_unused(path);
    }
    let config = settings.agent_config()?;
    tracing::info!(
        source = ?config.source,
        cgroup = %config.load.cgroup.display(),
        node = %config.node_name,
        min_sync_period_ms = config.min_sync_period.as_millis(),
        audit_interval_seconds = config.audit_interval.map(|p| p.as_secs_f64()),
        ct_map_size = config.load.ct_map_size,
        "starting"
    );
    let (applied, _) = watch::channel(agent::Applied::default());
    agent::run(config, applied, shutdown_signal()).await
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
