//! ClusterIP through the kernel: the real agent binary, attached to a test
//! cgroup, in front of HTTP backends in a test namespace; real curl and
//! socat clients inside that namespace.
mod common;

use common::{Env, backend_ip, service, slice, web};
use proxy_testkit::message;

#[test]
fn spreads_300_connections_over_three_backends() {
    common::require_root!();
    let mut env = Env::new(3);
    env.write_services(&web(&[1, 2, 3]));
    env.start_agent();

    let answers = env.requests("10.96.0.10", 300);
    assert_eq!(answers.len(), 300, "every connection succeeds");
    for b in &env.backends {
        let by_body = answers.iter().filter(|a| a.as_str() == b.name()).count();
        assert_eq!(by_body, b.accepted(), "{} answered what it accepted", b.name());
        assert!((60..=141).contains(&by_body), "{} got {by_body} of 300 (wanted 20%-47%)", b.name());
    }
}

#[test]
fn client_outside_the_cgroup_is_not_rewritten() {
    common::require_root!();
    let mut env = Env::new(1);
    env.write_services(&web(&[1]));
    env.start_agent();

    // Same namespace, not in the cgroup: the service address has no route here.
    let (ok, err) = env.socat_connect(false, "10.96.0.10:80");
    assert!(!ok, "a client outside the cgroup reached something");
    assert!(err.contains("Network is unreachable"), "expected no route, got: {err}");
    assert_eq!(env.accepted(), vec![0]);
    // The same connection from inside the cgroup is translated.
    assert_eq!(env.requests("10.96.0.10", 1), vec!["backend-1"]);
}

#[test]
fn service_without_endpoints_refuses_connections() {
    common::require_root!();
    let mut env = Env::new(1);
    let yaml = service("empty", "10.96.0.20", &[("http", 80)])
        + &slice("empty-1", "empty", &[("http", 8080)], &[])
        + &service("lonely", "10.96.0.21", &[("http", 80)]);
    env.write_services(&yaml);
    env.start_agent();

    for addr in ["10.96.0.20:80", "10.96.0.21:80"] {
        let (ok, err) = env.socat_connect(true, addr);
        assert!(!ok, "{addr}: connect succeeded");
        assert!(err.contains("Connection refused"), "{addr}: expected ECONNREFUSED, got: {err}");
    }
}

#[test]
fn services_file_edits_are_applied() {
    common::require_root!();
    let mut env = Env::new(3);
    env.write_services(&web(&[1, 2]));
    env.start_agent();
    let mut answers = env.requests("10.96.0.10", 40);
    assert!(answers.iter().all(|a| a == "backend-1" || a == "backend-2"), "{answers:?}");

    // Add a backend.
    env.apply(&web(&[1, 2, 3]));
    answers = env.requests("10.96.0.10", 60);
    assert!(answers.iter().any(|a| a == "backend-3"), "the added backend gets connections");

    // Remove one: once applied it gets no new connection.
    env.apply(&web(&[2, 3]));
    let before = env.accepted()[0];
    answers = env.requests("10.96.0.10", 60);
    assert!(!answers.iter().any(|a| a == "backend-1"), "{answers:?}");
    assert_eq!(env.accepted()[0], before, "the removed backend accepted a connection");

    // Change the service port: the old one is no longer translated.
    let moved =
        service("web", "10.96.0.10", &[("http", 8000)]) + &slice("web-1", "web", &[("http", 8080)], &[backend_ip(2)]);
    env.apply(&moved);
    assert_eq!(env.requests("10.96.0.10:8000", 5), vec!["backend-2"; 5]);
    let (ok, err) = env.socat_connect(true, "10.96.0.10:80");
    assert!(!ok && err.contains("Network is unreachable"), "old port still translated: {err}");

    // Delete the service: its address is left alone.
    env.apply("");
    let (ok, err) = env.socat_connect(true, "10.96.0.10:8000");
    assert!(!ok && err.contains("Network is unreachable"), "deleted service still translated: {err}");
}

#[test]
fn same_ip_other_port_and_same_port_other_ip_stay_apart() {
    common::require_root!();
    let mut env = Env::new(3);
    let yaml = service("a", "10.96.0.10", &[("http", 80)])
        + &slice("a-1", "a", &[("http", 8080)], &[backend_ip(1)])
        + &service("b", "10.96.0.10", &[("http", 81)])
        + &slice("b-1", "b", &[("http", 8080)], &[backend_ip(2)])
        + &service("c", "10.96.0.11", &[("http", 80)])
        + &slice("c-1", "c", &[("http", 8080)], &[backend_ip(3)]);
    env.write_services(&yaml);
    env.start_agent();

    assert_eq!(env.requests("10.96.0.10:80", 20), vec!["backend-1"; 20]);
    assert_eq!(env.requests("10.96.0.10:81", 20), vec!["backend-2"; 20]);
    assert_eq!(env.requests("10.96.0.11:80", 20), vec!["backend-3"; 20]);
}

#[test]
fn malformed_objects_are_reported_and_skipped() {
    common::require_root!();
    let mut env = Env::new(1);
    let broken_type = "---\napiVersion: v1\nkind: Service\nmetadata: {name: broken, namespace: test}\nspec:\n  clusterIP: 10.96.0.30\n  ports:\n  - {name: http, port: eighty}\n";
    let bad_ip = service("badip", "10.96.0.300", &[("http", 80)]);
    env.write_services(&(web(&[1]) + broken_type + &bad_ip));
    let applied = env.start_agent();
    assert_eq!(common::applied_frontends(&applied), 1, "only the good service is programmed");

    let records = env.agent().records();
    let logged = |object: &str, field: &str| {
        records.iter().any(|r| {
            proxy_testkit::field(r, "object").and_then(|v| v.as_str()).is_some_and(|o| o.contains(object))
                && proxy_testkit::field(r, "field").and_then(|v| v.as_str()) == Some(field)
                && r.get("level").and_then(|l| l.as_str()) == Some("ERROR")
        })
    };
    // A services file's rejected objects are summarised per reason (one
    // line: `reason`, `objects`, `examples`, the first one's error).
    let summarised = records.iter().any(|r| {
        proxy_testkit::field(r, "reason").and_then(|v| v.as_str()) == Some("invalid_object")
            && proxy_testkit::field(r, "first")
                .and_then(|v| v.as_str())
                .is_some_and(|f| f.contains("Service test/broken") && f.contains("spec.ports[0].port"))
            && r.get("level").and_then(|l| l.as_str()) == Some("ERROR")
    });
    assert!(summarised, "type error not reported with object and field");
    assert!(logged("Service test/badip", "spec.clusterIPs[0]"), "bad clusterIP not reported with object and field");
    assert_eq!(env.requests("10.96.0.10", 10), vec!["backend-1"; 10], "the good service still works");
}

#[test]
fn restarted_agent_takes_over_without_a_gap_and_writes_nothing_new() {
    common::require_root!();
    let mut env = Env::new(2);
    env.write_services(&web(&[1, 2]));
    let first = env.start_agent();
    assert!(common::writes(&first) > 0);
    env.agent.take(); // stop it: links and maps stay pinned

    // While it is down, new connections are still translated.
    assert_eq!(env.requests("10.96.0.10", 20).len(), 20);

    let second = env.start_agent();
    assert_eq!(common::writes(&second), 0, "the maps were already right");
    let updated = env.agent().records().iter().any(|r| {
        proxy_testkit::message(r) == Some("program attached")
            && proxy_testkit::field(r, "outcome").and_then(|v| v.as_str()) == Some("Updated")
    });
    assert!(updated, "the new agent did not take over the pinned link");
    assert_eq!(env.requests("10.96.0.10", 20).len(), 20);
}

#[test]
fn a_full_map_fails_only_the_service_that_does_not_fit() {
    common::require_root!();
    let mut env = Env::new(3);
    // Service "a" needs 2 entries of SERVICES (slot 0 and a slots entry);
    // "b", of 9 backends (never reached), needs 4: its 3 slots entries
    // fill the map with a's, and neither slot 0 fits; written one at a
    // time, "a" fits again and "b" does not.
    let nine: Vec<std::net::Ipv4Addr> = (1..=9).map(backend_ip).collect();
    let yaml = service("a", "10.96.0.10", &[("http", 80)])
        + &slice("a-1", "a", &[("http", 8080)], &[backend_ip(1)])
        + &service("b", "10.96.0.11", &[("http", 80)])
        + &slice("b-1", "b", &[("http", 8080)], &nine);
    env.write_services(&yaml);
    let mut args = env.agent_args();
    args.extend(["--services-map-size".to_owned(), "4".to_owned()]);
    let agent = proxy_testkit::AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
    let applied = agent.wait_applied(0);
    assert!(proxy_testkit::field(&applied, "failures").and_then(serde_json::Value::as_u64) > Some(0));
    let failure = agent
        .wait_for(0, std::time::Duration::from_secs(5), |r| {
            proxy_testkit::message(r) == Some(ebpf_proxy::pipeline::MAP_WRITES_FAILED)
        })
        .expect("the failure is logged");
    // One summarised line: the first services that failed, and the error.
    let subject = proxy_testkit::field(&failure, "first").and_then(|v| v.as_str()).unwrap_or_default();
    assert!(subject.contains("test/b:http"), "names the service: {failure}");
    let error = proxy_testkit::field(&failure, "error").and_then(|v| v.as_str()).unwrap_or_default();
    assert!(error.contains("SERVICES is full"), "{failure}");
    env.agent = Some(agent);
    assert_eq!(env.requests("10.96.0.10", 10), vec!["backend-1"; 10], "the service that fits works");
    let (ok, err) = env.socat_connect(true, "10.96.0.11:80");
    assert!(!ok && err.contains("Network is unreachable"), "a half-written service was exposed: {err}");
}

#[test]
fn a_full_backends_map_fails_only_the_service_of_the_backend_that_does_not_fit() {
    common::require_root!();
    let mut env = Env::new(3);
    // Three backends, room for two (`BACKENDS` is an array of ids from 1:
    // size 3): the backends are written in one batch that the kernel
    // stops at the third; the failure names it.
    let yaml = service("a", "10.96.0.10", &[("http", 80)])
        + &slice("a-1", "a", &[("http", 8080)], &[backend_ip(1)])
        + &service("b", "10.96.0.11", &[("http", 80)])
        + &slice("b-1", "b", &[("http", 8080)], &[backend_ip(2), backend_ip(3)]);
    env.write_services(&yaml);
    let mut args = env.agent_args();
    args.extend(["--backends-map-size".to_owned(), "3".to_owned()]);
    let agent = proxy_testkit::AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
    let _ = agent.wait_applied(0);
    let failures: Vec<serde_json::Value> = agent
        .records()
        .into_iter()
        .filter(|r| proxy_testkit::message(r) == Some(ebpf_proxy::pipeline::MAP_WRITES_FAILED))
        .collect();
    assert_eq!(failures.len(), 1, "{failures:?}");
    let field = |name| proxy_testkit::field(&failures[0], name).and_then(|v| v.as_str()).unwrap_or_default();
    assert!(field("error").contains("BACKENDS is full"), "{failures:?}");
    let lost = (1..=3).find(|b| field("first").contains(&format!("{}:8080", backend_ip(*b)))).expect("names a backend");
    env.agent = Some(agent);
    let (working, broken) = if lost == 1 { ("10.96.0.11", "10.96.0.10") } else { ("10.96.0.10", "10.96.0.11") };
    assert_eq!(env.requests(working, 10).len(), 10, "the service whose backends fit works");
    let (ok, err) = env.socat_connect(true, &format!("{broken}:80"));
    assert!(!ok && err.contains("Network is unreachable"), "a service with a missing backend was exposed: {err}");
}

#[test]
fn zone_hints_keep_connections_in_this_nodes_zone() {
    common::require_root!();
    let mut env = Env::new(3);
    let node = |zone: &str| {
        format!(
            "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: test-node\n  labels: {{topology.kubernetes.io/zone: {zone}}}\n"
        )
    };
    let hinted = service("web", "10.96.0.10", &[("http", 80)])
        + "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: test\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports:\n- {name: http, port: 8080, protocol: TCP}\nendpoints:\n"
        + "- {addresses: [\"10.244.0.11\"], hints: {forZones: [{name: zone-a}]}}\n"
        + "- {addresses: [\"10.244.0.12\"], hints: {forZones: [{name: zone-b}]}}\n"
        + "- {addresses: [\"10.244.0.13\"], hints: {forZones: [{name: zone-a}]}}\n";
    env.write_services(&(node("zone-a") + &hinted));
    env.start_agent();
    let answers: std::collections::BTreeSet<String> = env.requests("10.96.0.10", 60).into_iter().collect();
    assert_eq!(answers, ["backend-1", "backend-3"].into_iter().map(String::from).collect());

    env.apply(&(node("zone-b") + &hinted));
    assert_eq!(env.requests("10.96.0.10", 20), vec!["backend-2"; 20]);
}

#[test]
fn bpf_log_reports_each_translation() {
    common::require_root!();
    let mut env = Env::new(1);
    env.write_services(&web(&[1]));
    let mut args = env.agent_args();
    args.push("--bpf-log".into());
    let agent = proxy_testkit::AgentProcess::start_with_filter(
        std::path::Path::new(common::AGENT),
        args,
        "info,proxy_ebpf=debug",
    )
    .unwrap();
    let _ = agent.wait_applied(0);
    env.agent = Some(agent);
    assert_eq!(env.requests("10.96.0.10", 1), vec!["backend-1"]);
    env.agent()
        .wait_for(0, std::time::Duration::from_secs(5), |r| {
            proxy_testkit::message(r) == Some("10.96.0.10:80 -> 10.244.0.11:8080")
        })
        .expect("the translation was not logged");
}

#[test]
fn node_ports_load_balancer_ips_and_local_external_ips_for_local_clients() {
    common::require_root!();
    let mut env = Env::new(1);
    env.ns.add_lo_addr("10.200.0.1/32").unwrap(); // this "node"'s address
    let edge = "---\napiVersion: v1\nkind: Service\nmetadata: {name: edge, namespace: test}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.40\n  externalIPs: [\"10.200.0.1\", \"198.51.100.7\"]\n  ports: [{name: http, port: 80, nodePort: 30080, protocol: TCP}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 203.0.113.10}]\n";
    env.write_services(&(edge.to_owned() + &slice("edge-1", "edge", &[("http", 8080)], &[backend_ip(1)])));
    let mut args = env.agent_args();
    // Only this node's externalIPs for clients on the node (the default,
    // every externalIP as kube-proxy, is tested in tests/nodeport.rs).
    // The agent runs in the machine's own namespace here, whose local
    // addresses would all serve NodePorts (kube-proxy's default): the test
    // keeps them to its "node" address and loopback.
    args.extend(
        ["--node-ip", "10.200.0.1", "--external-ips-local-only", "--nodeport-addresses", "10.200.0.1/32,127.0.0.0/8"]
            .map(str::to_owned),
    );
    let agent = proxy_testkit::AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
    let applied = agent.wait_applied(0);
    env.agent = Some(agent);
    // ClusterIP, NodePort on 127.0.0.1 and on the node address, LB IP, local
    // externalIP, and the foreign externalIP for traffic from outside only.
    assert_eq!(common::applied_frontends(&applied), 6, "{applied}");
    for addr in ["10.96.0.40:80", "127.0.0.1:30080", "10.200.0.1:30080", "203.0.113.10:80", "10.200.0.1:80"] {
        assert_eq!(env.requests(addr, 3), vec!["backend-1"; 3], "{addr}");
    }
    // An externalIP that is not this node's is not taken over
    // (--external-ips-local-only: CVE-2020-8554).
    let (ok, err) = env.socat_connect(true, "198.51.100.7:80");
    assert!(!ok && err.contains("Network is unreachable"), "a foreign externalIP was hijacked: {err}");
}

#[test]
fn restarts_under_a_steady_stream_of_connections_fail_none() {
    common::require_root!();
    let mut env = Env::new(2);
    env.write_services(&web(&[1, 2]));
    env.start_agent();
    let client = env.steady_client();
    let pause = || std::thread::sleep(std::time::Duration::from_millis(400));
    pause();
    // The same build again, then a different program (as a newer build
    // would bring; --bpf-log loads other code) swapped into the pinned links.
    for extra in [None, Some("--bpf-log")] {
        env.agent.take();
        pause();
        let mut args = env.agent_args();
        args.extend(extra.map(str::to_owned));
        let agent = proxy_testkit::AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
        assert_eq!(common::writes(&agent.wait_applied(0)), 0);
        env.agent = Some(agent);
        pause();
    }
    common::check_steady_client(client, "across the restarts");
}

#[test]
fn a_new_map_layout_takes_over_without_a_gap() {
    use ebpf_proxy::paths::{LAYOUT_VERSION_ENV, MAP_LAYOUT_VERSION};
    common::require_root!();
    let mut env = Env::new(2);
    env.write_services(&web(&[1, 2]));
    // An "older build": its maps under another layout version. (Both layouts
    // are this build's types; what is tested is the switch-over.)
    let old = (MAP_LAYOUT_VERSION - 1).to_string();
    let agent = proxy_testkit::AgentProcess::start_with_env(
        std::path::Path::new(common::AGENT),
        env.agent_args(),
        "info",
        &[(LAYOUT_VERSION_ENV, old.as_str())],
    )
    .unwrap();
    let _ = agent.wait_applied(0);
    env.agent = Some(agent);
    let pin_dir = env.pin_dir();
    // maps-vN-mM-sS-bB: layout, Maglev table size, map sizes.
    let maps_dir = |version: &str| {
        let prefix = format!("maps-v{version}-m{}-", ebpf_proxy::reconcile::maglev::DEFAULT_SIZE);
        std::fs::read_dir(&pin_dir)
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
    };
    assert!(maps_dir(&old));

    let client = env.steady_client();
    std::thread::sleep(std::time::Duration::from_millis(300));
    env.agent.take();
    let applied = env.start_agent(); // this build's layout: new maps, filled, then switched to
    assert!(common::writes(&applied) > 0, "the new layout's maps start empty and are filled");
    std::thread::sleep(std::time::Duration::from_millis(300));
    common::check_steady_client(client, "across the switch");
    assert!(!maps_dir(&old), "the old layout's maps are still pinned");
    assert!(maps_dir(&MAP_LAYOUT_VERSION.to_string()));
    assert_eq!(env.requests("10.96.0.10", 10).len(), 10);
}

/// `BACKENDS` is an array written in place (docs/design.md, "Map
/// layout"): a removed backend's entry keeps its address and loses its
/// protocol (empty to the programs, never half written), and the next new
/// backend takes the freed id whole. The service reaches exactly its
/// backends throughout.
#[test]
fn a_removed_backends_id_turns_empty_and_the_next_backend_takes_it_whole() {
    use aya::maps::{Array, Map, MapData};
    use proxy_common::{Backend, map_names};

    common::require_root!();
    let mut env = Env::new(4);
    env.write_services(&web(&[1, 2, 3]));
    env.start_agent();
    let dir = ebpf_proxy::paths::current_maps_dir(&env.pin_dir()).expect("the agent's maps directory");
    // The array's first entries, as the kernel holds them.
    let entries = || -> Vec<Backend> {
        let data = MapData::from_pin(dir.join(map_names::BACKENDS)).expect("open BACKENDS");
        let array: Array<MapData, Backend> = Array::try_from(Map::Array(data)).expect("BACKENDS is an array");
        (0..8).map(|id| array.get(&id, 0).expect("read an entry")).collect()
    };
    let addr = |b: u8| backend_ip(b).to_ipv6_mapped().octets();
    let id_of = |entries: &[Backend], b: u8| entries.iter().position(|e| e.addr.0 == addr(b)).expect("an entry");

    let before = entries();
    let freed = id_of(&before, 3);
    assert_eq!(before[freed].proto, 6, "backend 3 is in the map: {before:?}");

    env.apply(&web(&[1, 2]));
    let removed = entries();
    assert_eq!(removed[freed].proto, 0, "a removed backend's entry is empty");
    assert_eq!(removed[freed].addr.0, addr(3), "its address is left as it was: {removed:?}");
    let answers = env.requests("10.96.0.10", 30);
    assert!(answers.iter().all(|a| a == "backend-1" || a == "backend-2"), "{answers:?}");

    env.apply(&web(&[1, 2, 4]));
    let added = entries();
    assert_eq!(id_of(&added, 4), freed, "the new backend takes the freed id: {added:?}");
    assert_eq!((added[freed].proto, added[freed].port), (6, 8080u16.to_be()), "written whole: {added:?}");
    let answers = env.requests("10.96.0.10", 60);
    assert!(answers.iter().all(|a| ["backend-1", "backend-2", "backend-4"].contains(&a.as_str())), "{answers:?}");
    assert!(answers.iter().any(|a| a == "backend-4"), "the new backend gets connections");
}

/// A start serves the pods' connections once the maps hold the table: the
/// socket programs are attached with the first sync, while the TC programs
/// (nearly all of the verifier's work, docs/performance.md) still load;
/// those attach after (here to no device: `--devices none`). The order of
/// the agent's lines shows it, and a client is served in between. This
/// relies on the TC programs' verification taking longer than a sync of
/// one service, which it does by far (a second against milliseconds).
#[test]
fn the_socket_programs_serve_before_the_tc_programs_are_loaded() {
    common::require_root!();
    let mut env = Env::new(1);
    env.write_services(&web(&[1]));
    env.start_agent();
    assert_eq!(env.requests("10.96.0.10", 3), vec!["backend-1"; 3]);
    let agent = env.agent.as_ref().expect("agent running");
    let served = agent.mark();
    // Meanwhile /healthz, which load balancers check, is not yet healthy
    // (src/observe/health.rs): a 200 now would need the line saying the
    // traffic from outside is served.
    let (status, body) = common::http_get(&common::agent_address(agent, "health"), "/healthz");
    let outside = |r: &serde_json::Value| message(r) == Some(ebpf_proxy::agent::OUTSIDE_SERVED);
    if status == 200 {
        assert!(agent.records().iter().any(outside), "/healthz healthy before traffic from outside is served: {body}");
    } else {
        assert!(body.contains("\"outsideTrafficServed\":false"), "{status} {body}");
    }
    let tc_line = |r: &serde_json::Value| message(r).is_some_and(|m| m.starts_with("traffic from outside"));
    agent.wait_for(0, std::time::Duration::from_secs(30), tc_line).expect("the TC programs loaded");
    let records = agent.records();
    let at = |f: &dyn Fn(&serde_json::Value) -> bool| records.iter().position(f);
    let waiting = at(&|r| message(r).is_some_and(|m| m.starts_with("the socket programs serve;")))
        .expect("the socket programs took over before the TC programs loaded");
    let applied = at(&|r| message(r) == Some(ebpf_proxy::agent::APPLIED)).expect("first sync");
    let tc = at(&tc_line).expect("TC line");
    assert!(waiting < applied && applied < tc, "socket programs at {waiting}, first sync at {applied}, TC at {tc}");
    assert!(tc >= served, "the client was served before the TC programs were attached ({tc} < {served})");
    common::wait_outside_served(agent);
    assert_eq!(common::http_get(&common::agent_address(agent, "health"), "/healthz").0, 200);
}
