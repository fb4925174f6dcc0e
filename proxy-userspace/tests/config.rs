//! The agent started with a real KubeProxyConfiguration document.
mod common;

use std::{process::Command, time::Duration};

use common::{Env, web};
use proxy_testkit::{AgentProcess, field, message};

/// A kube-proxy configuration as operators write it, bound to loopback with
/// free ports, with one misspelt field.
const KUBE_PROXY: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  contentType: application/vnd.kubernetes.protobuf
  qps: 5
clusterCIDR: 10.244.0.0/16
conntrack:
  maxPerCore: 32768
healthzBindAddress: 127.0.0.1:0
iptables:
  masqueradeBit: 14
  syncPeriod: 30s
metricsBindAddress: 127.0.0.2:0
mode: iptables
nodePortAddresses: [10.200.0.0/16]
oomScoreAdj: -999
udpIdelTimeout: 250ms
";

/// The agent's arguments without the test's own health/metrics addresses.
fn args_without_bind(env: &Env, config: &std::path::Path) -> Vec<String> {
    let mut args = env.agent_args();
    let cut = args.iter().position(|a| a == "--healthz-bind-address").expect("set by Env");
    args.truncate(cut); // the bind addresses are the last four
    args.extend(["--config".to_owned(), config.display().to_string()]);
    args
}

fn logged(agent: &AgentProcess, msg: &str) -> serde_json::Value {
    agent
        .wait_for(0, Duration::from_secs(10), |r| message(r).is_some_and(|m| m.starts_with(msg)))
        .unwrap_or_else(|e| panic!("no log {msg:?}: {e}"))
}

#[test]
fn a_kube_proxy_configuration_is_used_and_flags_override_it() {
    common::require_root!();
    let mut env = Env::new(1);
    env.write_services(&web(&[1]));
    let config = env.dir.path().join("kube-proxy.yaml");
    std::fs::write(&config, KUBE_PROXY).unwrap();
    let mut args = args_without_bind(&env, &config);
    args.extend(["--metrics-bind-address".to_owned(), "127.0.0.1:0".to_owned()]);
    let agent = AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
    let _ = agent.wait_applied(0);

    let health = logged(&agent, "serving health");
    assert!(
        field(&health, "address").and_then(|a| a.as_str()).is_some_and(|a| a.starts_with("127.0.0.1:")),
        "{health}"
    );
    let metrics = logged(&agent, "serving metrics");
    assert!(
        field(&metrics, "address").and_then(|a| a.as_str()).is_some_and(|a| a.starts_with("127.0.0.1:")),
        "the flag did not override the file: {metrics}"
    );
    let unknown = logged(&agent, "unknown fields in the config file");
    assert!(unknown.to_string().contains("udpIdelTimeout"), "{unknown}");
    let ignored = logged(&agent, "kube-proxy settings that do not apply");
    assert!(ignored.to_string().contains("iptables") && ignored.to_string().contains("mode"), "{ignored}");
    env.agent = Some(agent);
    assert_eq!(env.requests("10.96.0.10", 3), vec!["backend-1"; 3]);
}

#[test]
fn an_invalid_configuration_stops_startup_with_the_field_named() {
    common::require_root!();
    let env = Env::new(1);
    env.write_services(&web(&[1]));
    let config = env.dir.path().join("bad.yaml");
    std::fs::write(&config, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmetricsBindAddress: localhost-ish\n").unwrap();
    let out = Command::new(common::AGENT).arg("run").args(args_without_bind(&env, &config)).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("metricsBindAddress") && stderr.contains("localhost-ish"), "{stderr}");
}

/// kubeadm's kube-proxy DaemonSet with the binary swapped: no subcommand,
/// `--config=FILE --hostname-override=NAME` (kubeadm's command line, its
/// `config.conf` naming the kubeconfig), and the agent runs from the file.
/// The file also carries this test's cgroup and pin directory (ebpf-proxy's
/// own fields), so nothing attaches to the machine's.
#[test]
fn kubeadms_command_line_runs_the_agent_from_the_file() {
    common::require_root!();
    let mut env = Env::new(2);
    let cluster = common::cluster::Cluster::new();
    let ip = cluster.create_service("web", &[("http", 80)]);
    cluster.set_slice("web-a", "web", &[("http", 8080)], &[common::backend_ip(1), common::backend_ip(2)]);
    let config = env.dir.path().join("config.conf");
    let text = format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
  qps: 5
  burst: 10
healthzBindAddress: 127.0.0.1:0
metricsBindAddress: 127.0.0.1:0
mode: \"\"
cgroup: {cgroup}
bpffsDir: {pins}
socketNetns: [{netns}]
devices: [none]
nodePortRange: none
",
        kubeconfig = cluster.kubeconfig.display(),
        cgroup = env.cgroup.path().display(),
        pins = env.pin_dir().display(),
        netns = env.ns.path().display(),
    );
    std::fs::write(&config, text).unwrap();
    let agent = AgentProcess::start_as_kube_proxy(
        std::path::Path::new(common::AGENT),
        [format!("--config={}", config.display()), "--hostname-override=test-node".to_owned()],
    )
    .unwrap();
    let applied = agent.wait_applied(0);
    assert_eq!(field(&applied, "source").and_then(|s| s.as_str()), Some("kubernetes"), "{applied}");
    let started = logged(&agent, "starting");
    assert_eq!(field(&started, "node").and_then(|n| n.as_str()), Some("test-node"), "--hostname-override: {started}");
    // The file's own fields are used: the test's cgroup, not the machine's.
    let cgroup = env.cgroup.path().display().to_string();
    assert_eq!(field(&started, "cgroup").and_then(|c| c.as_str()), Some(cgroup.as_str()), "{started}");
    // `run`'s environment variables hold on kube-proxy's command line too:
    // the testkit's EBPF_PROXY_EXPLAIN_SOCKET=none, so the machine's
    // default /run/ebpf-proxy/agent.sock is not made (it was, once).
    let serving = |r: &serde_json::Value| message(r) == Some("serving explain's reasons on a local socket");
    assert!(!agent.records().iter().any(serving), "explain served despite EBPF_PROXY_EXPLAIN_SOCKET=none");
    env.agent = Some(agent);
    let answers = env.requests(&ip, 20);
    assert!(answers.iter().any(|a| a == "backend-1") && answers.iter().any(|a| a == "backend-2"), "{answers:?}");
}
