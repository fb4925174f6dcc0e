//! Reaching the API server before any service proxy runs. In a pod, the
//! in-cluster config dials `KUBERNETES_SERVICE_HOST`, the `kubernetes`
//! Service's ClusterIP: on a node where this agent is the service proxy,
//! nothing translates that address until the agent has synced (and after a
//! reboot the pinned maps are gone), so the first list never arrives. When
//! the initial lists have not arrived after a while and the address does
//! not answer, this says so once, with the fix, and the watches go on
//! retrying.
use std::{future::Future, time::Duration};

use tracing::{error, warn};

/// How long the initial lists may take before the API server is probed.
pub(crate) const PROBE_AFTER: Duration = Duration::from_secs(5);
/// How long a probe waits for the TCP handshake.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Where the API server's address came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The in-cluster config: `KUBERNETES_SERVICE_HOST`/`_PORT` (kubelet
    /// sets them to the `kubernetes` Service's ClusterIP, unless the
    /// DaemonSet sets them from the ConfigMap).
    InCluster,
    /// A kubeconfig (`--kubeconfig`, `clientConnection.kubeconfig`,
    /// `KUBECONFIG` or `~/.kube/config`).
    Kubeconfig,
    /// `--api-server-endpoint` / `apiServerEndpoint` / `--master`.
    Endpoint,
}

impl Origin {
    #[must_use]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::InCluster => "in-cluster",
            Self::Kubeconfig => "kubeconfig",
            Self::Endpoint => "api-server-endpoint",
        }
    }
}

/// The API server the client dials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiEndpoint {
    pub(crate) url: String,
    /// `HOST:PORT`, as dialled.
    pub(crate) address: String,
    pub(crate) origin: Origin,
}

impl ApiEndpoint {
    #[must_use]
    pub(crate) fn new(url: &http::Uri, origin: Origin) -> Self {
        let host = url.host().unwrap_or_default();
        let port = url.port_u16().unwrap_or(if url.scheme_str() == Some("http") { 80 } else { 443 });
        Self { url: url.to_string(), address: format!("{host}:{port}"), origin }
    }
}

/// What to tell the operator when the API server does not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Diagnosis {
    /// A stable code (the log's `code` field).
    pub(crate) code: &'static str,
    pub(crate) message: &'static str,
    pub(crate) fix: &'static str,
}

/// The diagnosis of an API server at `endpoint` that does not answer.
#[must_use]
pub(crate) fn diagnose(endpoint: &ApiEndpoint) -> Diagnosis {
    match endpoint.origin {
        Origin::InCluster => Diagnosis {
            code: "InClusterServiceIPUnreachable",
            message: "the API server does not answer at KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT, which \
                      kubelet sets to the `kubernetes` Service's ClusterIP: no service proxy translates it on \
                      this node before ebpf-proxy has synced",
            fix: "name the control plane's real endpoint: the KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT \
                  keys of the ebpf-proxy ConfigMap (deploy/configmap.yaml), or --api-server-endpoint / \
                  apiServerEndpoint HOST:PORT, or a kubeconfig naming it (--kubeconfig, \
                  clientConnection.kubeconfig)",
        },
        Origin::Kubeconfig => Diagnosis {
            code: "KubeconfigServerUnreachable",
            message: "the API server named in the kubeconfig does not answer",
            fix: "check the kubeconfig's server address (a ClusterIP there is not translated before ebpf-proxy has \
                  synced), or name the control plane's endpoint with --api-server-endpoint HOST:PORT",
        },
        Origin::Endpoint => Diagnosis {
            code: "ApiServerEndpointUnreachable",
            message: "the API server endpoint given (--api-server-endpoint, apiServerEndpoint, --master) does not \
                      answer",
            fix: "check the address and port of the control plane's endpoint and that this node can reach it",
        },
    }
}

/// Waits for `ready` (the initial lists); if it has not resolved after
/// `after`, probes the API server's address with a TCP connection and,
/// when that fails, logs the diagnosis once (the watches keep retrying).
pub(crate) async fn explain_while_waiting<F: Future>(ready: F, endpoint: &ApiEndpoint, after: Duration) -> F::Output {
    tokio::pin!(ready);
    tokio::select! {
        out = &mut ready => return out,
        () = tokio::time::sleep(after) => {}
    }
    let probe = tokio::select! {
        out = &mut ready => return out,
        probe = probe(&endpoint.address) => probe,
    };
    if let Err(err) = probe {
        let d = diagnose(endpoint);
        error!(
            code = d.code,
            api_server = %endpoint.address,
            origin = endpoint.origin.name(),
            error = %err,
            fix = d.fix,
            waited_seconds = after.as_secs(),
            "cannot reach the API server: {}; still retrying",
            d.message
        );
    } else {
        warn!(
            api_server = %endpoint.address,
            waited_seconds = after.as_secs(),
            "the initial lists have not arrived although the API server accepts connections; see the watch errors"
        );
    }
    ready.await
}

/// A TCP handshake with `address` (`HOST:PORT`).
async fn probe(address: &str) -> std::io::Result<()> {
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
        Ok(connected) => connected.map(drop),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {}s", PROBE_TIMEOUT.as_secs()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(url: &str, origin: Origin) -> ApiEndpoint {
        ApiEndpoint::new(&url.parse().unwrap(), origin)
    }

    #[test]
    fn the_address_dialled_is_host_and_port() {
        assert_eq!(endpoint("https://10.96.0.1:443", Origin::InCluster).address, "10.96.0.1:443");
        assert_eq!(endpoint("https://cp.example:6443/", Origin::Kubeconfig).address, "cp.example:6443");
        assert_eq!(endpoint("https://[fd00::1]", Origin::Endpoint).address, "[fd00::1]:443");
    }

    /// The in-cluster address is the one that cannot work on a node without
    /// another service proxy: its diagnosis names the ClusterIP and the
    /// three fixes; the others point at the address given.
    #[test]
    fn each_origin_has_its_own_diagnosis() {
        let in_cluster = diagnose(&endpoint("https://10.96.0.1:443", Origin::InCluster));
        assert_eq!(in_cluster.code, "InClusterServiceIPUnreachable");
        assert!(in_cluster.message.contains("ClusterIP"));
        for fix in ["KUBERNETES_SERVICE_HOST", "--api-server-endpoint", "--kubeconfig"] {
            assert!(in_cluster.fix.contains(fix), "{fix}");
        }
        let codes: std::collections::BTreeSet<_> = [Origin::InCluster, Origin::Kubeconfig, Origin::Endpoint]
            .map(|o| diagnose(&endpoint("https://h:1", o)).code)
            .into();
        assert_eq!(codes.len(), 3);
    }

    #[tokio::test]
    async fn a_ready_list_is_never_probed() {
        let e = endpoint("https://127.0.0.1:1", Origin::InCluster);
        assert_eq!(explain_while_waiting(async { 7 }, &e, Duration::from_hours(1)).await, 7);
    }
}
