//! An agent left to dial the `kubernetes` Service's ClusterIP (the
//! in-cluster config on a node with no other service proxy) says so, with
//! the fix, instead of retrying silently. The agent runs in a network
//! namespace of the test, where the service range has no route, so nothing
//! leaves the machine; and in a mount namespace of its own, where the
//! service account's files are a tmpfs the test fills. Stopped before its
//! first write, it leaves no pins behind.
mod common;

use std::{path::Path, process::Command, time::Duration};

use proxy_testkit::{AgentProcess, BpfFs, NetNs, TestCgroup, field, spawn_in, unique_name};

/// The in-cluster service account, with a CA certificate made for the test.
fn service_account(dir: &Path) {
    std::fs::write(dir.join("token"), "test-token").unwrap();
    std::fs::write(dir.join("namespace"), "kube-system").unwrap();
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=test-ca", "-keyout"])
        .arg(dir.join("ca.key"))
        .arg("-out")
        .arg(dir.join("ca.crt"))
        .output()
        .expect("openssl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(dir.join("ca.key")).unwrap();
}

#[test]
fn an_unreachable_in_cluster_api_server_is_explained_within_seconds() {
    common::require_root!();
    let name = unique_name("ebpf-proxy-boot");
    let ns = NetNs::create(&name).expect("netns");
    let cgroup = TestCgroup::create(&name).expect("cgroup");
    let bpffs = BpfFs::mount_temp(&name).expect("bpffs");
    let dir = tempfile::tempdir().unwrap();
    service_account(dir.path());
    // In the agent's own mount namespace, /run (and so /var/run/secrets) is
    // a tmpfs holding the service account: the machine's /run is untouched.
    let script = "mount -t tmpfs tmpfs /run && d=/run/secrets/kubernetes.io/serviceaccount && mkdir -p $d \
                  && cp \"$SA\"/* $d/ && exec \"$@\"";
    let mut cmd = spawn_in(&ns, None, "unshare").unwrap();
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", script, "sh", common::AGENT])
        .env("SA", dir.path())
        // What kubelet sets in a pod: the `kubernetes` Service's ClusterIP,
        // which has no route in the test's namespace.
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        .env("KUBERNETES_SERVICE_PORT", "443")
        .env_remove("KUBECONFIG");
    let pin_dir = bpffs.path().join("ebpf-proxy");
    let args = [
        "--cgroup",
        &cgroup.path().display().to_string(),
        "--bpffs-dir",
        &pin_dir.display().to_string(),
        "--node-name",
        "test-node",
        "--healthz-bind-address",
        "127.0.0.1:0",
        "--metrics-bind-address",
        "127.0.0.1:0",
        "--devices",
        "none",
        "--pod-devices",
        "none",
    ]
    .map(str::to_owned);
    let mut agent = AgentProcess::start_command(cmd, args).expect("start agent");

    let record = agent
        .wait_for(0, Duration::from_secs(30), |r| {
            field(r, "code").and_then(|c| c.as_str()) == Some("InClusterServiceIPUnreachable")
        })
        .unwrap_or_else(|e| panic!("no explanation logged: {e}"));
    assert_eq!(field(&record, "api_server").and_then(|a| a.as_str()), Some("10.96.0.1:443"), "{record}");
    assert_eq!(field(&record, "origin").and_then(|a| a.as_str()), Some("in-cluster"), "{record}");
    assert!(field(&record, "fix").and_then(|f| f.as_str()).is_some_and(|f| f.contains("KUBERNETES_SERVICE_HOST")));
    assert_eq!(record["level"], "ERROR", "{record}");
    // It keeps retrying: the process stays.
    assert!(agent.is_running(), "the agent must keep retrying");
    // Its maps are made (the programs are attached only after the first
    // write); stopped before that, it removes them: nothing used them.
    let maps = || -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(&pin_dir) else { return Vec::new() };
        dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("maps-")).collect()
    };
    assert!(!maps().is_empty(), "the agent made no maps while it waited");
    agent.stop();
    assert_eq!(maps(), Vec::<String>::new(), "a start stopped before its first write left its maps pinned");
}
