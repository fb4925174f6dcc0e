//! `ebpf-proxy service list | get` and `status` read the pinned maps, with
//! the agent running and after it stopped; `--version` and `completion`.
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
ID  FRONTEND          SERVICE  TYPE                  BACKENDS
1   10.96.0.10:80/TCP  test/web:http  ClusterIP             10.244.0.11:8080 (active, local, 0 connections), 10.244.0.12:8080 (active, local, 0 connections)
2   10.96.0.11:80/TCP  test/sticky:http  ClusterIP affinity=60s  (none: connections are refused)
3   10.96.0.11:443/TCP  test/sticky:https  ClusterIP affinity=60s  (none: connections are refused)
";

/// Every line with its runs of blanks made one space (the columns' widths
/// are the formatting's business, tested in the unit tests).
fn squash(text: &str) -> String {
    text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") + "\n").collect()
}

/// What `service` shows of the services of
/// `service_list_shows_the_kernel_table_with_and_without_the_agent`; the
/// same whether the agent runs or not.
fn check_service_views(env: &Env) -> String {
    let (ok, text) = service_cmd(env, &["list"]);
    assert!(ok, "{text}");
    assert_eq!(squash(&text), squash(EXPECTED));

    // One service, then one port of it.
    let (ok, sticky) = service_cmd(env, &["list", "--service", "test/sticky"]);
    assert!(ok, "{sticky}");
    assert_eq!(
        squash(&sticky),
        squash(&EXPECTED.lines().enumerate().filter(|(i, _)| *i != 1).fold(String::new(), |s, (_, l)| s + l + "\n"))
    );
    let (ok, https) = service_cmd(env, &["list", "--service", "test/sticky:https", "-o", "json"]);
    assert!(ok, "{https}");
    let v: serde_json::Value = serde_json::from_str(&https).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{https}");
    assert_eq!((v[0]["port"].as_u64(), v[0]["port_name"].as_str()), (Some(443), Some("https")));
    let (ok, nobody) = service_cmd(env, &["list", "--service", "test/nobody"]);
    assert!(ok && nobody.lines().count() == 1, "only the header: {nobody}");
    let (ok, bad) = service_cmd(env, &["list", "--service", "sticky"]);
    assert!(!ok && bad.contains("NAMESPACE/NAME"), "{bad}");

    let (ok, json) = service_cmd(env, &["list", "-o", "json"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["address"], "10.96.0.10");
    assert_eq!(
        (&v[0]["namespace"], &v[0]["name"], &v[0]["port_name"]),
        (&"test".into(), &"web".into(), &"http".into())
    );
    assert_eq!(v[0]["type"], "ClusterIP");
    assert_eq!(v[0]["backends"][1]["address"], "10.244.0.12");
    assert_eq!(v[1]["affinity_timeout"], 60);

    let (ok, one) = service_cmd(env, &["get", "10.96.0.11:80/TCP"]);
    assert!(ok, "{one}");
    assert_eq!(one.lines().count(), 2, "{one}");
    assert!(one.contains("affinity=60s") && one.contains(" test/sticky:http "), "{one}");
    let (ok, none) = service_cmd(env, &["get", "10.96.0.99:80"]);
    assert!(!ok && none.contains("no frontend 10.96.0.99:80"), "{none}");
    text
}

#[test]
fn service_list_shows_the_kernel_table_with_and_without_the_agent() {
    common::require_root!();
    let mut env = Env::new(2);
    let yaml = service("web", "10.96.0.10", &[("http", 80)])
        + &slice("web-1", "web", &[("http", 8080)], &[backend_ip(1), backend_ip(2)])
        + &service("sticky", "10.96.0.11", &[("http", 80), ("https", 443)]).replace(
            "  type: ClusterIP\n",
            "  type: ClusterIP\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n",
        );
    env.write_services(&yaml);
    env.start_agent();
    let text = check_service_views(&env);
    env.agent.take(); // stopped: the maps stay, and so do the answers
    assert_eq!(check_service_views(&env), text);
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
    check_status_json(&env, &text);
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
    check_status_json(&env, &text);

    let out = Command::new(common::AGENT).args(["cleanup", "--bpffs-dir"]).arg(env.pin_dir()).output().unwrap();
    assert!(out.status.success());
    assert!(status(&env).starts_with("no datapath"));
}

/// `status -o json` parses and says what the text says.
fn check_status_json(env: &Env, text: &str) {
    let out =
        Command::new(common::AGENT).args(["status", "-o", "json", "--bpffs-dir"]).arg(env.pin_dir()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pinned"], true);
    assert_eq!(v["pin_directory"], env.pin_dir().display().to_string());
    let programs = v["programs"].as_array().unwrap();
    assert!(!programs.is_empty());
    for p in programs {
        let line = format!(
            "{:<24} link {:<6} program {:<6} {}",
            p["name"].as_str().unwrap(),
            p["link_id"].as_u64().unwrap(),
            p["program_id"].as_u64().unwrap(),
            p["target"].as_str().unwrap()
        );
        assert!(text.lines().any(|l| l.trim() == line), "{line} not in\n{text}");
    }
    let m = &v["maps"];
    let line = format!(
        "frontends: {} ({} without backends), backend slots: {}",
        m["frontends"], m["frontends_without_backends"], m["backend_slots"]
    );
    assert!(text.contains(&line), "{line} not in\n{text}");
    let line = format!(
        "map SERVICES: {} of {} entries, map BACKENDS: {} of {} entries",
        m["services_map_entries"], m["services_map_size"], m["backends_map_entries"], m["backends_map_size"]
    );
    assert!(text.contains(&line), "{line} not in\n{text}");
    // The maps start at the smallest size (`sizing::MIN_SIZE`).
    assert_eq!(m["services_map_size"], 4096, "{m}");
    let line = format!(
        "Maglev tables: {} of {} entries, source ranges: {}",
        m["maglev_tables"], m["maglev_table_size"], m["source_ranges"]
    );
    assert!(text.contains(&line), "{line} not in\n{text}");
    let counters: Vec<String> = proxy_common::external_stat::NAMES
        .iter()
        .map(|name| format!("{name}={}", m["external_traffic"][name]))
        .collect();
    assert!(text.contains(&format!("traffic from outside: {}", counters.join(" "))), "{text}");
}

#[test]
fn version_names_the_commit() {
    let out = Command::new(common::AGENT).arg("--version").output().unwrap();
    assert!(out.status.success());
    let version = String::from_utf8(out.stdout).unwrap();
    let head = Command::new("git")
        // (safe.directory: the checkout may belong to another user than the
        // one running the tests.)
        .args(["-c", "safe.directory=*", "-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    // Built from a checkout: its commit (git describe: the short hash,
    // after a tag if there is one); from a tarball: "unknown".
    let commit = head.unwrap_or_else(|| "unknown".to_owned());
    assert!(version.starts_with("ebpf-proxy ") && version.contains(&commit), "{commit} not in {version}");
}

#[test]
fn bash_accepts_the_completion_script() {
    let out = Command::new(common::AGENT).args(["completion", "bash"]).output().unwrap();
    assert!(out.status.success());
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), &out.stdout).unwrap();
    let check = Command::new("bash").arg("-n").arg(script.path()).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    // It completes the subcommands and their flags.
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("complete") && text.contains("--service") && text.contains("status"), "{text}");
}
