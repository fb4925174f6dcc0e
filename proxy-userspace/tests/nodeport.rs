//! Traffic from outside the node, on several nodes in namespaces: a client
//! outside reaches NodePorts, LoadBalancer IPs and their backends on every
//! node through each node's address; one real agent per node (in its
//! node's namespace, with its own cgroup, pins and devices); real clients
//! (curl, python3 sockets) and servers (the test's, and python3's
//! http.server). See tests/common/topology.rs for the network.
mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::IpAddr,
};

use common::topology::{CLIENT, CLIENT2, Topology, node_ip, on_node};

/// A Service `name` of `kind` with `ports` (name, port, nodePort,
/// protocol), `extra` spec lines and `ingress` LoadBalancer IPs.
fn service(name: &str, kind: &str, ports: &[(&str, u16, u16, &str)], extra: &str, ingress: &[&str]) -> String {
    let mut s = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: t}}\nspec:\n  type: {kind}\n  clusterIP: {}\n  ports:\n",
        cluster_ip(name)
    );
    for (pname, port, node_port, proto) in ports {
        writeln!(s, "  - {{name: {pname}, port: {port}, nodePort: {node_port}, protocol: {proto}}}").unwrap();
    }
    s.push_str(extra);
    if !ingress.is_empty() {
        let ips: Vec<String> = ingress.iter().map(|ip| format!("{{ip: {ip}}}")).collect();
        writeln!(s, "status: {{loadBalancer: {{ingress: [{}]}}}}", ips.join(", ")).unwrap();
    }
    s
}

/// The ClusterIP `service` gives Service `name`.
fn cluster_ip(name: &str) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(10, 96, 0, u8::try_from(20 + name.bytes().map(u32::from).sum::<u32>() % 200).unwrap())
}

/// An EndpointSlice of `service` with port (name, number, protocol) and
/// ready endpoints on pods (node, index).
fn endpoints(service: &str, port: (&str, u16, &str), pods: &[(u8, u8)]) -> String {
    let mut s = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {service}-{}, namespace: t, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: IPv4\nports: [{{name: {}, port: {}, protocol: {}}}]\nendpoints:",
        port.2.to_lowercase(),
        port.0,
        port.1,
        port.2
    );
    if pods.is_empty() {
        s.push_str(" []");
    }
    s.push('\n');
    for (n, k) in pods {
        writeln!(
            s,
            "- {{addresses: [\"{}\"], nodeName: n{n}, conditions: {{ready: true}}}}",
            common::topology::pod_ip(*n, *k)
        )
        .unwrap();
    }
    s
}

/// The `NAME` and reply source of probe lines `NAME:pingN SOURCE`.
fn udp_replies(lines: &[String]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter(|l| l.contains(":ping"))
        .map(|l| {
            let (payload, source) = l.split_once(' ').unwrap();
            (payload.split(':').next().unwrap().to_owned(), source.to_owned())
        })
        .collect()
}

#[test]
fn node_ports_reach_backends_on_every_node_and_replies_come_back() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1, 1]);
    for n in 1..=3 {
        topo.http_on(n, 1);
        topo.udp_on(n, 1);
    }
    let all = [(1, 1), (2, 1), (3, 1)];
    topo.write_services(
        &(service("web", "NodePort", &[("http", 80, 30080, "TCP")], "", &[])
            + &endpoints("web", ("http", 8080, "TCP"), &all)
            + &service("dns", "NodePort", &[("dns", 53, 30053, "UDP")], "", &[])
            + &endpoints("dns", ("dns", 5353, "UDP"), &all)),
    );
    topo.start_agents();

    // TCP: through every node's address, backends on every node answer
    // (the replies of remote ones come back through the node: SNAT).
    for n in 1..=3 {
        let answers: BTreeSet<String> = topo.requests(&on_node(n, 30080), 45).into_iter().collect();
        assert_eq!(answers.len(), 3, "through node {n}: {answers:?}");
    }

    // UDP: replies come from the address the client sent to, and a flow
    // (client address and port) gets the same backend through every node:
    // every node computes the same Maglev table.
    let mut by_flow: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for n in 1..=3u8 {
        for port in 20_000..20_024u16 {
            let (ok, lines) =
                topo.probe(&["udp-sendto", &node_ip(n).to_string(), "30053", "1", "0", &port.to_string()]);
            assert!(ok, "through node {n} from port {port}: {lines:?}");
            let replies = udp_replies(&lines);
            assert_eq!(replies.len(), 1, "{lines:?}");
            assert_eq!(replies[0].1, on_node(n, 30053), "the reply must come from the node's NodePort");
            by_flow.entry(port).or_default().insert(replies[0].0.clone());
            seen.insert(replies[0].0.clone());
        }
    }
    assert_eq!(seen.len(), 3, "24 flows reached only {seen:?}");
    for (port, backends) in &by_flow {
        assert_eq!(backends.len(), 1, "the flow from port {port} reached {backends:?} through different nodes");
    }
}

#[test]
fn external_traffic_policy_local_keeps_the_client_address_and_stays_on_the_node() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1, 1]);
    topo.http_on(1, 1);
    topo.http_on(2, 1);
    topo.write_services(
        &(service("local", "NodePort", &[("http", 80, 30081, "TCP")], "  externalTrafficPolicy: Local\n", &[])
            + &endpoints("local", ("http", 8080, "TCP"), &[(1, 1), (2, 1)])
            + &service("cluster", "NodePort", &[("http", 80, 30082, "TCP")], "", &[])
            + &endpoints("cluster", ("http", 8080, "TCP"), &[(2, 1)])),
    );
    topo.start_agents();

    assert_eq!(topo.requests(&on_node(1, 30081), 10), vec!["pod-1-1"; 10], "node 1 serves from its own pod");
    assert_eq!(topo.requests(&on_node(2, 30081), 10), vec!["pod-2-1"; 10], "node 2 serves from its own pod");
    let peers: BTreeSet<IpAddr> = topo.http_server("pod-1-1").peers().iter().map(std::net::SocketAddr::ip).collect();
    assert_eq!(peers, BTreeSet::from([IpAddr::V4(CLIENT)]), "the backend must see the client's address");
    // Node 3 has no endpoint: it drops (the client's connect times out).
    let (ok, body) = topo.curl_from(CLIENT, &format!("http://{}/", on_node(3, 30081)));
    assert!(!ok, "node 3 answered without a local endpoint: {body}");

    // With externalTrafficPolicy: Cluster, node 1 forwards to node 2's pod
    // from its own address.
    let before = topo.http_server("pod-2-1").peers().len();
    assert_eq!(topo.requests(&on_node(1, 30082), 5), vec!["pod-2-1"; 5]);
    let peers: BTreeSet<IpAddr> =
        topo.http_server("pod-2-1").peers()[before..].iter().map(std::net::SocketAddr::ip).collect();
    assert_eq!(peers, BTreeSet::from([IpAddr::V4(node_ip(1))]), "source NAT to node 1's address");
}

/// GET `url` from the client: (status, body).
fn http_get(topo: &Topology, url: &str) -> (u16, String) {
    let out = proxy_testkit::spawn_in(&topo.client, None, "curl")
        .unwrap()
        .args(["-sS", "--max-time", "3", "-w", "\n%{http_code}", url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.parse().unwrap_or(0), body.to_owned())
}

/// LoadBalancer `lb` (203.0.113.10:80, NodePort 30083) with
/// externalTrafficPolicy Local and its health check on port 32001, with
/// endpoints on `pods` (node, pod).
fn local_lb(pods: &[(u8, u8)]) -> String {
    service(
        "lb",
        "LoadBalancer",
        &[("http", 80, 30083, "TCP")],
        "  externalTrafficPolicy: Local\n  healthCheckNodePort: 32001\n",
        &["203.0.113.10"],
    ) + &endpoints("lb", ("http", 8080, "TCP"), pods)
}

#[test]
fn health_check_node_port_answers_200_or_503_as_endpoints_move() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1]);
    topo.http_on(1, 1);
    topo.http_on(2, 1);
    topo.write_services(&local_lb(&[(1, 1)]));
    topo.start_agents();
    topo.route_to_node("203.0.113.0/24", 1);

    let check = |n: u8| -> (u16, serde_json::Value) {
        let (status, body) = http_get(&topo, &format!("http://{}/", on_node(n, 32001)));
        (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}")))
    };
    let (status, body) = check(1);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["localEndpoints"], 1);
    assert_eq!(body["service"]["namespace"], "t");
    assert_eq!(body["service"]["name"], "lb");
    assert_eq!(body["serviceProxyHealthy"], true);
    let (status, body) = check(2);
    assert_eq!((status, &body["localEndpoints"]), (503, &serde_json::json!(0)), "{body}");
    // The load balancer sends to node 1: served there.
    assert_eq!(topo.requests("203.0.113.10:80", 3), vec!["pod-1-1"; 3]);

    // The endpoint moves to node 2.
    topo.apply(&local_lb(&[(2, 1)]));
    assert_eq!(check(1).0, 503);
    assert_eq!(check(2).0, 200);
    // Node 1 now drops; once the load balancer follows the health checks
    // (the route moves), node 2 serves.
    let (ok, _) = topo.curl_from(CLIENT, "http://203.0.113.10/");
    assert!(!ok, "node 1 has no local endpoint any more");
    topo.route_to_node("203.0.113.0/24", 2);
    assert_eq!(topo.requests("203.0.113.10:80", 3), vec!["pod-2-1"; 3]);
}

/// After an agent restart the health check ports answer from the first
/// sync on, while the new TC programs still load (a restart verifies them
/// only after its first sync, src/datapath/programs.rs): the previous
/// agent's TC programs serve traffic from outside on the same maps
/// meanwhile, so a load balancer's checks need not fail for the
/// verifier's time. kube-proxy's health server likewise answers once its
/// first sync is done (pkg/proxy/healthcheck, updated after
/// syncProxyRules).
#[test]
fn after_a_restart_the_health_check_port_answers_before_the_new_tc_programs_load() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 0]);
    topo.http_on(1, 1);
    topo.write_services(&local_lb(&[(1, 1)]));
    topo.start_agents();
    let url = format!("http://{}/", on_node(1, 32001));
    assert_eq!(http_get(&topo, &url).0, 200, "before the restart");
    topo.stop_agent(1);
    let agent = proxy_testkit::AgentProcess::start_in(
        &topo.node(1).ns,
        std::path::Path::new(common::AGENT),
        topo.agent_args(1),
    )
    .unwrap();
    let _ = agent.wait_applied(0);
    let (status, body) = http_get(&topo, &url);
    let answered = agent.mark();
    assert_eq!(status, 200, "the health check port after the first sync: {body}");
    let loaded = agent
        .wait_for_position(0, std::time::Duration::from_secs(30), |r| {
            proxy_testkit::message(r) == Some("programs loaded")
        })
        .expect("the new TC programs loaded");
    assert!(loaded >= answered, "the check was answered before the new TC programs were loaded");
    agent
        .wait_for(loaded, std::time::Duration::from_secs(30), |r| {
            proxy_testkit::message(r).is_some_and(|m| m.starts_with("serving traffic from outside"))
        })
        .expect("the new TC programs attached");
    topo.agents[0] = Some(agent);
}

#[test]
fn load_balancer_source_ranges_block_and_allow() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1]);
    topo.http_on(1, 1);
    topo.http_on(2, 1);
    let restricted = |ranges: &str| {
        service("restricted", "LoadBalancer", &[("http", 80, 30084, "TCP")], ranges, &["203.0.113.20"])
            + &endpoints("restricted", ("http", 8080, "TCP"), &[(1, 1), (2, 1)])
    };
    topo.write_services(&restricted("  loadBalancerSourceRanges: [172.30.0.100/32]\n"));
    topo.start_agents();
    topo.route_to_node("203.0.113.0/24", 1);
    let reach = |topo: &Topology, source| {
        ["http://203.0.113.20/".to_owned(), format!("http://{}/", on_node(1, 30084))]
            .map(|url| topo.curl_from(source, &url).0)
    };
    assert_eq!(reach(&topo, CLIENT), [true, true], "172.30.0.100 is in the ranges");
    assert_eq!(reach(&topo, CLIENT2), [false, false], "172.30.0.101 is not");

    topo.apply(&restricted("  loadBalancerSourceRanges: [172.30.0.101/32]\n"));
    assert_eq!(reach(&topo, CLIENT), [false, false]);
    assert_eq!(reach(&topo, CLIENT2), [true, true]);

    topo.apply(&restricted(""));
    assert_eq!(reach(&topo, CLIENT), [true, true], "no ranges: everyone");
    assert_eq!(reach(&topo, CLIENT2), [true, true]);
}

#[test]
fn hairpin_a_pod_reaches_its_own_service_through_node_ports_and_load_balancer_ips() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1]);
    topo.http_on(1, 1);
    topo.write_services(
        &(service("hair", "LoadBalancer", &[("http", 80, 30085, "TCP")], "", &["203.0.113.30"])
            + &endpoints("hair", ("http", 8080, "TCP"), &[(1, 1)])),
    );
    topo.start_agents();
    // Its own node's NodePort and the LoadBalancer IP: translated at the
    // socket by node 1's programs (the pod is in node 1's cgroup). Node 2's
    // NodePort: node 2 translates it, source-NATs it, and sends it back to
    // the pod on node 1, whose answer returns the same way.
    for url in ["http://172.30.0.11:30085/", "http://203.0.113.30/", "http://172.30.0.12:30085/"] {
        let (ok, body) = topo.curl_from_pod(1, 1, url);
        assert!(ok, "{url}: no answer");
        assert_eq!(body, "pod-1-1\n", "{url}");
    }
}

#[test]
fn a_connection_stays_on_its_backend_when_another_is_added() {
    common::require_root!();
    a_flow_stays_on_its_backend_when_another_is_added(&[], &[(1, 1), (2, 1)], (3, 1));
}

/// With DSR the replies leave the backend's node: its check of the
/// option must accept the flow's backend also once its Maglev table
/// picks another for it. The backends are on the other nodes (the flow
/// goes by DSR whichever it takes); the one added is on the entry node.
#[test]
fn with_dsr_a_connection_stays_on_its_backend_when_another_is_added() {
    common::require_root!();
    a_flow_stays_on_its_backend_when_another_is_added(&["--nodeport-mode", "dsr"], &[(2, 1), (3, 1)], (1, 1));
}

/// A connected UDP socket sends through node 1 for 3 seconds to a
/// NodePort whose backends are `first`; `added` is added meanwhile.
fn a_flow_stays_on_its_backend_when_another_is_added(agent_args: &[&str], first: &[(u8, u8)], added: (u8, u8)) {
    let mut topo = Topology::new(&[1, 1, 1]);
    for n in 1..=3 {
        topo.udp_on(n, 1);
    }
    let dns = |pods: &[(u8, u8)]| {
        service("dns", "NodePort", &[("dns", 53, 30053, "UDP")], "", &[])
            + &endpoints("dns", ("dns", 5353, "UDP"), pods)
    };
    topo.write_services(&dns(first));
    for n in 1..=3 {
        topo.start_agent_with(n, agent_args);
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    let client = proxy_testkit::spawn_in(&topo.client, None, "/usr/bin/python3")
        .unwrap()
        .arg(script)
        .args(["udp-connect-loop", &node_ip(1).to_string(), "30053", "60", "0.05"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let all: Vec<(u8, u8)> = first.iter().copied().chain([added]).collect();
    topo.apply(&dns(&all));
    let out = client.wait_with_output().unwrap();
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
    assert!(!lines.iter().any(|l| l.starts_with("error")), "{lines:?}");
    let backends: BTreeSet<String> = udp_replies(&lines).into_iter().map(|(name, _)| name).collect();
    assert_eq!(udp_replies(&lines).len(), 60, "{lines:?}");
    assert_eq!(backends.len(), 1, "the flow moved: {backends:?}");
    let sources: BTreeSet<String> = udp_replies(&lines).into_iter().map(|(_, source)| source).collect();
    assert_eq!(sources, BTreeSet::from([on_node(1, 30053)]), "replies come from the frontend");
    for n in 1..=3 {
        assert_eq!(external_counter(&topo, n, "dsr_refused"), 0, "node {n} refused a DSR packet");
    }
}

/// Node `n`'s eth0 counters, read in its namespace: (tx bytes, rx bytes,
/// tx packets, rx packets).
fn eth0_counters(topo: &Topology, n: u8) -> [u64; 4] {
    let out = topo.node(n).ns.ip(&["-s", "-j", "link", "show", "eth0"]).unwrap();
    let link: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stats = &link[0]["stats64"];
    let get = |dir: &str, what: &str| stats[dir][what].as_u64().unwrap();
    [get("tx", "bytes"), get("rx", "bytes"), get("tx", "packets"), get("rx", "packets")]
}

/// The client's eth0 counters, as `eth0_counters`.
fn client_counters(topo: &Topology) -> [u64; 4] {
    let out = topo.client.ip(&["-s", "-j", "link", "show", "eth0"]).unwrap();
    let link: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stats = &link[0]["stats64"];
    let get = |dir: &str, what: &str| stats[dir][what].as_u64().unwrap();
    [get("tx", "bytes"), get("rx", "bytes"), get("tx", "packets"), get("rx", "packets")]
}

fn client_since(topo: &Topology, before: [u64; 4]) -> [u64; 4] {
    let now = client_counters(topo);
    [now[0] - before[0], now[1] - before[1], now[2] - before[2], now[3] - before[3]]
}

/// What node `n`'s eth0 counted since `before`.
fn eth0_since(topo: &Topology, n: u8, before: [u64; 4]) -> [u64; 4] {
    let now = eth0_counters(topo, n);
    [now[0] - before[0], now[1] - before[1], now[2] - before[2], now[3] - before[3]]
}

#[test]
fn with_dsr_replies_leave_the_backend_s_node_straight_to_the_client_and_the_backend_sees_the_client() {
    common::require_root!();
    dsr_end_to_end(&["--nodeport-mode", "dsr"]);
}

/// The same with every packet inside an outer header (`--dsr-dispatch
/// ipip`): no IP option on the client's packets, the same replies.
#[test]
fn with_ipip_dispatch_replies_leave_the_backend_s_node_straight_to_the_client() {
    common::require_root!();
    dsr_end_to_end(&["--nodeport-mode", "dsr", "--dsr-dispatch", "ipip"]);
}

/// DSR between two nodes with `agent_args` on both: the backend sees the
/// client; a 4 MiB download and UDP replies leave node 2 straight to the
/// client, never through node 1; full-size datagrams go by source NAT.
fn dsr_end_to_end(agent_args: &[&str]) {
    const BIG: usize = 4 << 20;
    let mut topo = Topology::new(&[0, 2]);
    topo.http_on(2, 1);
    topo.udp_on(2, 1);
    topo.python_http_server(2, 2);
    std::fs::write(topo.dir.path().join("pod-2-2").join("big.bin"), vec![0x5a; BIG]).unwrap();
    topo.write_services(
        &(service("web", "NodePort", &[("http", 80, 30080, "TCP")], "", &[])
            + &endpoints("web", ("http", 8080, "TCP"), &[(2, 1)])
            + &service("files", "NodePort", &[("http", 80, 30081, "TCP")], "", &[])
            + &endpoints("files", ("http", 8080, "TCP"), &[(2, 2)])
            + &service("dns", "LoadBalancer", &[("dns", 53, 30053, "UDP")], "", &["198.51.100.53"])
            + &endpoints("dns", ("dns", 5353, "UDP"), &[(2, 1)])),
    );
    for n in 1..=2 {
        topo.start_agent_with(n, agent_args);
    }

    // Node 2's device receives IPIP frames with `--dsr-dispatch ipip`
    // only (counted before its programs take them apart).
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    let mut counter = proxy_testkit::spawn_in(&topo.node(2).ns, None, "/usr/bin/python3")
        .unwrap()
        .arg(&script)
        .args(["count-tunnelled", "eth0", "2"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(counter.stdout.as_mut().unwrap()), &mut first).unwrap();
    assert_eq!(first.trim(), "listening");
    // TCP through node 1: the backend on node 2 answers and sees the
    // client's own address.
    assert_eq!(topo.requests(&on_node(1, 30080), 5), vec!["pod-2-1"; 5]);
    let count_output = String::from_utf8(counter.wait_with_output().unwrap().stdout).unwrap();
    let tunnelled: u64 = count_output.trim().strip_prefix("tunnelled ").and_then(|n| n.parse().ok()).unwrap();
    if agent_args.contains(&"ipip") {
        assert!(tunnelled >= 5 * 3, "every packet of the 5 connections arrives inside IPIP: {tunnelled}");
    } else {
        assert_eq!(tunnelled, 0, "the option dispatch sends no IPIP");
    }
    let peers: BTreeSet<IpAddr> = topo.http_server("pod-2-1").peers().iter().map(std::net::SocketAddr::ip).collect();
    assert_eq!(peers, BTreeSet::from([IpAddr::from(CLIENT)]), "the backend must see the client");

    // 4 MiB through node 1: they leave node 2's device, and node 1's
    // carries only the client's side (with source NAT, node 1 would
    // receive and send all of them again).
    let (one, two) = (eth0_counters(&topo, 1), eth0_counters(&topo, 2));
    let out = proxy_testkit::spawn_in(&topo.client, None, "curl")
        .unwrap()
        .args(["-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{size_download}"])
        .arg(format!("http://{}/big.bin", on_node(1, 30081)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), BIG.to_string());
    let (one, two) = (eth0_since(&topo, 1, one), eth0_since(&topo, 2, two));
    assert!(two[0] >= BIG as u64, "node 2 sent {} bytes", two[0]);
    assert!(
        one[0] + one[1] < (BIG / 8) as u64,
        "the reply passed node 1: it sent {}, received {} bytes",
        one[0],
        one[1]
    );

    // UDP to a LoadBalancer IP routed to node 1: every reply comes from the
    // frontend, sent by node 2; node 1 only forwards the datagrams.
    topo.route_to_node("198.51.100.53/32", 1);
    let one = eth0_counters(&topo, 1);
    let mut answered = 0;
    for port in 21_000..21_020u16 {
        let (ok, lines) = topo.probe(&["udp-sendto", "198.51.100.53", "53", "1", "0", &port.to_string()]);
        assert!(ok, "from port {port}: {lines:?}");
        let replies = udp_replies(&lines);
        assert_eq!(replies, [("pod-2-1".to_owned(), "198.51.100.53:53".to_owned())], "{lines:?}");
        answered += 1;
    }
    let one = eth0_since(&topo, 1, one);
    // Node 1 sends each datagram on once (and a few messages of its own);
    // with source NAT it would send each reply to the client as well,
    // twice as many. What it receives is no measure: the bridge floods
    // node 2's replies to every port until it has learned the client's
    // address (10 of 20 arrived at node 1 in one CI run, and were dropped
    // there).
    let sent = one[2];
    assert!(sent < answered * 3 / 2, "node 1 carried the replies: {one:?} (tx, rx bytes, packets)");

    // Datagrams that fill the 1,500-byte MTU (1,472 bytes of UDP payload)
    // have no room for the option or the outer header, and UDP has no path
    // MTU discovery: their flow goes by source NAT through node 1, and
    // each is answered.
    let (ok, lines) = topo.probe(&["udp-sendto", "198.51.100.53", "53", "3", "0", "21100", "1472"]);
    assert!(ok, "{lines:?}");
    assert_eq!(udp_replies(&lines), vec![("pod-2-1".to_owned(), "198.51.100.53:53".to_owned()); 3], "{lines:?}");
    assert_eq!(external_counter(&topo, 1, "dsr_to_snat"), 1, "one flow moved to source NAT");
    assert_eq!(external_counter(&topo, 1, "dsr_too_big"), 0);
    assert_eq!(external_counter(&topo, 2, "dsr_refused"), 0);
}

#[test]
fn a_real_http_server_behind_node_ports_on_other_nodes() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1, 1]);
    topo.python_http_server(2, 1);
    topo.python_http_server(3, 1);
    topo.write_services(
        &(service("files", "NodePort", &[("http", 80, 30086, "TCP")], "", &[])
            + &endpoints("files", ("http", 8080, "TCP"), &[(2, 1), (3, 1)])),
    );
    topo.start_agents();
    let mut names = BTreeSet::new();
    for _ in 0..20 {
        let (status, body) = http_get(&topo, &format!("http://{}/name.txt", on_node(1, 30086)));
        assert_eq!(status, 200, "{body}");
        names.insert(body);
    }
    assert_eq!(names, BTreeSet::from(["pod-2-1\n".to_owned(), "pod-3-1\n".to_owned()]));
}

#[test]
fn traffic_from_outside_flows_while_the_agent_is_stopped_and_cleanup_detaches_the_tc_programs() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1]);
    topo.http_on(1, 1);
    topo.http_on(2, 1);
    topo.write_services(
        &(service("web", "NodePort", &[("http", 80, 30080, "TCP")], "", &[])
            + &endpoints("web", ("http", 8080, "TCP"), &[(1, 1), (2, 1)])),
    );
    topo.start_agents();

    // A steady stream of connections from outside through node 1 while
    // its agent stops (its pinned programs, maps and flows stay) and a new
    // one takes them over: not one fails.
    let mut stream = proxy_testkit::spawn_in(&topo.client, None, "curl")
        .unwrap()
        .args(["-sS", "--connect-timeout", "2", &format!("http://{}/?[1-10000000]", on_node(1, 30080))])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    topo.stop_agent(1);
    std::thread::sleep(std::time::Duration::from_millis(500));
    topo.start_agent(1);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = stream.kill();
    let out = stream.wait_with_output().unwrap();
    let answered = String::from_utf8_lossy(&out.stdout).lines().count();
    let errors = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(answered > 50, "only {answered} requests got through");
    assert!(!errors.contains("curl: ("), "a connection failed across the restart: {errors}");
    assert_eq!(topo.requests(&on_node(1, 30080), 20).len(), 20);

    // What node 1's kernel does, read from its pins by the command line.
    let run = |args: &[&str]| {
        let node = topo.node(1);
        let out = node.command(common::AGENT).args(args).arg("--bpffs-dir").arg(&node.pin_dir).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let status = run(&["status"]);
    for line in ["tc-eth0-ingress", "device eth0 ingress", "tc-eth0-egress", "device eth0 egress", "Maglev tables: 1"] {
        assert!(status.contains(line), "{line:?} missing from:\n{status}");
    }
    let list: serde_json::Value = serde_json::from_str(&run(&["service", "list", "-o", "json"])).unwrap();
    let node_port = list
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["address"] == node_ip(1).to_string() && f["port"] == 30080)
        .expect("the NodePort on node 1's address");
    assert!(node_port["maglev_table"].as_u64().is_some(), "{node_port}");
    let local: Vec<bool> = node_port["backends"].as_array().unwrap().iter().map(|b| b["local"] == true).collect();
    assert_eq!(local, vec![true, false], "pod-1-1 is node 1's, pod-2-1 is not: {node_port}");

    // `ebpf-proxy cleanup` on node 1: its TC programs detach and unload.
    // Node 1's own programs, by id (the links it pinned): other tests load
    // TC programs at the same time, so a count of all of them would race.
    let node1_tc_programs: std::collections::BTreeSet<u32> = std::fs::read_dir(topo.node(1).pin_dir.join("links"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("tc-") || name.starts_with("pod-")
        })
        .filter_map(|e| ebpf_proxy::datapath::links::pinned_link_info(&e.path()).ok())
        .map(|info| info.program_id)
        .collect();
    assert!(node1_tc_programs.len() >= 2, "node 1's TC links: {node1_tc_programs:?}");
    let still_loaded = || {
        aya::programs::loaded_programs().filter_map(Result::ok).filter(|p| node1_tc_programs.contains(&p.id())).count()
    };
    topo.stop_agent(1);
    let out = topo
        .node(1)
        .command(common::AGENT)
        .arg("cleanup")
        .arg("--bpffs-dir")
        .arg(&topo.node(1).pin_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while still_loaded() != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(still_loaded(), 0, "node 1's TC programs are still loaded: {node1_tc_programs:?}");
    let (ok, _) = topo.curl_from(CLIENT, &format!("http://{}/", on_node(1, 30080)));
    assert!(!ok, "node 1 still translates after cleanup");
    assert_eq!(topo.requests(&on_node(2, 30080), 5).len(), 5, "node 2 is unaffected");
}

/// kube-proxy rejects traffic from outside to a service without endpoints
/// (KUBE-EXTERNAL-SERVICES, pkg/proxy/iptables/proxier.go: REJECT when the
/// service `!hasEndpoints`): the client fails at once instead of after a
/// timeout. With endpoints on other nodes only and externalTrafficPolicy:
/// Local it drops instead (the same code: "has no local endpoints", DROP;
/// the load balancer's health check keeps clients away from such a node).
#[test]
fn a_node_port_without_endpoints_is_refused_and_external_policy_local_still_drops() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1]);
    topo.http_on(2, 1);
    topo.write_services(
        &(service("empty", "NodePort", &[("http", 80, 30087, "TCP"), ("dns", 53, 30088, "UDP")], "", &[])
            + &endpoints("empty", ("http", 8080, "TCP"), &[])
            + &service(
                "elsewhere",
                "NodePort",
                &[("http", 80, 30089, "TCP")],
                "  externalTrafficPolicy: Local\n",
                &[],
            )
            + &endpoints("elsewhere", ("http", 8080, "TCP"), &[(2, 1)])),
    );
    topo.start_agents();
    let node1 = node_ip(1).to_string();
    for n in 1..=2 {
        let (ok, lines) = topo.probe(&["tcp-peer", &node_ip(n).to_string(), "30087"]);
        assert_eq!((ok, lines), (false, vec!["error ECONNREFUSED".to_owned()]), "TCP through node {n}");
    }
    // A connected UDP socket learns of the ICMP port unreachable.
    let (ok, lines) = topo.probe(&["udp-connect", &node1, "30088", "1"]);
    assert!(!ok, "{lines:?}");
    assert_eq!(lines.last().map(String::as_str), Some("error ECONNREFUSED"), "{lines:?}");
    // externalTrafficPolicy: Local, the endpoint on node 2: node 1 drops,
    // so the client waits (its 2 s timeout) rather than being refused.
    let (ok, lines) = topo.probe(&["tcp-peer", &node1, "30089"]);
    assert_eq!((ok, lines), (false, vec!["error timeout".to_owned()]));
    assert_eq!(topo.requests(&on_node(2, 30089), 3), vec!["pod-2-1"; 3], "node 2 serves it");

    // An endpoint appears: the same NodePort now answers.
    topo.http_on(1, 1);
    topo.apply(
        &(service("empty", "NodePort", &[("http", 80, 30087, "TCP"), ("dns", 53, 30088, "UDP")], "", &[])
            + &endpoints("empty", ("http", 8080, "TCP"), &[(1, 1)])),
    );
    assert_eq!(topo.requests(&on_node(2, 30087), 3), vec!["pod-1-1"; 3]);
}

/// The Service of a hostNetwork-style endpoint: `hosts` (node numbers)
/// serve on their node's own address without `nodeName` (as a hand-made
/// EndpointSlice, or a hostNetwork pod's, may have), `pods` as usual.
fn host_network_service(name: &str, node_port: u16, hosts: &[u8], pods: &[(u8, u8)]) -> String {
    let mut yaml = service(name, "NodePort", &[("http", 80, node_port, "TCP")], "", &[])
        + &endpoints(name, ("http", 8080, "TCP"), pods);
    if pods.is_empty() {
        yaml = yaml.replace("endpoints: []\n", "endpoints:\n");
    }
    for n in hosts {
        writeln!(yaml, "- {{addresses: [\"{}\"], conditions: {{ready: true}}}}", node_ip(*n)).unwrap();
    }
    yaml
}

/// An endpoint at a node's own address without nodeName is delivered on
/// that node (its routes say the address is local) and source-NATed to it
/// from the others, whichever Maglev slot a flow hashes to.
#[test]
fn an_endpoint_at_a_node_address_without_node_name_answers_through_every_node() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1]);
    topo.http_on(2, 1);
    // Node 1's "host network": a server on the node's own address.
    let host = proxy_testkit::HttpBackend::start(&topo.node(1).ns, node_ip(1).into(), 8080, "host-1").unwrap();
    topo.http.push(host);
    topo.write_services(
        &(host_network_service("hostnet", 30090, &[1], &[]) + &host_network_service("mixed", 30091, &[1], &[(2, 1)])),
    );
    topo.start_agents();
    for n in 1..=2 {
        assert_eq!(topo.requests(&on_node(n, 30090), 10), vec!["host-1"; 10], "through node {n}");
    }
    // Every flow answers (`requests` fails unless all do), through both
    // nodes, and both endpoints take some.
    for n in 1..=2 {
        let answers: BTreeSet<String> = topo.requests(&on_node(n, 30091), 40).into_iter().collect();
        assert_eq!(answers, BTreeSet::from(["host-1".to_owned(), "pod-2-1".to_owned()]), "through node {n}");
    }
    // Delivered on node 1 without source NAT: the server saw the client.
    let peers: BTreeSet<IpAddr> = topo.http_server("host-1").peers().iter().map(std::net::SocketAddr::ip).collect();
    assert!(peers.contains(&IpAddr::V4(CLIENT)), "node 1 delivered with the client's address: {peers:?}");
    assert!(peers.contains(&IpAddr::V4(node_ip(2))), "node 2 source-NATed to its own address: {peers:?}");
}

/// kube-proxy takes over connections from pods and from the node to every
/// externalIP (its KUBE-SERVICES chain runs in OUTPUT and PREROUTING; the
/// upstream e2e test "should be possible to connect to a service via
/// ExternalIP when the external IP is not assigned to a node"); with
/// `--external-ips-local-only` they reach the address itself.
#[test]
fn an_external_ip_of_another_machine_is_taken_over_for_clients_on_the_node_unless_local_only() {
    common::require_root!();
    let mut topo = Topology::new(&[2]);
    topo.http_on(1, 1);
    // The machine that really holds 203.0.113.77: the client's namespace,
    // with a server of its own there.
    let real: IpAddr = "203.0.113.77".parse().unwrap();
    topo.client.ip(&["addr", "add", "203.0.113.77/32", "dev", "eth0"]).unwrap();
    topo.client.ip(&["route", "add", "10.244.1.0/24", "via", &node_ip(1).to_string()]).unwrap();
    topo.node(1).ns.ip(&["route", "add", "203.0.113.77/32", "via", &CLIENT.to_string()]).unwrap();
    topo.http.push(proxy_testkit::HttpBackend::start(&topo.client, real, 80, "real").unwrap());
    topo.write_services(
        &(service("ext", "ClusterIP", &[("http", 80, 30092, "TCP")], "  externalIPs: [203.0.113.77]\n", &[])
            + &endpoints("ext", ("http", 8080, "TCP"), &[(1, 1)])),
    );
    // A pod (another one than the endpoint) and the node itself, both in
    // the node's cgroup.
    let from_pod_and_node = |topo: &Topology| -> [String; 2] {
        let node = topo.node(1);
        let from_node = proxy_testkit::spawn_in(&node.ns, Some(&node.cgroup), "curl")
            .unwrap()
            .args(["-sS", "--connect-timeout", "2", "--max-time", "5", "http://203.0.113.77/"])
            .output()
            .unwrap();
        let (ok, from_pod) = topo.curl_from_pod(1, 2, "http://203.0.113.77/");
        assert!(ok && from_node.status.success(), "{}", String::from_utf8_lossy(&from_node.stderr));
        [from_pod, String::from_utf8_lossy(&from_node.stdout).into_owned()]
    };

    topo.start_agents();
    assert_eq!(from_pod_and_node(&topo), ["pod-1-1\n", "pod-1-1\n"], "by default: the service's endpoint");

    topo.stop_agent(1);
    topo.start_agent_with(1, &["--external-ips-local-only"]);
    assert_eq!(from_pod_and_node(&topo), ["real\n", "real\n"], "--external-ips-local-only: the address itself");
}

/// Node `n`'s agent started without `--node-ip` (and the services file
/// has no Node object): it knows the node's addresses only from its
/// devices. `extra`: more arguments.
fn start_without_node_ip(topo: &mut Topology, n: u8, extra: &[&str]) {
    let mut args = topo.agent_args(n);
    let at = args.iter().position(|a| a == "--node-ip").expect("agent_args gives --node-ip");
    args.drain(at..at + 2);
    args.extend(extra.iter().map(ToString::to_string));
    topo.start_agent_args(n, args);
}

/// Waits (after record `mark`) for the agent's line naming the addresses
/// serving NodePorts, returning them.
fn node_port_addresses(topo: &Topology, n: u8, mark: usize) -> BTreeSet<String> {
    let agent = topo.agents[usize::from(n - 1)].as_ref().expect("a running agent");
    let record = agent
        .wait_for(mark, std::time::Duration::from_secs(10), |r| {
            proxy_testkit::message(r) == Some("addresses serving NodePorts")
        })
        .expect("the agent named no addresses serving NodePorts");
    let addresses = proxy_testkit::field(&record, "addresses").and_then(|a| a.as_str()).unwrap_or_default();
    addresses.split(',').filter(|a| !a.is_empty()).map(str::to_owned).collect()
}

/// kube-proxy's rules (pkg/proxy/util/nodeport_addresses.go and its
/// iptables proxier, v1.29 and later, iptables being its default mode):
/// with nodePortAddresses unset a NodePort is answered on every local
/// address of the node (`-m addrtype --dst-type LOCAL`, loopback
/// included), whatever the Node object says, and an address added later
/// answers at once; with CIDRs, only the local addresses inside them (and
/// 127.0.0.1 only when they cover it). The issue this follows: a
/// services-file run with no `--node-ip` answered no NodePort on the
/// node's own device address.
#[test]
fn node_ports_are_answered_on_the_node_s_local_addresses_as_they_come_within_node_port_addresses() {
    common::require_root!();
    let mut topo = Topology::new(&[1]);
    topo.http_on(1, 1);
    topo.write_services(
        &(service("web", "NodePort", &[("http", 80, 30090, "TCP")], "", &[])
            + &endpoints("web", ("http", 8080, "TCP"), &[(1, 1)])),
    );
    // As on a real node, a default route (its device, eth0, gets the TC
    // programs; with no node IP known, no device is chosen by address).
    topo.node(1).ns.ip(&["route", "add", "default", "via", &CLIENT.to_string()]).unwrap();
    start_without_node_ip(&mut topo, 1, &[]);
    let serving = node_port_addresses(&topo, 1, 0);
    let want: BTreeSet<String> = ["172.30.0.11", "10.244.1.1", "127.0.0.1"].map(str::to_owned).into();
    assert_eq!(serving, want, "eth0's, cni0's and loopback's addresses (link-local IPv6 never)");
    assert_eq!(topo.requests(&on_node(1, 30090), 5), vec!["pod-1-1"; 5], "the device's own address");

    // An address added to eth0 while the agent runs (inside the test's
    // node namespace) answers once the agent has seen it.
    let added = "172.30.0.50";
    let agent = topo.agents[0].as_ref().unwrap();
    let mark = agent.mark();
    topo.node(1).ns.ip(&["addr", "add", &format!("{added}/24"), "dev", "eth0"]).unwrap();
    let serving = node_port_addresses(&topo, 1, mark);
    assert!(serving.contains(added), "{serving:?}");
    let _ = topo.agents[0].as_ref().unwrap().wait_applied(mark);
    assert_eq!(topo.requests(&format!("{added}:30090"), 5), vec!["pod-1-1"; 5], "the address added later");

    // nodePortAddresses 172.30.0.0/28 covers 172.30.0.11 only: the added
    // address (still on eth0), cni0's and 127.0.0.1 serve no NodePort.
    topo.stop_agent(1);
    start_without_node_ip(&mut topo, 1, &["--nodeport-addresses", "172.30.0.0/28"]);
    let serving = node_port_addresses(&topo, 1, 0);
    assert_eq!(serving, BTreeSet::from(["172.30.0.11".to_owned()]));
    assert_eq!(topo.requests(&on_node(1, 30090), 5), vec!["pod-1-1"; 5], "inside the range");
    let (ok, body) = topo.curl_from(CLIENT, &format!("http://{added}:30090/"));
    // (It answered the same request above: the address is reachable.)
    assert!(!ok, "an address outside nodePortAddresses answered the NodePort: {body}");
}

/// Makes the veth topology behave like NICs for XDP on the nodes' eth0
/// (`proxy_testkit::veth_xdp`): the senders towards a node (the client,
/// the pods) fill in their checksums, and the bridge-side peers of the
/// nodes' eth0 run an XDP program.
fn prepare_veths_for_xdp(topo: &mut Topology, nodes: u8) {
    use proxy_testkit::veth_xdp;
    veth_xdp::tx_checksum(&topo.client, "eth0", false).unwrap();
    let mut peers = Vec::new();
    for n in 1..=nodes {
        for pod in &topo.node(n).pods {
            veth_xdp::tx_checksum(&pod.ns, "eth0", false).unwrap();
        }
        peers.push(format!("vn{n}"));
    }
    let peers: Vec<&str> = peers.iter().map(String::as_str).collect();
    topo.xdp_pass.push(veth_xdp::pass_all(&topo.lan, &peers).unwrap());
}

/// Node `n`'s counter `name` of traffic from outside (`external_stat`).
fn external_counter(topo: &Topology, n: u8, name: &str) -> u64 {
    let maps = ebpf_proxy::paths::current_maps_dir(&topo.node(n).pin_dir).expect("pinned maps");
    let stats =
        ebpf_proxy::datapath::counters::ExternalStats::open_pinned(&maps.join(proxy_common::map_names::EXTERNAL_STATS))
            .unwrap();
    stats.read().unwrap().into_iter().find(|(k, _)| *k == name).unwrap().1
}

/// The XDP link pinned for node `n`'s eth0, if any: (link id, program id).
fn xdp_link(topo: &Topology, n: u8) -> Option<(u32, u32)> {
    use ebpf_proxy::datapath::links::{LinkTarget, pinned_link_info};
    let info = pinned_link_info(&topo.node(n).pin_dir.join("links").join("xdp-eth0")).ok()?;
    assert!(matches!(info.target, LinkTarget::Xdp { .. }), "{info:?}");
    Some((info.link_id, info.program_id))
}

/// Whether node `n`'s eth0 runs an XDP program, as `ip link` shows it.
fn eth0_has_xdp(topo: &Topology, n: u8) -> bool {
    let out = topo.node(n).command("ip").args(["-d", "link", "show", "eth0"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

/// Whether node `n`'s eth0 stops running an XDP program within 5 s (the
/// kernel detaches a link whose last pin and fd are gone a moment later,
/// not at once).
fn eth0_loses_xdp(topo: &Topology, n: u8) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while eth0_has_xdp(topo, n) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    true
}

#[test]
fn xdp_acceleration_serves_node_ports_here_and_elsewhere_and_is_taken_over_on_restart() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1]);
    topo.http_on(1, 1);
    topo.http_on(2, 1);
    prepare_veths_for_xdp(&mut topo, 2);
    topo.write_services(
        &(service("here", "NodePort", &[("http", 80, 30086, "TCP")], "", &[])
            + &endpoints("here", ("http", 8080, "TCP"), &[(1, 1)])
            + &service("there", "NodePort", &[("http", 80, 30087, "TCP")], "", &[])
            + &endpoints("there", ("http", 8080, "TCP"), &[(2, 1)])),
    );
    for n in 1..=2 {
        topo.start_agent_with(n, &["--nodeport-acceleration", "native"]);
    }
    assert!(eth0_has_xdp(&topo, 1) && eth0_has_xdp(&topo, 2), "XDP attached in native mode");
    let (link, program) = xdp_link(&topo, 1).expect("node 1's XDP link is pinned");

    // Through node 1: its own pod (rewritten by XDP, passed to the stack),
    // and node 2's (rewritten and sent back out by XDP, source-NATed; the
    // replies come back to node 1 and XDP sends them to the client).
    assert_eq!(topo.requests(&on_node(1, 30086), 5), vec!["pod-1-1"; 5]);
    assert_eq!(topo.requests(&on_node(1, 30087), 5), vec!["pod-2-1"; 5]);
    let peers: BTreeSet<IpAddr> = topo.http_server("pod-2-1").peers().iter().map(std::net::SocketAddr::ip).collect();
    assert_eq!(peers, BTreeSet::from([IpAddr::V4(node_ip(1))]), "source NAT to node 1's address");
    let translated = external_counter(&topo, 1, "xdp_translated");
    // Each request is at least a SYN, an ACK with the request and a FIN
    // (curl's connections are not kept across URLs here), plus the replies
    // of node 2's pod: all of them through XDP.
    assert!(translated >= 30, "XDP translated {translated} packets on node 1");

    // A restart takes the link over: the same link (never detached), the
    // new agent's program in it; served while the agent is away.
    topo.stop_agent(1);
    assert_eq!(xdp_link(&topo, 1).map(|(l, _)| l), Some(link), "the link stays while the agent is stopped");
    assert_eq!(topo.requests(&on_node(1, 30087), 3), vec!["pod-2-1"; 3], "served with the agent stopped");
    topo.start_agent_with(1, &["--nodeport-acceleration", "native"]);
    let (link_after, program_after) = xdp_link(&topo, 1).expect("still pinned");
    assert_eq!(link_after, link, "the restart updated the link in place (no detach, no gap)");
    assert_ne!(program_after, program, "the new agent's program runs in it");
    let before = external_counter(&topo, 1, "xdp_translated");
    assert_eq!(topo.requests(&on_node(1, 30087), 3), vec!["pod-2-1"; 3]);
    assert!(external_counter(&topo, 1, "xdp_translated") > before, "XDP still translates after the restart");

    // Restarted without acceleration: the XDP link goes, TC serves alone.
    topo.stop_agent(1);
    topo.start_agent(1);
    assert_eq!(xdp_link(&topo, 1), None, "the XDP link is dropped when acceleration is off");
    assert!(eth0_loses_xdp(&topo, 1), "the XDP program stays on node 1's eth0");
    assert_eq!(topo.requests(&on_node(1, 30087), 3), vec!["pod-2-1"; 3], "TC alone serves it");

    // cleanup detaches node 2's XDP program.
    topo.stop_agent(2);
    let out = std::process::Command::new(common::AGENT)
        .args(["cleanup", "--bpffs-dir"])
        .arg(&topo.node(2).pin_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(eth0_loses_xdp(&topo, 2), "cleanup left the XDP program on node 2's eth0");
}

/// Whether node 1's agent logged a record at `level` about `device`.
fn logged_about(topo: &Topology, device: &str, level: &str) -> bool {
    let agent = topo.agents[0].as_ref().unwrap();
    agent
        .wait_for(0, std::time::Duration::from_secs(10), |r| {
            proxy_testkit::field(r, "device").and_then(|d| d.as_str()) == Some(device)
                && r.get("level").and_then(|l| l.as_str()) == Some(level)
        })
        .is_ok()
}

/// Whether node 1's agent logged a message starting with `start` about
/// `device`.
fn logged_that(topo: &Topology, device: &str, start: &str) -> bool {
    let agent = topo.agents[0].as_ref().unwrap();
    agent
        .wait_for(0, std::time::Duration::from_secs(10), |r| {
            proxy_testkit::field(r, "device").and_then(|d| d.as_str()) == Some(device)
                && proxy_testkit::message(r).is_some_and(|m| m.starts_with(start))
        })
        .is_ok()
}

#[test]
fn best_effort_takes_xdp_only_where_it_pays_and_native_says_where_it_fails_or_costs() {
    common::require_root!();
    let mut topo = Topology::new(&[1]);
    topo.http_on(1, 1);
    topo.write_services(
        &(service("here", "NodePort", &[("http", 80, 30088, "TCP")], "", &[])
            + &endpoints("here", ("http", 8080, "TCP"), &[(1, 1)])),
    );
    // cni0, a bridge, has no native XDP (bridges have no XDP driver hook);
    // eth0, a veth, has, but XDP there is slower than TC alone
    // (docs/performance.md, "The outside path"): best-effort leaves both
    // to TC, and says why.
    let devices = ["--devices", "eth0,cni0"];
    topo.start_agent_with(1, &[&["--nodeport-acceleration", "best-effort"][..], &devices[..]].concat());
    assert!(logged_about(&topo, "cni0", "WARN"), "best-effort warns about cni0");
    assert!(logged_that(&topo, "eth0", "--nodeport-acceleration=best-effort: no XDP"), "best-effort says why not eth0");
    assert!(!eth0_has_xdp(&topo, 1), "a veth is left to TC with best-effort");
    let links: BTreeSet<String> = std::fs::read_dir(topo.node(1).pin_dir.join("links"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(links.contains("tc-cni0-ingress") && !links.contains("xdp-cni0"), "{links:?}");
    assert!(links.contains("tc-eth0-ingress") && !links.contains("xdp-eth0"), "{links:?}");
    assert_eq!(topo.requests(&on_node(1, 30088), 3), vec!["pod-1-1"; 3], "TC serves it");

    // native: cni0 is an error (TC still serves it), eth0 accelerated with
    // a warning that it is slower there.
    topo.stop_agent(1);
    topo.start_agent_with(1, &[&["--nodeport-acceleration", "native"][..], &devices[..]].concat());
    assert!(logged_about(&topo, "cni0", "ERROR"), "native fails cni0");
    assert!(logged_that(&topo, "eth0", "--nodeport-acceleration=native on a device where XDP is slower"));
    // The error costs nothing else: eth0 still accelerated, cni0 still
    // served by TC, the NodePort still answered.
    let links: BTreeSet<String> = std::fs::read_dir(topo.node(1).pin_dir.join("links"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(links.contains("tc-cni0-ingress") && !links.contains("xdp-cni0"), "{links:?}");
    assert!(links.contains("xdp-eth0") && eth0_has_xdp(&topo, 1), "{links:?}");
    assert_eq!(topo.requests(&on_node(1, 30088), 3), vec!["pod-1-1"; 3], "served after the error");
}

/// kube-proxy's NodePort rules on node `n` for `web` (TCP 30080) and
/// `dns` (UDP 30053), reduced to what they do to a packet from outside:
/// DNAT to the backend on pod (2, 1) and masquerade (kube-proxy's
/// KUBE-NODEPORTS → KUBE-SVC → KUBE-SEP chains and KUBE-MARK-MASQ;
/// proxy-userspace/bench/src/nodeport_rules.rs writes them whole). `op`:
/// `-A` adds them, `-D` removes them.
fn kube_proxy_rules(topo: &Topology, n: u8, op: &str) {
    let backend = common::topology::pod_ip(2, 1).to_string();
    let ns = topo.node(n).ns.name().to_owned();
    let rules: [&[&str]; 3] = [
        &["PREROUTING", "-p", "tcp", "--dport", "30080", "-j", "DNAT", "--to-destination", &format!("{backend}:9000")],
        &["PREROUTING", "-p", "udp", "--dport", "30053", "-j", "DNAT", "--to-destination", &format!("{backend}:5353")],
        &["POSTROUTING", "-d", &backend, "-j", "MASQUERADE"],
    ];
    for rule in rules {
        let mut args = vec!["netns", "exec", &ns, "iptables", "-w", "-t", "nat", op];
        args.extend_from_slice(rule);
        proxy_testkit::sh("ip", &args).expect("iptables in the node's namespace");
    }
}

/// The maps directory of node `n`'s agent.
fn maps_dir(topo: &Topology, n: u8) -> std::path::PathBuf {
    ebpf_proxy::paths::current_maps_dir(&topo.node(n).pin_dir).expect("the agent pinned its maps")
}

/// Node `n`'s counters of traffic from outside, by name.
fn external_stats(topo: &Topology, n: u8) -> BTreeMap<&'static str, u64> {
    let path = maps_dir(topo, n).join(proxy_common::map_names::EXTERNAL_STATS);
    ebpf_proxy::datapath::counters::ExternalStats::open_pinned(&path).unwrap().read().unwrap().into_iter().collect()
}

/// A probe from the client, running in the background (killed on drop).
fn probe_in_background(topo: &Topology, args: &[&str]) -> common::topology::ChildGuard {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    let child = proxy_testkit::spawn_in(&topo.client, None, "/usr/bin/python3")
        .unwrap()
        .arg(script)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::topology::ChildGuard(child)
}

/// Waits for a background probe: (exit ok, output lines).
fn finish(mut probe: common::topology::ChildGuard) -> (bool, Vec<String>) {
    use std::io::Read as _;
    let status = probe.0.wait().unwrap();
    let mut out = String::new();
    probe.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    (status.success(), out.lines().map(str::to_owned).collect())
}

/// Two NodePorts to the TCP echo server of pod (2, 1): 30080 by the node's
/// mode, 30081 by source NAT (the `nodeport-mode` annotation).
fn dsr_and_snat_echo() -> String {
    service("dsr", "NodePort", &[("echo", 80, 30080, "TCP")], "", &[])
        + &endpoints("dsr", ("echo", 9000, "TCP"), &[(2, 1)])
        + &service("snat", "NodePort", &[("echo", 80, 30081, "TCP")], "", &[]).replacen(
            "namespace: t}",
            "namespace: t, annotations: {ebpf-proxy.io/nodeport-mode: snat}}",
            1,
        )
        + &endpoints("snat", ("echo", 9000, "TCP"), &[(2, 1)])
}

/// A move to bigger maps (`agent::resize`) under traffic from outside fails
/// no flow: the flows in `CT` are carried into the new maps under the new
/// set's ids (`reconcile::remap`). Without that, a DSR connection's replies
/// leave the backend's node untranslated (its reply entry is made by the
/// SYN alone) and a source-NATed one takes a new NAT port mid-connection;
/// either is reset. kube-proxy's conntrack never moves, so its flows never
/// see such a step.
#[test]
fn a_move_to_bigger_maps_fails_no_flow_from_outside() {
    common::require_root!();
    let mut topo = Topology::new(&[0, 1]);
    topo.tcp_echo_on(2, 1, 9000);
    let base = dsr_and_snat_echo();
    topo.write_services(&base);
    for n in 1..=2 {
        topo.start_agent_with(n, &["--nodeport-mode", "dsr"]);
    }
    let node1 = node_ip(1).to_string();
    // 100 exchanges 0.1 s apart on each connection, the move in between.
    let mut dsr = probe_in_background(&topo, &["tcp-hold", &node1, "30080", "100", "0.1"]);
    let mut snat = probe_in_background(&topo, &["tcp-hold", &node1, "30081", "100", "0.1"]);
    std::thread::sleep(std::time::Duration::from_secs(1));
    // 2,100 one-port ClusterIP services more: past the 4,096 entries the
    // smallest maps hold (a slot 0 and a slots entry each), on both nodes.
    let mut more = base;
    for i in 0..2100u16 {
        let ip = std::net::Ipv4Addr::new(10, 97, u8::try_from(i / 250).unwrap(), u8::try_from(i % 250 + 1).unwrap());
        write!(
            more,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: more-{i}, namespace: t}}\nspec: {{clusterIP: {ip}, ports: [{{name: echo, port: 80}}]}}\n"
        )
        .unwrap();
        more += &endpoints(&format!("more-{i}"), ("echo", 9000, "TCP"), &[(2, 1)]);
    }
    let marks: Vec<usize> = [1, 2].iter().map(|n| topo.agents[*n - 1].as_ref().unwrap().mark()).collect();
    topo.write_services(&more);
    for (n, mark) in [1, 2].into_iter().zip(marks) {
        let agent = topo.agents[n - 1].as_ref().unwrap();
        let carried = |when: &'static str| {
            agent
                .wait_for(mark, std::time::Duration::from_mins(1), |r| {
                    proxy_testkit::message(r) == Some("flows carried into the new maps")
                        && proxy_testkit::field(r, "when").and_then(serde_json::Value::as_str) == Some(when)
                })
                .unwrap_or_else(|e| panic!("node {n}'s agent moved to bigger maps: {e}"))
        };
        // Node 1 holds both flows (DSR's and the source NAT's two ways),
        // node 2 the DSR flow's reply entry.
        let before = carried("before the swap");
        let count = proxy_testkit::field(&before, "carried").and_then(serde_json::Value::as_u64).unwrap_or(0);
        assert!(count >= 1, "node {n} carried no flow: {before}");
        carried("after the swap");
    }
    for probe in [&mut dsr, &mut snat] {
        assert!(probe.0.try_wait().unwrap().is_none(), "the connections must outlast the move");
    }
    for (name, probe) in [("DSR", dsr), ("source NAT", snat)] {
        let (ok, lines) = finish(probe);
        assert!(ok && lines.len() == 100, "the {name} connection through the move: {lines:?}");
    }
}

/// An east-west flow kube-proxy translated: node 1's own connection to
/// web's ClusterIP (its OUTPUT chain's DNAT, in namespace `ns`), which the
/// TC programs never see, so a takeover must not spend a `CT` entry on it.
fn east_west_flow(topo: &Topology, ns: &str) -> common::topology::ChildGuard {
    let web_ip = cluster_ip("web").to_string();
    let east_west_rule = ["-p", "tcp", "-d", &web_ip, "--dport", "80", "-j", "DNAT", "--to-destination"];
    let backend = format!("{}:9000", common::topology::pod_ip(2, 1));
    let nat = ["netns", "exec", ns, "iptables", "-w", "-t", "nat", "-A", "OUTPUT"];
    proxy_testkit::sh("ip", &[&nat[..], &east_west_rule[..], &[backend.as_str()]].concat()).unwrap();
    // A route to the ClusterIP for the socket to connect at all (the DNAT
    // then sends it to the backend), as a node's default route gives one.
    let via = node_ip(2).to_string();
    proxy_testkit::sh("ip", &["-n", ns, "route", "add", &format!("{web_ip}/32"), "via", &via]).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    common::topology::ChildGuard(
        proxy_testkit::spawn_in(&topo.node(1).ns, None, "/usr/bin/python3")
            .unwrap()
            .arg(&script)
            .args(["tcp-hold", &web_ip, "80", "60", "0.2"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Node 1's agent marked netfilter's flows, `east_west_flow`'s left out.
fn assert_east_west_flow_not_marked(topo: &Topology) {
    let agent = topo.agents[0].as_ref().unwrap();
    let marked = agent
        .wait_for(0, std::time::Duration::from_secs(10), |r| {
            proxy_testkit::message(r) == Some("netfilter's flows marked for the handover")
        })
        .expect("the agent marks netfilter's flows");
    let field = |name| proxy_testkit::field(&marked, name).and_then(serde_json::Value::as_u64).unwrap();
    assert_eq!(field("dnat_flows") - field("to_frontends_seen"), 1, "the east-west flow is left out: {marked}");
    let ct = pinned_ct(topo, 1);
    let web = proxy_common::net::encode(cluster_ip("web").into());
    assert!(!ct.iter().filter_map(Result::ok).any(|(k, _)| k.dst == web), "an east-west flow marked in CT");
}

/// Live takeover from a running kube-proxy, the datapath side
/// (`--outside-handover`, docs/design.md "Taking over from kube-proxy"):
/// a TCP connection and a UDP flow set up by kube-proxy's DNAT on node 1
/// keep exchanging, with no error, while node 1's agent starts deferring to
/// netfilter, switches to handover, and kube-proxy's rules go; new
/// connections made meanwhile go through the agent's TC program.
#[test]
fn a_takeover_from_kube_proxy_keeps_its_flows_and_serves_new_ones() {
    common::require_root!();
    takeover_from_kube_proxy(false);
}

/// The same with XDP in front of TC on node 1 (`--nodeport-acceleration`):
/// XDP passes netfilter's packets up and translates the new flows itself.
#[test]
fn a_takeover_from_kube_proxy_with_xdp_keeps_its_flows_and_serves_new_ones() {
    common::require_root!();
    takeover_from_kube_proxy(true);
}

fn takeover_from_kube_proxy(xdp: bool) {
    let mut topo = Topology::new(&[0, 1]);
    if xdp {
        prepare_veths_for_xdp(&mut topo, 2);
    }
    topo.udp_on(2, 1);
    topo.tcp_echo_on(2, 1, 9000);
    let services = service("web", "NodePort", &[("echo", 80, 30080, "TCP")], "", &[])
        + &endpoints("web", ("echo", 9000, "TCP"), &[(2, 1)])
        + &service("dns", "NodePort", &[("dns", 53, 30053, "UDP")], "", &[])
        + &endpoints("dns", ("dns", 5353, "UDP"), &[(2, 1)])
        + &service("spare", "NodePort", &[("dns", 53, 30054, "UDP")], "", &[]);
    topo.write_services(&(services.clone() + &endpoints("spare", ("dns", 5353, "UDP"), &[(2, 1)])));
    kube_proxy_rules(&topo, 1, "-A");
    // The CNI's masquerade of pod traffic leaving the cluster, which is not
    // kube-proxy's and stays. Without any rule that needs conntrack, the
    // kernel would stop tracking connections in the node's namespace once
    // kube-proxy's rules are gone (nf_ct_netns_put), and every flow its
    // DNAT set up would break at that instant (seen here).
    let ns = topo.node(1).ns.name().to_owned();
    let cni = ["netns", "exec", &ns, "iptables", "-w", "-t", "nat", "-A", "POSTROUTING", "-s", "10.244.1.0/24"];
    proxy_testkit::sh("ip", &[&cni[..], &["!", "-d", "10.244.0.0/16", "-j", "MASQUERADE"]].concat()).unwrap();
    let node1 = node_ip(1).to_string();
    // kube-proxy's long-lived flows: 80 exchanges 0.2 s apart.
    let long_tcp = probe_in_background(&topo, &["tcp-hold", &node1, "30080", "80", "0.2"]);
    let long_udp = probe_in_background(&topo, &["udp-sendto", &node1, "30053", "80", "0.2", "21000"]);
    // A UDP flow silent while the agent defers: known only to conntrack
    // (the agent marks it from a conntrack dump); it speaks again after
    // the handover.
    let idle_udp = probe_in_background(&topo, &["udp-sendto", &node1, "30053", "2", "6", "21002"]);
    let _east_west = east_west_flow(&topo, &ns);
    std::thread::sleep(std::time::Duration::from_secs(1));

    let acceleration: &[&str] = if xdp { &["--nodeport-acceleration", "native"] } else { &[] };
    topo.start_agent_with(1, &[&["--outside-handover", "defer"][..], acceleration].concat());
    assert_eq!(xdp_link(&topo, 1).is_some(), xdp);
    assert_east_west_flow_not_marked(&topo);
    // Deferring, a new connection still goes through kube-proxy's rules.
    let (ok, lines) = topo.probe(&["tcp-hold", &node1, "30080", "3", "0"]);
    assert!(ok, "a new connection while deferring: {lines:?}");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let deferring = external_stats(&topo, 1);
    assert_eq!(deferring["new_flow"], 0, "deferring, the programs translate nothing: {deferring:?}");
    assert!(deferring["left_to_kernel"] > 0, "{deferring:?}");

    // The takeover's switch, then kube-proxy's rules go.
    let handover_map = maps_dir(&topo, 1).join(proxy_common::map_names::OUTSIDE_HANDOVER);
    let mut handover = ebpf_proxy::datapath::handover::HandoverMap::open_pinned(&handover_map).unwrap();
    handover.set(ebpf_proxy::datapath::handover::OutsideHandover::Handover { ends_after: None }).unwrap();
    let switched = external_stats(&topo, 1);
    let status = std::process::Command::new(common::AGENT)
        .args(["status", "-o", "json", "--bpffs-dir"])
        .arg(&topo.node(1).pin_dir)
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["maps"]["outside_handover"], "handover", "{status}");
    kube_proxy_rules(&topo, 1, "-D");

    // New connections and a new UDP flow work, through the TC program.
    for _ in 0..5 {
        let (ok, lines) = topo.probe(&["tcp-hold", &node1, "30080", "3", "0"]);
        assert!(ok, "a new connection after the takeover: {lines:?}");
    }
    let (ok, lines) = topo.probe(&["udp-sendto", &node1, "30053", "3", "0", "21001"]);
    assert!(ok, "a new UDP flow after the takeover: {lines:?}");
    // A backend leaves a service: the agent forgets the UDP flows of
    // removed backends, but not netfilter's (the new_flow count below
    // would show the long-lived UDP flow taken over).
    topo.apply(&(services + &endpoints("spare", ("dns", 5353, "UDP"), &[])));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = external_stats(&topo, 1);
    assert_eq!(after["new_flow"], 6, "the new flows are the programs': {after:?}");

    // kube-proxy's flows exchanged to their end, without an error.
    for (what, probe, prefix, n) in [
        ("TCP", long_tcp, "echo ping", 80),
        ("UDP", long_udp, "pod-2-1:ping", 80),
        ("idle UDP", idle_udp, "pod-2-1:ping", 2),
    ] {
        let (ok, lines) = finish(probe);
        assert!(ok, "kube-proxy's {what} flow broke: {lines:?}");
        assert_eq!(lines.iter().filter(|l| l.starts_with(prefix)).count(), n, "{what}: {lines:?}");
    }
    let end = external_stats(&topo, 1);
    assert!(
        end["left_to_kernel"] > switched["left_to_kernel"],
        "after the switch, kube-proxy's flows went to the kernel: {end:?}"
    );
    assert_eq!(end["new_flow"], 6, "{end:?}");
    if xdp {
        assert!(end["xdp_translated"] > 0, "XDP translated the new flows: {end:?}");
    } else {
        assert_eq!(end["xdp_translated"], 0, "{end:?}");
    }
}

#[test]
fn with_dsr_ipv6_replies_leave_the_backend_s_node_and_the_backend_sees_the_client() {
    common::require_root!();
    let mut topo = Topology::new(&[0, 1]);
    topo.enable_ipv6();
    let pod: IpAddr = "fd00:244:2::11".parse().unwrap();
    let server = proxy_testkit::HttpBackend::start(&topo.pod(2, 1).ns, pod, 8080, "pod-2-1").unwrap();
    topo.http.push(server);
    topo.write_services(
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: t}\nspec:\n  type: NodePort\n  \
         clusterIP: \"fd00:96::80\"\n  clusterIPs: [\"fd00:96::80\"]\n  ipFamilies: [IPv6]\n  \
         ports: [{name: http, port: 80, nodePort: 30080, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\n\
         kind: EndpointSlice\nmetadata: {name: web-6, namespace: t, labels: {kubernetes.io/service-name: web}}\n\
         addressType: IPv6\nports: [{name: http, port: 8080, protocol: TCP}]\n\
         endpoints: [{addresses: [\"fd00:244:2::11\"], nodeName: n2, conditions: {ready: true}}]\n",
    );
    for n in 1..=2 {
        topo.start_agent_with(n, &["--nodeport-mode", "dsr"]);
    }
    let (one, client) = (eth0_counters(&topo, 1), client_counters(&topo));
    let out = proxy_testkit::spawn_in(&topo.client, None, "curl")
        .unwrap()
        .args(["-sS", "--connect-timeout", "3", "--max-time", "5", "http://[fd00:30::11]:30080/?[1-5]"])
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{body} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(body.lines().collect::<Vec<_>>(), vec!["pod-2-1"; 5]);
    let peers: BTreeSet<IpAddr> = topo.http_server("pod-2-1").peers().iter().map(std::net::SocketAddr::ip).collect();
    assert_eq!(peers, BTreeSet::from(["fd00:30::100".parse::<IpAddr>().unwrap()]), "the backend must see the client");
    // Five connections: node 1 sends on what the client sent it, but not
    // the replies the client received (with source NAT it would send
    // both).
    let one = eth0_since(&topo, 1, one);
    let client = client_since(&topo, client);
    assert!(
        one[2] < client[2] + client[3] / 2,
        "node 1 sent {} packets, the client sent {} and received {}",
        one[2],
        client[2],
        client[3]
    );
    assert_eq!(external_counter(&topo, 2, "dsr_refused"), 0);
}

#[test]
fn hybrid_mode_returns_tcp_directly_and_source_nats_udp() {
    common::require_root!();
    let mut topo = Topology::new(&[0, 1]);
    topo.http_on(2, 1);
    topo.udp_on(2, 1);
    topo.write_services(
        &(service("web", "NodePort", &[("http", 80, 30080, "TCP")], "", &[])
            + &endpoints("web", ("http", 8080, "TCP"), &[(2, 1)])
            + &service("dns", "NodePort", &[("dns", 53, 30053, "UDP")], "", &[])
            + &endpoints("dns", ("dns", 5353, "UDP"), &[(2, 1)])),
    );
    for n in 1..=2 {
        topo.start_agent_with(n, &["--nodeport-mode", "hybrid"]);
    }
    // TCP: DSR, the backend sees the client.
    assert_eq!(topo.requests(&on_node(1, 30080), 3), vec!["pod-2-1"; 3]);
    let peers: BTreeSet<IpAddr> = topo.http_server("pod-2-1").peers().iter().map(std::net::SocketAddr::ip).collect();
    assert_eq!(peers, BTreeSet::from([IpAddr::from(CLIENT)]));
    // UDP: source NAT, so the replies come back through node 1, which
    // sends each datagram and each reply.
    let one = eth0_counters(&topo, 1);
    let count = 10u64;
    for port in 22_000..22_000 + u16::try_from(count).unwrap() {
        let (ok, lines) = topo.probe(&["udp-sendto", &node_ip(1).to_string(), "30053", "1", "0", &port.to_string()]);
        assert!(ok, "{lines:?}");
        assert_eq!(udp_replies(&lines), [("pod-2-1".to_owned(), on_node(1, 30053))], "{lines:?}");
    }
    let one = eth0_since(&topo, 1, one);
    assert!(one[2] >= 2 * count, "node 1 sent {} packets: the replies must pass it", one[2]);
}

/// `ebpf-proxy.io/nodeport-mode` overrides the node's `--nodeport-mode`
/// per service, both ways: in `hybrid` (TCP by DSR, UDP by source NAT) a
/// TCP service annotated `snat` is source-NATed and a UDP service annotated
/// `dsr` goes by DSR (Cilium's `service.cilium.io/forwarding-mode`).
#[test]
fn the_nodeport_mode_annotation_overrides_the_node_s_mode_per_service() {
    common::require_root!();
    let mut topo = Topology::new(&[0, 1]);
    topo.http_on(2, 1);
    topo.udp_on(2, 1);
    let annotated = |name: &str, mode: &str, ports: &[(&str, u16, u16, &str)]| {
        service(name, "NodePort", ports, "", &[]).replacen(
            "namespace: t}",
            &format!("namespace: t, annotations: {{ebpf-proxy.io/nodeport-mode: {mode}}}}}"),
            1,
        )
    };
    topo.write_services(
        &(annotated("web", "snat", &[("http", 80, 30080, "TCP")])
            + &endpoints("web", ("http", 8080, "TCP"), &[(2, 1)])
            + &annotated("dns", "dsr", &[("dns", 53, 30053, "UDP")])
            + &endpoints("dns", ("dns", 5353, "UDP"), &[(2, 1)])),
    );
    for n in 1..=2 {
        topo.start_agent_with(n, &["--nodeport-mode", "hybrid"]);
    }
    // TCP annotated snat: the backend sees node 1's address.
    assert_eq!(topo.requests(&on_node(1, 30080), 3), vec!["pod-2-1"; 3]);
    let peers: BTreeSet<IpAddr> = topo.http_server("pod-2-1").peers().iter().map(std::net::SocketAddr::ip).collect();
    assert_eq!(peers, BTreeSet::from([IpAddr::V4(node_ip(1))]), "source NAT to node 1's address");
    // UDP annotated dsr: every reply comes from the frontend, sent by node
    // 2; node 1 sends each datagram on once and no reply (with source NAT
    // it sends twice as many, as in hybrid_mode_returns_tcp_directly_...).
    let one = eth0_counters(&topo, 1);
    let count = 10u64;
    for port in 22_100..22_100 + u16::try_from(count).unwrap() {
        let (ok, lines) = topo.probe(&["udp-sendto", &node_ip(1).to_string(), "30053", "1", "0", &port.to_string()]);
        assert!(ok, "{lines:?}");
        assert_eq!(udp_replies(&lines), [("pod-2-1".to_owned(), on_node(1, 30053))], "{lines:?}");
    }
    let sent = eth0_since(&topo, 1, one)[2];
    assert!(sent < count * 3 / 2, "node 1 sent {sent} packets: the replies passed it");
    assert_eq!(external_counter(&topo, 2, "dsr_refused"), 0);
}

/// The node's own connections from a local port that is also a NodePort:
/// their replies arrive at the node's address and that port, and must reach
/// the node's socket, not a backend (kube-proxy's conntrack finds them in
/// the node's own flow before its DNAT; here the programs look the socket
/// up). A node's ephemeral ports reach into the NodePort range when
/// `ip_local_port_range` is widened. Outside clients still reach the
/// NodePort.
#[test]
fn replies_to_the_node_s_own_connections_from_a_node_port_reach_the_node() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1]);
    topo.http_on(2, 1);
    topo.udp_on(2, 1);
    topo.tcp_echo_on(2, 1, 7000);
    topo.write_services(
        &(service("web", "NodePort", &[("http", 80, 30090, "TCP"), ("dns", 53, 30090, "UDP")], "", &[])
            + &endpoints("web", ("http", 8080, "TCP"), &[(2, 1)])
            + &endpoints("web", ("dns", 5353, "UDP"), &[(2, 1)])),
    );
    topo.start_agents();
    let peer = common::topology::pod_ip(2, 1).to_string();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    let on_node1 = |args: &[&str]| {
        let out = topo.node(1).command("/usr/bin/python3").arg(&script).args(args).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect::<Vec<_>>())
    };
    // TCP from node 1's port 30090 to pod-2-1's echo server.
    let (ok, lines) = on_node1(&["tcp-echo-from", &peer, "7000", "30090"]);
    assert!(ok && lines == ["echo ping"], "the node's own TCP connection from port 30090: {lines:?}");
    // Connected UDP from node 1's port 30090 to pod-2-1's echo server.
    let (ok, lines) = on_node1(&["udp-connect", &peer, "5353", "3", "0", "30090"]);
    assert!(ok, "the node's own UDP flow from port 30090: {lines:?}");
    assert!(lines.iter().filter(|l| l.starts_with("pod-2-1:")).count() == 3, "{lines:?}");
    // The NodePort still serves clients outside, on both protocols.
    assert_eq!(topo.requests(&on_node(1, 30090), 3), vec!["pod-2-1"; 3]);
    let (ok, lines) = topo.probe(&["udp-connect", &node_ip(1).to_string(), "30090", "2"]);
    assert!(ok && lines.iter().filter(|l| l.starts_with("pod-2-1:")).count() == 2, "{lines:?}");
}

/// A sysctl of node `n`'s network namespace (never the machine's), read or
/// written through /proc/sys inside it.
fn node_sysctl(topo: &Topology, n: u8, name: &str, value: Option<&str>) -> String {
    let path = format!("/proc/sys/net/ipv4/{name}");
    let script = match value {
        Some(value) => format!("echo '{value}' > {path} && cat {path}"),
        None => format!("cat {path}"),
    };
    let out = topo.node(n).command("/bin/sh").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// With the ephemeral ports reaching into the NodePort range, the agent
/// reserves the range in its namespace's `ip_local_reserved_ports`, keeping
/// what was there (8080); a restart keeps it so, and `ebpf-proxy cleanup`
/// takes out only what the agent added.
#[test]
fn reserved_ports_hold_the_node_port_range_while_it_overlaps_the_ephemeral_ports_until_cleanup() {
    common::require_root!();
    let mut topo = Topology::new(&[1]);
    topo.http_on(1, 1);
    topo.write_services(
        &(service("web", "NodePort", &[("http", 80, 30090, "TCP")], "", &[])
            + &endpoints("web", ("http", 8080, "TCP"), &[(1, 1)])),
    );
    assert_eq!(node_sysctl(&topo, 1, "ip_local_port_range", Some("1024 65000")), "1024\t65000");
    assert_eq!(node_sysctl(&topo, 1, "ip_local_reserved_ports", Some("8080")), "8080");
    topo.start_agent(1);
    assert_eq!(node_sysctl(&topo, 1, "ip_local_reserved_ports", None), "8080,30000-32767");
    let record = topo.node(1).pin_dir.join("reserved-ports");
    assert!(record.join("30000-32767").is_dir(), "the agent records what it added");
    // A restart finds the range reserved: nothing written, the record kept
    // (the range is not taken for the operator's).
    topo.stop_agent(1);
    topo.start_agent(1);
    assert_eq!(node_sysctl(&topo, 1, "ip_local_reserved_ports", None), "8080,30000-32767");
    let names: Vec<_> = std::fs::read_dir(&record).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["30000-32767"]);
    topo.stop_agent(1);
    let out = topo
        .node(1)
        .command(common::AGENT)
        .arg("cleanup")
        .arg("--bpffs-dir")
        .arg(&topo.node(1).pin_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(node_sysctl(&topo, 1, "ip_local_reserved_ports", None), "8080", "the old value is back");
    assert!(!topo.node(1).pin_dir.exists(), "cleanup removed the record with the pin directory");
}

/// With the kernel's default ephemeral ports (32768-60999, above the
/// NodePort range) nothing is reserved or recorded; with `none` nothing is
/// either, overlap or not.
#[test]
fn reserved_ports_are_left_alone_without_overlap_or_with_none() {
    common::require_root!();
    let mut topo = Topology::new(&[1, 1]);
    topo.http_on(1, 1);
    topo.write_services(
        &(service("web", "NodePort", &[("http", 80, 30090, "TCP")], "", &[])
            + &endpoints("web", ("http", 8080, "TCP"), &[(1, 1)])),
    );
    assert_eq!(node_sysctl(&topo, 1, "ip_local_port_range", None), "32768\t60999");
    assert_eq!(node_sysctl(&topo, 2, "ip_local_port_range", Some("1024 65000")), "1024\t65000");
    topo.start_agent(1);
    topo.start_agent_with(2, &["--node-port-range", "none"]);
    for n in [1, 2] {
        assert_eq!(node_sysctl(&topo, n, "ip_local_reserved_ports", None), "", "node {n}");
        assert!(!topo.node(n).pin_dir.join("reserved-ports").exists(), "node {n} recorded a reservation");
    }
}

/// The `CT` node `n`'s agent has pinned (the one its programs use).
fn pinned_ct(
    topo: &Topology,
    n: u8,
) -> aya::maps::HashMap<aya::maps::MapData, proxy_common::CtKey, proxy_common::CtValue> {
    let data = aya::maps::MapData::from_pin(maps_dir(topo, n).join(proxy_common::map_names::CT)).unwrap();
    aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(data)).unwrap()
}

/// Entries of flows from outside to NodePort `port` in node `n`'s pinned `CT`.
fn ct_flows_to(topo: &Topology, n: u8, port: u16) -> usize {
    let ct = pinned_ct(topo, n);
    ct.keys()
        .filter_map(Result::ok)
        .filter(|k| k.dport == port.to_be() && k.dir == proxy_common::ct_dir::ORIGINAL)
        .count()
}

/// Writes `count` entries of made-up TCP flows (from 198.18.0.0/15, the
/// benchmarking range, naming no frontend or backend) into the `CT` node
/// `n`'s agent has pinned: the map fills as if that many flows were live.
fn fill_ct(topo: &Topology, n: u8, count: u32) {
    use proxy_common::{Addr, CtKey, CtValue, ct_dir, proto};
    let mut ct = pinned_ct(topo, n);
    let v4 = |a: [u8; 4]| {
        let mut bytes = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0];
        bytes[12..].copy_from_slice(&a);
        Addr(bytes)
    };
    for i in 0..count {
        let [_, hi, mid, lo] = i.to_be_bytes();
        let key = CtKey {
            src: v4([198, 18 + (hi & 1), mid, lo]),
            dst: v4([198, 19, 255, 254]),
            sport: 40_000u16.to_be(),
            dport: 80u16.to_be(),
            proto: proto::TCP,
            dir: ct_dir::ORIGINAL,
            pad: [0; 2],
        };
        ct.insert(key, CtValue::default(), 0).unwrap();
    }
}

/// `CT` sized from the node's memory grows when it fills up
/// (docs/design.md, "Growing `CT`"): node 1's agent starts with the
/// smallest (65,536 entries, for 1 GiB of memory), entries written past
/// its mark (58,982 on 2 CPUs, src/observe/ct_fill.rs) make its next
/// sweep move it to one twice as big, and connections from outside (DSR
/// and source NAT) held across the move go on: their entries are carried.
/// Once: the grown map is under half full. A restart keeps its size.
#[test]
fn a_ct_sized_from_memory_grows_when_nearly_full_and_keeps_the_flows() {
    common::require_root!();
    // Node 1's agent runs with 1 GiB of memory, as a DaemonSet's limit
    // would give it (src/node/memory.rs reads its cgroup's limit). Made
    // before the topology, so it goes after the agent.
    let memory =
        proxy_testkit::TestCgroup::with_memory_limit(&proxy_testkit::unique_name("ebpf-proxy-mem"), 1 << 30).unwrap();
    let mut topo = Topology::new(&[0, 1]);
    topo.tcp_echo_on(2, 1, 9000);
    let services = dsr_and_snat_echo();
    topo.write_services(&services);
    topo.start_agent_in(1, &["--nodeport-mode", "dsr"], &memory);
    topo.start_agent_with(2, &["--nodeport-mode", "dsr"]);
    let node1 = node_ip(1).to_string();
    // 300 exchanges 0.1 s apart on each connection: past the next sweep
    // (every 10 s) and the move.
    let dsr = probe_in_background(&topo, &["tcp-hold", &node1, "30080", "300", "0.1"]);
    let snat = probe_in_background(&topo, &["tcp-hold", &node1, "30081", "300", "0.1"]);
    std::thread::sleep(std::time::Duration::from_secs(1));
    let agent = topo.agents[0].as_ref().unwrap();
    let mark = agent.mark();
    fill_ct(&topo, 1, 61_000);
    let grown = agent
        .wait_for(mark, std::time::Duration::from_secs(25), |r| {
            proxy_testkit::message(r) == Some(ebpf_proxy::agent::CT_GROWN)
        })
        .unwrap_or_else(|e| panic!("the conntrack map did not grow ({e}):\n{}", topo.metrics(1)));
    let field = |name: &str| proxy_testkit::field(&grown, name).and_then(serde_json::Value::as_u64).unwrap();
    assert_eq!((field("from"), field("to")), (65_536, 131_072), "{grown}");
    assert!(field("entries") >= field("mark"), "{grown}");
    // Copied when the new map was made (src/datapath/ct_resize.rs); the
    // carries around the swap add what the old programs opened meanwhile.
    let copied = agent
        .records()
        .into_iter()
        .skip(mark)
        .find(|r| proxy_testkit::message(r).is_some_and(|m| m.starts_with("conntrack map (CT) resized")))
        .and_then(|r| proxy_testkit::field(&r, "flows_entries_copied").and_then(serde_json::Value::as_u64))
        .expect("the old map's entries copied");
    assert!(copied >= field("mark"), "every entry copied: {copied}");
    // The new programs (TC's too) use the new map: a connection opened
    // now has its entry there.
    let before = ct_flows_to(&topo, 1, 30081);
    let (ok, lines) = topo.probe(&["tcp-hold", &node1, "30081", "1", "0"]);
    assert!(ok && lines.len() == 1, "a new connection after the growth: {lines:?}");
    assert!(ct_flows_to(&topo, 1, 30081) > before, "the new connection's entry is in the new map");
    // The next sweep finds it under half full: no second growth.
    let mark = agent.mark();
    agent
        .wait_for(mark, std::time::Duration::from_secs(15), |r| {
            proxy_testkit::message(r) == Some("the connection-tracking map (CT) is no longer nearly full")
        })
        .expect("the grown map counted below the mark");
    let text = topo.metrics(1);
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "counts, read as floats")]
    let metric = |name: &str| common::metric(&text, name) as u64;
    assert_eq!(metric("ebpf_proxy_ct_capacity"), 131_072, "{text}");
    assert_eq!(metric("ebpf_proxy_ct_growths_total"), 1, "{text}");
    for (name, probe) in [("DSR", dsr), ("source NAT", snat)] {
        let (ok, lines) = finish(probe);
        assert!(ok && lines.len() == 300, "the {name} connection through the growth: {lines:?}");
    }
    // A restart keeps the grown map (the memory's share is still 65,536).
    topo.stop_agent(1);
    topo.start_agent_in(1, &["--nodeport-mode", "dsr"], &memory);
    let agent = topo.agents[0].as_ref().unwrap();
    let resized = agent
        .records()
        .into_iter()
        .find(|r| proxy_testkit::message(r).is_some_and(|m| m.starts_with("conntrack map (CT) resized")));
    assert!(resized.is_none(), "a restart resized the grown map: {resized:?}");
    let pinned = aya::maps::MapData::from_pin(maps_dir(&topo, 1).join(proxy_common::map_names::CT)).unwrap();
    assert_eq!(pinned.info().unwrap().max_entries(), 131_072, "the pinned map after the restart");
}
