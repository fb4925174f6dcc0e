//! healthCheckNodePort servers: for each LoadBalancer service with
//! externalTrafficPolicy: Local, its port on every node address answers
//! with kube-proxy's JSON, 200 while this node has ready endpoints of the
//! service and 503 when it has none, so a load balancer sends traffic only
//! to nodes that can serve it (they drop it otherwise).
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{Arc, Mutex},
};

use hyper::StatusCode;
use tokio::{net::TcpListener, task::JoinHandle};
use tracing::{info, warn};

use crate::{
    model::{HealthCheck, ObjectRef},
    observe::serve::{self, Reply},
};

/// Whether the proxy itself is healthy (kube-proxy's
/// `serviceProxyHealthy`; when it is not, every port answers 503).
pub(crate) type ProxyHealthy = Arc<dyn Fn() -> bool + Send + Sync>;

struct Server {
    state: Arc<Mutex<(ObjectRef, usize)>>,
    task: JoinHandle<()>,
}

/// The servers, one per port, kept equal to the health checks of the last
/// translation.
pub(crate) struct HealthCheckServers {
    servers: BTreeMap<u16, Server>,
    proxy_healthy: ProxyHealthy,
}

impl HealthCheckServers {
    #[must_use]
    pub(crate) fn new(proxy_healthy: ProxyHealthy) -> Self {
        Self { servers: BTreeMap::new(), proxy_healthy }
    }

    /// Ports being served.
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        self.servers.len()
    }

    /// Serves exactly `checks`: new ports are opened, gone ones closed,
    /// counts updated. A port that cannot be opened is logged (and tried
    /// again on the next update); the others are served.
    pub(crate) async fn update(&mut self, checks: &[HealthCheck]) {
        self.servers.retain(|port, server| {
            let keep = checks.iter().any(|c| c.port == *port);
            if !keep {
                server.task.abort();
                info!(port, service = %server.state.lock().expect("health check lock").0, "health check port closed");
            }
            keep
        });
        for check in checks {
            if let Some(server) = self.servers.get(&check.port) {
                let mut state = server.state.lock().expect("health check lock");
                if state.1 != check.local_endpoints || state.0 != check.service {
                    info!(port = check.port, service = %check.service, local_endpoints = check.local_endpoints, "health check updated");
                }
                *state = (check.service.clone(), check.local_endpoints);
                continue;
            }
            match listen(check.port).await {
                Ok(listener) => {
                    let state = Arc::new(Mutex::new((check.service.clone(), check.local_endpoints)));
                    let handler = handler(state.clone(), self.proxy_healthy.clone());
                    let task = serve::spawn("health check", listener, handler);
                    info!(port = check.port, service = %check.service, local_endpoints = check.local_endpoints, "serving health check port");
                    self.servers.insert(check.port, Server { state, task });
                }
                Err(err) => {
                    warn!(port = check.port, service = %check.service, %err, "cannot open the health check port; load balancers will see this node as down for the service");
                }
            }
        }
    }
}

impl Drop for HealthCheckServers {
    fn drop(&mut self) {
        for server in self.servers.values() {
            server.task.abort();
        }
    }
}

/// Listens on every address: IPv6 and IPv4 where the node has IPv6, else
/// IPv4 only.
async fn listen(port: u16) -> std::io::Result<TcpListener> {
    match TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))).await {
        Ok(listener) => Ok(listener),
        Err(_) => TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))).await,
    }
}

/// kube-proxy's answer, on any path.
fn handler(state: Arc<Mutex<(ObjectRef, usize)>>, proxy_healthy: ProxyHealthy) -> serve::Handler {
    Arc::new(move |_path| {
        let (service, count) = state.lock().expect("health check lock").clone();
        let healthy = proxy_healthy();
        let body = serde_json::json!({
            "service": { "namespace": service.namespace, "name": service.name },
            "localEndpoints": count,
            "serviceProxyHealthy": healthy,
        });
        let status = if count > 0 && healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        let mut reply = Reply::new(status, "application/json", body.to_string());
        reply.headers.push(("x-content-type-options", "nosniff".to_owned()));
        reply.headers.push(("x-load-balancing-endpoint-weight", count.to_string()));
        reply
    })
}
