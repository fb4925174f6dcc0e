//! The services file at its edges, through the kernel: a file caught
//! mid-write, rejections counted. The real agent binary on a test cgroup,
//! real curl clients in a test namespace.
mod common;

use std::{fmt::Write as _, time::Duration};

use common::{Env, web};

fn metrics(env: &Env) -> String {
    let address = common::agent_address(env.agent(), "metrics");
    common::http_get(&address, "/metrics").1
}

/// `: > F` and then the new content, as `kubectl get -o yaml > F` or a
/// shell redirect writes it: the empty file in between is seen by the
/// agent (it stays empty longer than a poll) but never applied, so no
/// connection fails. An empty file that stays empty is applied (the
/// existing services_file_edits_are_applied test deletes that way).
#[test]
fn truncate_then_rewrite_under_a_steady_client_fails_no_connection() {
    common::require_root!();
    let mut env = Env::new(2);
    env.write_services(&web(&[1, 2]));
    env.start_agent();
    let client = env.steady_client();
    let pause = |ms| std::thread::sleep(Duration::from_millis(ms));
    pause(300);
    for _ in 0..3 {
        std::fs::File::create(env.services_file()).unwrap(); // truncates
        pause(450); // longer than the agent's poll and settle
        std::fs::write(env.services_file(), web(&[1, 2])).unwrap();
        pause(300);
    }
    common::check_steady_client(client, "while the file was rewritten");
    let text = metrics(&env);
    assert!(
        common::metric(&text, "ebpf_proxy_services_file_rejections_total{reason=\"empty\"}") >= 1.0,
        "the empty reads were counted:\n{text}"
    );
}

/// Each rejection is logged with its reason and counted in
/// `ebpf_proxy_services_file_rejections_total{reason}`, and none costs the
/// service that is served.
#[test]
fn every_rejection_is_counted_and_the_service_stays() {
    common::require_root!();
    let mut env = Env::new(1);
    let deployment = "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: test}\n";
    env.write_services(&(web(&[1]) + deployment));
    env.start_agent();
    let logged = |reason: &str| {
        let agent = env.agent();
        agent
            .wait_for(0, Duration::from_secs(10), |r| {
                proxy_testkit::field(r, "reason").and_then(|v| v.as_str()) == Some(reason)
            })
            .is_ok()
    };
    assert!(logged("unknown_kind"));
    let level = |i: usize| format!("a{i}: &a{i} [{}]\n", vec![format!("*a{}", i - 1); 10].join(", "));
    let bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned() + &(1..9).map(level).collect::<String>();
    for (text, reason) in [(bomb.as_str(), "yaml_bomb"), ("kind: [\n", "not_yaml")] {
        env.write_services(text);
        assert!(logged(reason), "{reason} not logged");
    }
    let text = metrics(&env);
    for reason in ["unknown_kind", "yaml_bomb", "not_yaml"] {
        let name = format!("ebpf_proxy_services_file_rejections_total{{reason=\"{reason}\"}}");
        assert!(common::metric(&text, &name) >= 1.0, "{reason} not counted:\n{text}");
    }
    assert_eq!(env.requests("10.96.0.10", 5), vec!["backend-1"; 5], "the last good content still serves");
}

/// Issue 39: a user's bad days under a steady client. Garbage that parses
/// as YAML (20 KB of base64, one scalar document), a file of only other
/// kinds and a file truncated mid-write are each refused and fail no
/// connection; the refusal is counted and, while it lasts, `/healthz`
/// answers 503 (as for a file that is not YAML). A good Service beside
/// 10,000 ConfigMaps is applied with a handful of log lines, not one per
/// ConfigMap.
#[test]
fn garbage_junk_and_truncation_fail_no_connection_and_log_little() {
    common::require_root!();
    let mut env = Env::new(2);
    env.write_services(&web(&[1, 2]));
    let mut args = env.agent_args();
    args.extend(["--health-timeout".to_owned(), "1".to_owned()]);
    let agent = proxy_testkit::AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
    let _ = agent.wait_applied(0);
    env.agent = Some(agent);
    let health = common::agent_address(env.agent(), "health");
    let healthz = || common::http_get(&health, "/healthz").0;
    let wait_healthz = |code: u16| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while healthz() != code && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(healthz(), code);
    };
    wait_healthz(200);
    let client = env.steady_client();
    let refused = |mark: usize| {
        env.agent()
            .wait_for(mark, Duration::from_secs(10), |r| {
                proxy_testkit::field(r, "reason").and_then(|v| v.as_str()) == Some("no_usable_object")
            })
            .expect("the file was not refused");
    };
    std::thread::sleep(Duration::from_millis(300));

    let garbage: String = (0..20_000).map(|i| if i % 77 == 76 { '\n' } else { char::from(b"QUJD"[i % 4]) }).collect();
    let mark = env.agent().mark();
    env.write_services(&garbage);
    refused(mark);
    wait_healthz(503);
    let config_maps = |n: usize| -> String {
        (0..n).fold(String::new(), |mut out, i| {
            let _ = write!(out, "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cm-{i}}}\n");
            out
        })
    };
    let mark = env.agent().mark();
    env.write_services(&config_maps(100));
    refused(mark);
    assert!(env.agent().records().iter().all(|r| proxy_testkit::message(r) != Some("service frontend removed")));

    // Truncated and written again within the settle time.
    std::fs::File::create(env.services_file()).unwrap();
    std::thread::sleep(Duration::from_millis(450));
    let mark = env.agent().mark();
    std::fs::write(env.services_file(), web(&[1, 2]) + &config_maps(10_000)).unwrap();
    let applied = env.agent().wait_applied(mark);
    assert_eq!(common::applied_frontends(&applied), 1);
    let lines = env.agent().mark() - mark;
    let logged: Vec<_> =
        env.agent().records()[mark..].iter().filter_map(|r| proxy_testkit::message(r).map(str::to_owned)).collect();
    assert!(lines <= 6, "{lines} lines for one file with 10,000 rejected objects: {logged:#?}");
    wait_healthz(200);
    common::check_steady_client(client, "while the file was garbage, junk or truncated");

    let text = metrics(&env);
    for (reason, least) in [("no_usable_object", 2.0), ("unknown_kind", 10_101.0), ("empty", 1.0)] {
        let name = format!("ebpf_proxy_services_file_rejections_total{{reason=\"{reason}\"}}");
        assert!(common::metric(&text, &name) >= least, "{reason} not counted:\n{text}");
    }
}

/// Everything under the pin directory (two levels), sorted.
fn pins(dir: &std::path::Path) -> Vec<String> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_dir() {
            for inner in std::fs::read_dir(entry.path()).unwrap().flatten() {
                all.push(format!("{name}/{}", inner.file_name().to_string_lossy()));
            }
        }
        all.push(name);
    }
    all.sort();
    all
}

/// A flag out of range stops the agent before anything is made; a start
/// the kernel side fails anyway (here: a directory where the service
/// names map is to be pinned) takes back the maps it pinned, and leaves
/// what was there before.
#[test]
fn a_failed_start_leaves_no_pins_behind() {
    common::require_root!();
    let env = Env::new(1);
    env.write_services(&web(&[1]));
    let run = |extra: &[&str]| {
        let mut args = env.agent_args();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let out = std::process::Command::new(common::AGENT).arg("run").args(&args).output().unwrap();
        assert!(!out.status.success(), "the agent started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = run(&["--services-map-size", "0"]);
    assert!(stderr.contains("1..=16777216"), "the valid range is named: {stderr}");
    assert!(!env.pin_dir().exists(), "a refused flag made the pin directory");

    // Where a fresh start pins its maps: the smallest size (see
    // reconcile/sizing.rs).
    let min = ebpf_proxy::reconcile::sizing::MIN_SIZE;
    let min = ebpf_proxy::reconcile::sizing::Sizes { services: min, backends: min, frontends: min };
    let maps = ebpf_proxy::paths::maps_dir(&env.pin_dir(), 16381, min);
    std::fs::create_dir_all(maps.join(proxy_common::map_names::SERVICE_NAMES)).unwrap();
    let before = pins(&env.pin_dir());
    let stderr = run(&[]);
    assert!(stderr.contains(proxy_common::map_names::SERVICE_NAMES), "{stderr}");
    assert_eq!(pins(&env.pin_dir()), before, "the failed start left pins behind");
}
