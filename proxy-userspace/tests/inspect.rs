//! `ebpf-proxy service list | get` read the pinned maps, with the agent
//! running and after it stopped.
mod common;

use std::process::Command;

use common::{Env, backend_ip, service, slice};

fn service_cmd(env: &Env, args: &[&str]) -> (bool, String) {
    let out = Command::new(common::AGENT)
        .arg("service")
        .args(args)
        .arg("--bpffs-dir")
        .arg(env.pin_dir())
        .output()
        .expect("run ebpf-proxy service");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

const EXPECTED: &str = "\
ID  FRONTEND          TYPE                  BACKENDS
1   10.96.0.10:80/TCP  ClusterIP             10.244.0.11:8080 (active, local), 10.244.0.12:8080 (active, local)
2   10.96.0.11:80/TCP  ClusterIP affinity=60s  (none: connections are refused)
";

#[test]
fn service_list_shows_the_kernel_table_with_and_without_the_agent() {
    common::require_root!();
    let mut env = Env::new(2);
    let yaml = service("web", "10.96.0.10", &[("http", 80)])
        + &slice("web-1", "web", &[("http", 8080)], &[backend_ip(1), backend_ip(2)])
        + &service("sticky", "10.96.0.11", &[("http", 80)]).replace(
            "  type: ClusterIP\n",
            "  type: ClusterIP\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n",
        );
    env.write_services(&yaml);
    env.start_agent();

    let expected: String =
        EXPECTED.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") + "\n").collect();
    let squash =
        |t: &str| -> String { t.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") + "\n").collect() };
    let (ok, text) = service_cmd(&env, &["list"]);
    assert!(ok, "{text}");
    assert_eq!(squash(&text), expected);

    env.agent.take(); // stopped: the maps stay, and so does the answer
    let (ok, again) = service_cmd(&env, &["list"]);
    assert!(ok, "{again}");
    assert_eq!(again, text);

    let (ok, json) = service_cmd(&env, &["list", "-o", "json"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["address"], "10.96.0.10");
    assert_eq!(v[0]["type"], "ClusterIP");
    assert_eq!(v[0]["backends"][1]["address"], "10.244.0.12");
    assert_eq!(v[1]["affinity_timeout"], 60);

    let (ok, one) = service_cmd(&env, &["get", "10.96.0.11:80/TCP"]);
    assert!(ok, "{one}");
    assert_eq!(one.lines().count(), 2, "{one}");
    assert!(one.contains("affinity=60s"));
    let (ok, none) = service_cmd(&env, &["get", "10.96.0.99:80"]);
    assert!(!ok && none.contains("no frontend 10.96.0.99:80"), "{none}");
}

#[test]
fn status_shows_the_attached_programs_and_the_maps() {
    use std::os::unix::fs::MetadataExt as _;
    common::require_root!();
    let mut env = Env::new(1);
    env.write_services(
        &(service("web", "10.96.0.10", &[("http", 80)]) + &slice("web-1", "web", &[("http", 8080)], &[backend_ip(1)])),
    );
    env.start_agent();
    let status = |env: &Env| {
        let out = Command::new(common::AGENT).args(["status", "--bpffs-dir"]).arg(env.pin_dir()).output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let cgroup_id = std::fs::metadata(env.cgroup.path()).unwrap().ino();
    let text = status(&env);
    for program in
        ["connect4", "connect6", "sendmsg4", "sendmsg6", "recvmsg4", "recvmsg6", "getpeername4", "getpeername6"]
    {
        let line =
            text.lines().find(|l| l.trim_start().starts_with(program)).unwrap_or_else(|| panic!("{program}: {text}"));
        assert!(line.ends_with(&format!("cgroup id {cgroup_id}")), "{line}");
    }
    assert!(text.contains("frontends: 1 (0 without backends), backend slots: 1"), "{text}");
    env.agent.take();
    assert_eq!(status(&env), text, "the same with the agent stopped");

    let out = Command::new(common::AGENT).args(["cleanup", "--bpffs-dir"]).arg(env.pin_dir()).output().unwrap();
    assert!(out.status.success());
    assert!(status(&env).starts_with("no datapath"));
}
