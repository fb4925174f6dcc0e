//! The cluster a Kubernetes-facing test talks to: the in-repo test API
//! server by default, or a real cluster when `EBPF_PROXY_TEST_KUBECONFIG`
//! names a kubeconfig (then the test works in a namespace it creates and
//! deletes). Writes go through a kube-rs client in both cases.
use std::{net::Ipv4Addr, path::PathBuf};

use k8s_openapi::api::{
    core::v1::{Namespace, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use serde_json::json;

use proxy_testkit::{TestApiServer, kubeconfig_yaml, unique_name};

pub const REAL_CLUSTER_ENV: &str = "EBPF_PROXY_TEST_KUBECONFIG";

pub struct Cluster {
    pub rt: tokio::runtime::Runtime,
    pub client: Client,
    pub kubeconfig: PathBuf,
    pub namespace: String,
    /// The test API server; `None` on a real cluster.
    pub server: Option<TestApiServer>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub fn new() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let (kubeconfig, server) = if let Some(path) = std::env::var_os(REAL_CLUSTER_ENV) {
            (PathBuf::from(path), None)
        } else {
            let server = TestApiServer::start();
            let path = dir.path().join("kubeconfig");
            std::fs::write(&path, kubeconfig_yaml(&server.url())).expect("write kubeconfig");
            (path, Some(server))
        };
        let client = rt
            .block_on(ebpf_proxy::source::kube::client(
                &ebpf_proxy::source::kube::ClientOptions {
                    kubeconfig: Some(kubeconfig.clone()),
                    api_server_endpoint: None,
                    content_type: ebpf_proxy::source::listwatch::ContentType::default(),
                },
                Vec::new(),
            ))
            .expect("kube client")
            .0;
        let namespace = unique_name("ebpf-proxy-test");
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
        rt.block_on(Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns))
            .expect("create namespace");
        Self { rt, client, kubeconfig, namespace, server, _dir: dir }
    }

    pub fn is_real(&self) -> bool {
        self.server.is_none()
    }

    pub fn server(&mut self) -> &mut TestApiServer {
        self.server.as_mut().expect("only with the test API server")
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn slices(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates a selector-less ClusterIP service with TCP ports
    /// `(name, port)`; returns the ClusterIP the server allocated.
    pub fn create_service(&self, name: &str, ports: &[(&str, u16)]) -> String {
        let ports: Vec<_> = ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect();
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"type": "ClusterIP", "ports": ports}
        }))
        .unwrap();
        let created = self.rt.block_on(self.services().create(&PostParams::default(), &svc)).expect("create service");
        created.spec.and_then(|s| s.cluster_ip).expect("allocated clusterIP")
    }

    pub fn delete_service(&self, name: &str) {
        self.rt.block_on(self.services().delete(name, &DeleteParams::default())).expect("delete service");
    }

    /// The slice object for `service` with TCP ports `(name, port)` and
    /// ready endpoints `ips` (on node `test-node`).
    pub fn slice_object(
        &self,
        name: &str,
        service: &str,
        ports: &[(&str, u16)],
        ips: &[Ipv4Addr],
    ) -> serde_json::Value {
        let ports: Vec<_> = ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect();
        let endpoints: Vec<_> = ips
            .iter()
            .map(|ip| json!({"addresses": [ip.to_string()], "conditions": {"ready": true}, "nodeName": "test-node"}))
            .collect();
        json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {
                    "kubernetes.io/service-name": service,
                    "endpointslice.kubernetes.io/managed-by": "ebpf-proxy-test"
                },
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": now_rfc3339()}
            },
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": endpoints
        })
    }

    /// Creates or replaces an EndpointSlice.
    pub fn set_slice(&self, name: &str, service: &str, ports: &[(&str, u16)], ips: &[Ipv4Addr]) {
        let mut slice: EndpointSlice = serde_json::from_value(self.slice_object(name, service, ports, ips)).unwrap();
        let api = self.slices();
        self.rt.block_on(async {
            match api.get_opt(name).await.expect("get slice") {
                Some(existing) => {
                    slice.metadata.resource_version = existing.metadata.resource_version;
                    api.replace(name, &PostParams::default(), &slice).await.expect("replace slice");
                }
                None => {
                    api.create(&PostParams::default(), &slice).await.expect("create slice");
                }
            }
        });
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.is_real() {
            let api = Api::<Namespace>::all(self.client.clone());
            let _ = self.rt.block_on(api.delete(&self.namespace, &DeleteParams::default()));
        }
    }
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}
