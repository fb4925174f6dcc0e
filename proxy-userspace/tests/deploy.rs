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
    serde_yaml::from_str(&text).unwrap()
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

#[test]
fn the_kustomization_builds() {
    let out = Command::new("kubectl").arg("kustomize").arg(deploy_dir()).output().expect("kubectl (cargo xtask setup)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let kinds: BTreeSet<String> = serde_yaml::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout))
        .map(|d| {
            serde::Deserialize::deserialize(d).map(|v: Value| v["kind"].as_str().unwrap_or("").to_owned()).unwrap()
        })
        .collect();
    let want: BTreeSet<String> = ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(kinds, want);
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
