//! Health and metrics scraped over HTTP (loopback) while the agent runs:
//! values checked, the stale-health 503, kube-proxy's /proxyMode.
mod common;

use std::time::Duration;

use common::{Env, agent_address as address, http_get as get, metric, web};
use proxy_testkit::{AgentProcess, field, message};

#[test]
fn health_and_metrics_report_the_agents_state() {
    common::require_root!();
    let mut env = Env::new(2);
    env.write_services(&web(&[1, 2]));
    env.start_agent();
    let health = address(env.agent(), "health");
    let metrics = address(env.agent(), "metrics");

    common::wait_outside_served(env.agent());
    let (status, body) = get(&health, "/healthz");
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["outsideTrafficServed"], true, "{body}");
    assert!(json["lastUpdated"].as_str().is_some_and(|t| t.starts_with("20")), "{body}");
    assert!(json["currentTime"].is_string() && json["nodeEligible"] == true, "{body}");
    // kube-proxy's newer fields: overall and per-family health.
    assert!(json["healthy"] == true && json["status"]["IPv4"]["healthy"] == true, "{body}");
    assert_eq!(get(&health, "/livez").0, 200);
    assert_eq!(get(&metrics, "/proxyMode"), (200, "ebpf".to_owned()));

    let (status, text) = get(&metrics, "/metrics");
    assert_eq!(status, 200);
    assert!((metric(&text, "ebpf_proxy_frontends") - 1.0).abs() < f64::EPSILON);
    assert!((metric(&text, "ebpf_proxy_backends") - 2.0).abs() < f64::EPSILON);
    assert!(metric(&text, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 1.0);
    assert!(metric(&text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 1.7e9);
    assert!(metric(&text, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds") > 1.7e9);
    assert!(metric(&text, "kubeproxy_sync_full_proxy_rules_duration_seconds_count") >= 1.0);
    assert!(metric(&text, "kubeproxy_proxy_healthz_total{code=\"200\"}") >= 1.0, "{text}");
    assert!(metric(&text, "process_resident_memory_bytes") > 0.0);
    assert!((metric(&text, "kubeproxy_sync_proxy_rules_service_changes_total") - 1.0).abs() < f64::EPSILON);
    // 1 frontend: slot 0 + 1 slots entry (its 2 backends) of the services
    // map, at its smallest size (a small table).
    assert!((metric(&text, "ebpf_proxy_map_fill_ratio{map=\"SERVICES\"}") - 2.0 / 4096.0).abs() < 1e-12);
    assert!((metric(&text, "ebpf_proxy_map_size{map=\"SERVICES\"}") - 4096.0).abs() < f64::EPSILON);

    // Connections are counted in the kernel, per frontend.
    let connections = "ebpf_proxy_service_connections_total{service=\"test/web:http\",frontend=\"10.96.0.10:80/TCP\"}";
    assert!(metric(&text, connections).abs() < f64::EPSILON, "{text}");
    assert_eq!(env.requests("10.96.0.10", 7).len(), 7);
    let (_, text) = get(&metrics, "/metrics");
    assert!((metric(&text, connections) - 7.0).abs() < f64::EPSILON, "{text}");

    // An endpoint change shows in the counters; the frontend's count goes on.
    env.apply(&web(&[1]));
    let (_, text) = get(&metrics, "/metrics");
    assert!((metric(&text, "kubeproxy_sync_proxy_rules_endpoint_changes_total") - 1.0).abs() < f64::EPSILON);
    assert!((metric(&text, "ebpf_proxy_backends") - 1.0).abs() < f64::EPSILON);
    assert_eq!(env.requests("10.96.0.10", 3).len(), 3);
    let (_, text) = get(&metrics, "/metrics");
    assert!((metric(&text, connections) - 10.0).abs() < f64::EPSILON, "{text}");
}

#[test]
fn health_turns_503_when_a_change_cannot_be_applied() {
    common::require_root!();
    let mut env = Env::new(1);
    env.write_services(&web(&[1]));
    let mut args = env.agent_args();
    args.extend(["--health-timeout".to_owned(), "1".to_owned()]);
    let agent = AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
    let _ = agent.wait_applied(0);
    common::wait_outside_served(&agent);
    let health = address(&agent, "health");
    env.agent = Some(agent);
    assert_eq!(get(&health, "/healthz").0, 200);

    // A change that cannot be applied (the file is not YAML): after the
    // timeout, health says so; the datapath keeps the last good state.
    env.write_services("apiVersion: v1\nkind: Service\nmetadata: {name: [\n");
    std::thread::sleep(Duration::from_millis(1800));
    let (status, body) = get(&health, "/healthz");
    assert_eq!(status, 503, "{body}");
    assert_eq!(env.requests("10.96.0.10", 3), vec!["backend-1"; 3]);

    env.apply(&web(&[1]));
    assert_eq!(get(&health, "/healthz").0, 200);
}

/// kube-proxy still holds :10256 and :10249 during a migration: the agent
/// warns, serves traffic, and binds once the ports are free (kube-proxy's
/// own behaviour with bindAddressHardFail: false).
#[test]
fn taken_health_and_metrics_ports_do_not_stop_the_agent() {
    common::require_root!();
    let mut env = Env::new(2);
    env.write_services(&web(&[1, 2]));
    // The "other proxy": listeners on both ports inside the namespace.
    let (health_port, metrics_port) = (10256, 10249);
    let held = env
        .ns
        .run_inside(move || {
            let bind = |port| std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind in the test namespace");
            (bind(health_port), bind(metrics_port))
        })
        .unwrap();
    let mut args = env.agent_args();
    for (flag, port) in [("--healthz-bind-address", health_port), ("--metrics-bind-address", metrics_port)] {
        let at = args.iter().position(|a| a == flag).expect("set by Env") + 1;
        args[at] = format!("127.0.0.1:{port}");
    }
    let agent = AgentProcess::start_in(&env.ns, std::path::Path::new(common::AGENT), args).unwrap();
    let _ = agent.wait_applied(0);
    let warned = |what: &'static str| {
        move |r: &serde_json::Value| {
            message(r).is_some_and(|m| m == format!("cannot listen for {what}; traffic is served all the same, and the port is tried again with backoff (another kube-proxy still running?)"))
        }
    };
    for what in ["health", "metrics"] {
        agent.wait_for(0, Duration::from_secs(10), warned(what)).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    env.agent = Some(agent);
    // Traffic is served all the same.
    assert_eq!(env.requests("10.96.0.10", 4).len(), 4);

    drop(held);
    for what in ["health", "metrics"] {
        let record = env
            .agent()
            .wait_for(0, Duration::from_secs(20), |r| message(r) == Some(&format!("serving {what}")))
            .unwrap_or_else(|e| panic!("{what} is served once the port is free: {e}"));
        assert_eq!(field(&record, "retried"), Some(&serde_json::Value::Bool(true)), "{record}");
    }
    common::wait_outside_served(env.agent());
    let (status, body) = common::http_get_in(Some(&env.ns), &format!("127.0.0.1:{health_port}"), "/healthz");
    assert_eq!(status, 200, "{body}");
    let (status, text) = common::http_get_in(Some(&env.ns), &format!("127.0.0.1:{metrics_port}"), "/metrics");
    assert_eq!(status, 200);
    assert!(metric(&text, "ebpf_proxy_bind_failures_total{server=\"health\"}") >= 1.0, "{text}");
    assert!(metric(&text, "ebpf_proxy_bind_failures_total{server=\"metrics\"}") >= 1.0, "{text}");
    assert!(metric(&text, "kubeproxy_proxy_healthz_total{code=\"200\"}") >= 1.0, "{text}");
}
