//! The manifests in deploy/: every object is a valid Kubernetes object of
//! its kind with no unknown field, the DaemonSet has what a node proxy
//! needs, the kustomization builds, and the ClusterRole grants exactly the
//! API calls the agent makes (recorded by the test API server).
mod common;

use std::{collections::BTreeSet, path::PathBuf, process::Command};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{ConfigMap, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn load(name: &str) -> Value {
    let text = std::fs::read_to_string(deploy_dir().join(name)).unwrap();
    serde_norway::from_str(&text).unwrap()
}

/// Decodes `value` as `T` and encodes it again: a field the type does not
/// know (a typo) is lost on the way, so the two differ.
fn round_trip<T: DeserializeOwned + Serialize>(name: &str, value: &Value) -> T {
    let typed: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(&serde_json::to_value(&typed).unwrap(), value, "{name}: a field is unknown to its kind");
    typed
}

#[test]
fn every_manifest_is_a_valid_object_of_its_kind() {
    round_trip::<ServiceAccount>("serviceaccount.yaml", &load("serviceaccount.yaml"));
    round_trip::<ClusterRole>("clusterrole.yaml", &load("clusterrole.yaml"));
    round_trip::<ClusterRoleBinding>("clusterrolebinding.yaml", &load("clusterrolebinding.yaml"));
    let cm: ConfigMap = round_trip("configmap.yaml", &load("configmap.yaml"));
    let config = cm.data.unwrap()["config.yaml"].clone();
    let parsed = ebpf_proxy::config::parse(&config).expect("the ConfigMap's config parses");
    assert!(parsed.unknown.is_empty(), "{:?}", parsed.unknown);

    let ds: DaemonSet = round_trip("daemonset.yaml", &load("daemonset.yaml"));
    let pod = ds.spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    assert_eq!(pod.service_account_name.as_deref(), Some("ebpf-proxy"));
    assert!(pod.tolerations.unwrap().iter().any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()));
    let c = &pod.containers[0];
    assert_eq!(c.security_context.as_ref().and_then(|s| s.privileged), Some(true));
    let node_name = c.env.as_ref().unwrap().iter().find(|e| e.name == "NODE_NAME").expect("NODE_NAME");
    assert_eq!(node_name.value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path, "spec.nodeName");
    let mounts: BTreeSet<&str> = c.volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
    assert!(mounts.contains("/sys/fs/bpf") && mounts.contains("/sys/fs/cgroup"), "{mounts:?}");
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref().and_then(|p| p.http_get.as_ref()).map(|h| (h.path.clone().unwrap_or_default(), h.port.clone()))
    };
    let port = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(10256);
    assert_eq!(probe_path(&c.liveness_probe), Some(("/livez".to_owned(), port.clone())));
    assert_eq!(probe_path(&c.readiness_probe), Some(("/healthz".to_owned(), port)));
}

/// `kubectl kustomize deploy/`: the objects an operator applies.
fn built() -> Vec<Value> {
    let out = Command::new("kubectl").arg("kustomize").arg(deploy_dir()).output().expect("kubectl (cargo xtask setup)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_norway::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout))
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

#[test]
fn the_kustomization_builds() {
    let kinds: BTreeSet<String> = built().iter().map(|v| v["kind"].as_str().unwrap_or("").to_owned()).collect();
    let want: BTreeSet<String> = ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(kinds, want);
}

/// The built DaemonSet pulls from a registry named as a placeholder to
/// replace (never a bare `ebpf-proxy:latest` that pulls from nowhere), and
/// takes the API server's endpoint from the ConfigMap when it is set there:
/// as Cilium's k8sServiceHost/k8sServicePort, since kubelet's
/// KUBERNETES_SERVICE_HOST is the `kubernetes` Service's ClusterIP, which
/// nothing translates before the agent has synced.
#[test]
fn the_built_daemonset_has_the_image_placeholder_and_the_endpoint_setting() {
    let objects = built();
    let ds = objects.iter().find(|o| o["kind"] == "DaemonSet").expect("DaemonSet");
    let ds: DaemonSet = serde_json::from_value(ds.clone()).unwrap();
    let c = &ds.spec.template.spec.unwrap().containers[0];
    let image = c.image.as_deref().unwrap();
    assert_eq!(image, format!("registry.example.com/ebpf-proxy:{}", env!("CARGO_PKG_VERSION")));
    let cm = objects.iter().find(|o| o["kind"] == "ConfigMap").expect("ConfigMap");
    for var in ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"] {
        let env = c.env.iter().flatten().find(|e| e.name == var).unwrap_or_else(|| panic!("{var}"));
        let key =
            env.value_from.as_ref().and_then(|v| v.config_map_key_ref.as_ref()).unwrap_or_else(|| panic!("{var}"));
        assert_eq!((key.name.as_str(), key.key.as_str()), (cm["metadata"]["name"].as_str().unwrap(), var));
        assert_eq!(key.optional, Some(true), "{var}: unset, kubelet's value stays");
    }
    // The image is built from the sources alone.
    let ignore = std::fs::read_to_string(deploy_dir().join("../.containerignore")).unwrap();
    assert!(ignore.lines().any(|l| l.trim() == "target/"), "{ignore}");
}

#[test]
fn the_cluster_role_grants_exactly_the_calls_the_agent_makes() {
    common::require_root!();
    let mut env = common::Env::new(1);
    let server = proxy_testkit::TestApiServer::start();
    server.put(json!({"kind": "Service", "metadata": {"name": "web", "namespace": "t"}, "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]}}));
    server.put(json!({"kind": "EndpointSlice", "metadata": {"name": "web-1", "namespace": "t", "labels": {"kubernetes.io/service-name": "web"}}, "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": [{"addresses": ["10.244.0.11"]}]}));
    server.put(json!({"kind": "Node", "metadata": {"name": "test-node"}}));
    let kubeconfig = env.dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, format!("apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster: {{server: \"{}\"}}\nusers:\n- name: t\n  user: {{}}\ncontexts:\n- name: t\n  context: {{cluster: t, user: t}}\ncurrent-context: t\n", server.url())).unwrap();
    let mut args = vec!["--kubeconfig".to_owned(), kubeconfig.display().to_string()];
    args.extend(env.datapath_args());
    let agent = proxy_testkit::AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
    let _ = agent.wait_applied(0);
    std::thread::sleep(std::time::Duration::from_millis(500)); // the watches open, the event is sent
    env.agent = Some(agent);
    assert_eq!(env.requests("10.96.0.10", 1), vec!["backend-1"]);

    let used: BTreeSet<(String, String, String)> = server
        .requests()
        .iter()
        .map(|r| {
            let parts: Vec<&str> = r.path.trim_matches('/').split('/').collect();
            let (group, rest) = if parts[0] == "api" { ("", &parts[2..]) } else { (parts[1], &parts[3..]) };
            let (resource, named) = match rest {
                ["namespaces", _, resource, ..] if rest.len() > 3 => (*resource, true),
                ["namespaces", _, resource] | [resource] => (*resource, false),
                [resource, _name] => (*resource, true),
                _ => panic!("unexpected path {}", r.path),
            };
            let verb = match (r.method.as_str(), named, r.watch) {
                ("GET", false, true) => "watch",
                ("GET", false, false) => "list",
                ("GET", true, _) => "get",
                ("POST", ..) => "create",
                ("PATCH", ..) => "patch",
                ("PUT", ..) => "update",
                ("DELETE", ..) => "delete",
                (m, ..) => panic!("unexpected request {m} {}", r.path),
            };
            (verb.to_owned(), group.to_owned(), resource.to_owned())
        })
        .collect();
    let role: ClusterRole = serde_json::from_value(load("clusterrole.yaml")).unwrap();
    let granted: BTreeSet<(String, String, String)> = role
        .rules
        .unwrap()
        .iter()
        .flat_map(|rule| {
            let groups = rule.api_groups.clone().unwrap_or_default();
            let resources = rule.resources.clone().unwrap_or_default();
            let verbs = rule.verbs.clone();
            groups.into_iter().flat_map(move |g| {
                let verbs = verbs.clone();
                resources.clone().into_iter().flat_map(move |r| {
                    let g = g.clone();
                    verbs.clone().into_iter().map(move |v| (v, g.clone(), r.clone()))
                })
            })
        })
        .collect();
    assert_eq!(used, granted, "the ClusterRole must grant exactly what the agent calls");
}

#[test]
fn kubectl_apply_dry_run_accepts_the_manifests() {
    let server = proxy_testkit::TestApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, format!("apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster: {{server: \"{}\"}}\nusers:\n- name: t\n  user: {{}}\ncontexts:\n- name: t\n  context: {{cluster: t, user: t}}\ncurrent-context: t\n", server.url())).unwrap();
    // Client-side dry run maps each kind through the server's discovery; the
    // schema check (--validate) needs the server's OpenAPI document, which
    // the test server does not have: the typed round trip above stands in.
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["apply", "--dry-run=client", "--validate=false", "-k"])
        .arg(deploy_dir())
        .output()
        .expect("kubectl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().filter(|l| l.ends_with("created (dry run)")).count(), 5, "{stdout}");
}

/// deploy/monitoring: the metrics Service reaches the DaemonSet's pods on
/// the metrics port, the ServiceMonitor scrapes that port under the job
/// name the kubernetes-mixin selects, and the dashboard's queries name
/// metrics the agent exports.
#[test]
fn the_monitoring_kustomization_matches_the_agent() {
    let dir = deploy_dir().join("monitoring");
    let out = Command::new("kubectl").arg("kustomize").arg(&dir).output().expect("kubectl (cargo xtask setup)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let objects: Vec<Value> = serde_norway::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout))
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let of_kind = |kind: &str| objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));
    let service: k8s_openapi::api::core::v1::Service = round_trip("metrics-service.yaml", of_kind("Service"));
    let spec = service.spec.unwrap();
    let daemonset = load("daemonset.yaml");
    let pod_labels = &daemonset["spec"]["template"]["metadata"]["labels"];
    for (k, v) in spec.selector.unwrap() {
        assert_eq!(pod_labels[&k], v.as_str(), "the Service selects the agent's pods by {k}");
    }
    let port = &spec.ports.unwrap()[0];
    let default_metrics: std::net::SocketAddr = ebpf_proxy::paths::DEFAULT_METRICS.parse().unwrap();
    assert_eq!(port.port, i32::from(default_metrics.port()));
    let monitor = of_kind("ServiceMonitor");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"].as_str(), port.name.as_deref());
    for (k, v) in monitor["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&service.metadata.labels.as_ref().unwrap()[k], v.as_str().unwrap());
    }
    assert!(
        monitor["spec"]["endpoints"][0]["relabelings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["replacement"] == "kube-proxy")
    );

    let dashboard: Value =
        serde_json::from_str(of_kind("ConfigMap")["data"]["ebpf-proxy-dashboard.json"].as_str().unwrap())
            .expect("the dashboard is JSON");
    let sources = [
        include_str!("../src/observe/telemetry.rs"),
        include_str!("../src/observe/metrics.rs"),
        include_str!("../src/observe/process_metrics.rs"),
    ];
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    for expr in panels.iter().flat_map(|p| p["targets"].as_array().unwrap()).map(|t| t["expr"].as_str().unwrap()) {
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| ["ebpf_proxy_", "kubeproxy_", "process_"].iter().any(|p| w.starts_with(p)))
        {
            // Registered names: counters without _total, histograms without _bucket.
            let registered = name.trim_end_matches("_total").trim_end_matches("_bucket");
            assert!(
                sources.iter().any(|s| s.contains(&format!("\"{registered}\""))),
                "{name} in {expr:?} is not a metric the agent exports"
            );
        }
    }
}
