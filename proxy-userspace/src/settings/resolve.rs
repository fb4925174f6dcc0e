//! The settings as the agent's parts take them: each unset field is its
//! default, and what only the machine can tell (the cgroup2 root, the
//! hostname) is read.
use std::{path::PathBuf, time::Duration};

use super::{DEFAULT_HEALTH_TIMEOUT, Settings, default_healthz, default_metrics};
use crate::{
    agent::{AgentConfig, DEFAULT_MIN_SYNC_PERIOD, SourceConfig},
    datapath::loader::LoadOptions,
    node::{
        devices::DeviceSelection,
        pod_devices::PodDeviceSelection,
        reserved_ports::{NodePortRange, PortRange},
    },
    observe::metrics::DEFAULT_MAX_SERVICE_SERIES,
    paths::{DEFAULT_EXPLAIN_SOCKET, DEFAULT_PIN_DIR},
    pipeline::DEFAULT_AUDIT_INTERVAL,
    reconcile::{maglev, sizing::DEFAULT_BOUNDS},
    source::kube::ClientOptions,
};

/// Settings the agent cannot start with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SettingsError {
    /// The cluster CIDRs are not at most one per family.
    #[error("--cluster-cidr: {0}")]
    ClusterCidr(String),
    /// No cgroup given, and the cgroup2 root cannot be found or mounted.
    #[error(transparent)]
    Cgroup(#[from] crate::node::fs::FsError),
    /// No node name given, and the hostname cannot be read.
    #[error("no --node-name or NODE_NAME given and the hostname cannot be read")]
    Hostname(#[source] nix::Error),
}

impl Settings {
    /// The pin directory.
    #[must_use]
    pub(crate) fn pin_dir(&self) -> PathBuf {
        self.bpffs_dir.clone().unwrap_or_else(|| DEFAULT_PIN_DIR.into())
    }

    /// Where the Services and EndpointSlices come from: the services file
    /// if one is given, else the API server.
    #[must_use]
    pub(crate) fn source(&self) -> SourceConfig {
        match &self.services_file {
            Some(path) => SourceConfig::File(path.clone()),
            None => SourceConfig::Kube(ClientOptions {
                kubeconfig: self.kubeconfig.clone(),
                api_server_endpoint: self.api_server_endpoint.clone(),
                content_type: self.kube_api_content_type,
            }),
        }
    }

    /// How the datapath is loaded and attached.
    ///
    /// # Errors
    ///
    /// When the cluster CIDRs are more than one of a family, or no cgroup
    /// is given and the cgroup2 root cannot be found.
    pub(crate) fn load_options(&self) -> Result<LoadOptions, SettingsError> {
        super::check::cluster_cidrs(&self.cluster_cidr).map_err(SettingsError::ClusterCidr)?;
        let cgroup = match &self.cgroup {
            Some(path) => path.clone(),
            None => crate::node::fs::cgroup2_root()?,
        };
        Ok(LoadOptions {
            pin_dir: self.pin_dir(),
            cgroup,
            bpf_log: self.bpf_log,
            services_map_size: self.services_map_size.unwrap_or(DEFAULT_BOUNDS.services),
            backends_map_size: self.backends_map_size.unwrap_or(DEFAULT_BOUNDS.backends),
            maglev_size: self.maglev_table_size.unwrap_or(maglev::DEFAULT_SIZE),
            ct_map_size: self.ct_map_size.unwrap_or_else(crate::node::memory::ct_entries_here),
            ct_map_grows: self.ct_map_size.is_none(),
            acceleration: self.nodeport_acceleration.into(),
            outside_handover: self.outside_handover.with_end(self.outside_handover_seconds),
            nodeport_mode: self.nodeport_mode.unwrap_or_default().into(),
            dsr_dispatch: self.dsr_dispatch.unwrap_or_default().into(),
            socket_lb: self.socket_lb.unwrap_or_default().into(),
            cluster_cidrs: self.cluster_cidr.clone(),
        })
    }

    /// The drift audit's interval: 0 turns the timer off.
    #[must_use]
    pub(crate) fn audit_interval(&self) -> Option<Duration> {
        Some(self.audit_interval.unwrap_or(DEFAULT_AUDIT_INTERVAL)).filter(|d| !d.is_zero())
    }

    /// The explain socket: "none" is none.
    #[must_use]
    pub(crate) fn explain_socket(&self) -> Option<PathBuf> {
        match &self.explain_socket {
            Some(path) if path.as_os_str() == "none" => None,
            Some(path) => Some(path.clone()),
            None => Some(DEFAULT_EXPLAIN_SOCKET.into()),
        }
    }

    /// The NodePort range to keep out of the ephemeral ports (`None`:
    /// `none`, the sysctl is left alone).
    #[must_use]
    pub(crate) fn node_port_range(&self) -> Option<PortRange> {
        self.node_port_range.map_or(Some(PortRange::DEFAULT_NODE_PORTS), NodePortRange::range)
    }

    /// The agent's configuration.
    ///
    /// # Errors
    ///
    /// As `load_options`, and when no node name is given and the hostname
    /// cannot be read.
    pub(crate) fn agent_config(self) -> Result<AgentConfig, SettingsError> {
        let load = self.load_options()?;
        let node_name = match &self.node_name {
            Some(name) => name.clone(),
            None => nix::unistd::gethostname().map_err(SettingsError::Hostname)?.to_string_lossy().into_owned(),
        };
        let node_port_range = self.node_port_range();
        let handover_ends =
            (self.outside_handover_seconds != 0).then(|| Duration::from_secs(self.outside_handover_seconds));
        Ok(AgentConfig {
            source: self.source(),
            node_name,
            load,
            audit_interval: self.audit_interval(),
            explain_socket: self.explain_socket(),
            socket_netns: self.socket_netns,
            node_ips: self.node_ip,
            node_port_addresses: self.nodeport_addresses.unwrap_or_default(),
            health_bind: Some(self.healthz_bind_address.unwrap_or_else(default_healthz)),
            metrics_bind: Some(self.metrics_bind_address.unwrap_or_else(default_metrics)),
            health_timeout: self.health_timeout.map_or(DEFAULT_HEALTH_TIMEOUT, Duration::from_secs),
            devices: DeviceSelection::from_names(self.devices),
            pod_devices: PodDeviceSelection::from_names(self.pod_devices),
            max_service_series: self.max_service_series.unwrap_or(DEFAULT_MAX_SERVICE_SERIES),
            min_sync_period: self.min_sync_period.unwrap_or(DEFAULT_MIN_SYNC_PERIOD),
            external_ips_local_only: self.external_ips_local_only,
            lb_algorithm: self.lb_algorithm.unwrap_or_default().into(),
            take_over_from_kube_proxy: self.take_over_from_kube_proxy.then_some(handover_ends),
            node_port_range,
        })
    }
}
