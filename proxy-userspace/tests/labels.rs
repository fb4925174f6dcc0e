//! Services that are not this proxy's, by label, as kube-proxy leaves them
//! out: its Service informer selects
//! `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`
//! (cmd/kube-proxy/app/server.go), so such a Service is never proxied, and
//! one that gets the label later is removed. The real agent against the
//! test API server (which honours labelSelector) or a real cluster.
mod common;

use std::time::Duration;

use common::{Env, backend_ip, cluster::Cluster};
use k8s_openapi::api::core::v1::Service;
use kube::{Api, api::PostParams};
use proxy_testkit::message;
use serde_json::json;

const HTTP: &[(&str, u16)] = &[("http", 80)];
const TARGET: &[(&str, u16)] = &[("http", 8080)];

/// Creates service `name` with `labels`; returns its ClusterIP.
fn labelled_service(cluster: &Cluster, name: &str, labels: &serde_json::Value) -> String {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": cluster.namespace, "labels": labels},
        "spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .unwrap();
    let api: Api<Service> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let created = cluster.rt.block_on(api.create(&PostParams::default(), &svc)).expect("create service");
    created.spec.and_then(|s| s.cluster_ip).expect("clusterIP")
}

#[test]
fn services_labelled_headless_or_for_another_proxy_are_not_proxied() {
    common::require_root!();
    let mut env = Env::new(1);
    let cluster = Cluster::new();
    let web = cluster.create_service("web", HTTP);
    cluster.set_slice("web-a", "web", TARGET, &[backend_ip(1)]);
    let headless = labelled_service(&cluster, "marked-headless", &json!({"service.kubernetes.io/headless": ""}));
    cluster.set_slice("marked-headless-a", "marked-headless", TARGET, &[backend_ip(1)]);
    let other = labelled_service(&cluster, "other-proxy", &json!({"service.kubernetes.io/service-proxy-name": "x"}));
    cluster.set_slice("other-proxy-a", "other-proxy", TARGET, &[backend_ip(1)]);
    env.start_agent_kube(&cluster);

    assert_eq!(env.requests(&web, 3), vec!["backend-1"; 3]);
    for ip in [&headless, &other] {
        let (ok, err) = env.socat_connect(true, &format!("{ip}:80"));
        assert!(!ok && err.contains("Network is unreachable"), "{ip}: a labelled service is proxied: {err}");
    }

    // The label added later: the watch drops the Service, and so does the agent.
    let api: Api<Service> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let mark = env.agent().mark();
    cluster.rt.block_on(async {
        let mut svc = api.get("web").await.expect("get web");
        svc.metadata.labels.get_or_insert_default().insert("service.kubernetes.io/headless".into(), String::new());
        api.replace("web", &PostParams::default(), &svc).await.expect("label web");
    });
    env.agent()
        .wait_for(mark, Duration::from_secs(20), |r| message(r) == Some("service frontend removed"))
        .expect("the labelled service is removed");
    let (ok, err) = env.socat_connect(true, &format!("{web}:80"));
    assert!(!ok && err.contains("Network is unreachable"), "web still proxied after its label: {err}");
}
