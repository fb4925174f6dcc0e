//! The per-packet path for the pods' own traffic (`--socket-lb
//! host-namespace`, `proxy-ebpf/src/pod.rs`): a node in a namespace with
//! pods behind a bridge (tests/common/topology.rs), its agent translating
//! only the node's own sockets, so a pod's packets to a service are
//! translated on its pod-facing devices. Real clients in the pods (in the
//! node's cgroup, as pods are: the socket programs run for them and must
//! leave them alone), real servers, and a sidecar set up as Istio sets it
//! up.
mod common;

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    io::BufRead as _,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use common::topology::{ChildGuard, Topology, pod_ip};
use proxy_testkit::{message, spawn_in};

const WEB: &str = "10.96.0.10";
const DNS: &str = "10.96.0.53";
const SELF: &str = "10.96.0.70";

/// A ClusterIP service `name` at `ip` with one port, and its slice of
/// pods (node 1, index) at `target`.
fn cluster_ip(name: &str, ip: &str, (port, target, proto): (u16, u16, &str), pods: &[u8]) -> String {
    let mut s = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: t}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: p, port: {port}, protocol: {proto}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: t, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: p, port: {target}, protocol: {proto}}}]\nendpoints:\n"
    );
    for k in pods {
        writeln!(s, "- {{addresses: [\"{}\"], nodeName: n1}}", pod_ip(1, *k)).unwrap();
    }
    s
}

/// One node, pods 1 (client), 2 and 3 (HTTP on 8080, UDP on 5353); `web`
/// and `dns` over pods 2 and 3, `self` over pod 2 alone (hairpin); the
/// agent started with `args`, and waited for until its pod-facing devices
/// are attached.
fn node_with_pods(args: &[&str]) -> Topology {
    let mut topo = Topology::new(&[3]);
    for k in [2, 3] {
        topo.http_on(1, k);
        topo.udp_on(1, k);
    }
    topo.write_services(
        &[
            cluster_ip("web", WEB, (80, 8080, "TCP"), &[2, 3]),
            cluster_ip("dns", DNS, (53, 5353, "UDP"), &[2, 3]),
            cluster_ip("self", SELF, (80, 8080, "TCP"), &[2]),
        ]
        .concat(),
    );
    start(&mut topo, args);
    topo
}

fn start(topo: &mut Topology, args: &[&str]) {
    topo.start_agent_with(1, args);
    let agent = topo.agents[0].as_ref().unwrap();
    agent
        .wait_for(0, Duration::from_secs(10), |r| message(r).is_some_and(|m| m.starts_with("pod-facing devices")))
        .expect("the per-packet programs were not attached to the pod-facing devices");
}

/// `probe.py ARGS` in pod (1, k), in the node's cgroup: (ok, lines).
fn probe_in_pod(topo: &Topology, k: u8, args: &[&str]) -> (bool, Vec<String>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    let out = spawn_in(&topo.pod(1, k).ns, Some(&topo.node(1).cgroup), "/usr/bin/python3")
        .unwrap()
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect())
}

/// Which pods answer `n` requests from pod (1, 1) to `url`, each on its
/// own connection; fails the test unless all answer.
fn answering(topo: &Topology, url: &str, n: usize) -> BTreeSet<String> {
    (0..n)
        .map(|_| {
            let (ok, body) = topo.curl_from_pod(1, 1, url);
            assert!(ok, "{url} from pod-1-1 failed");
            body.trim().to_owned()
        })
        .collect()
}

/// `ebpf-proxy ARGS --bpffs-dir PINS -o json` on node 1, parsed.
fn agent_json(topo: &Topology, args: &[&str]) -> serde_json::Value {
    let node = topo.node(1);
    let out = node.command(common::AGENT).args(args).arg("--bpffs-dir").arg(&node.pin_dir).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The paths `explain` gives for connections from pod (1, 1) to `web`.
/// Other tests' pods running at the same time hold the same address in
/// their own namespaces, which `explain` lists too: only this test's pod
/// namespace (by name) counts.
fn pod_paths(topo: &Topology) -> Vec<String> {
    let from = pod_ip(1, 1).to_string();
    let explained = agent_json(topo, &["explain", &format!("{WEB}:80"), "--from", &from, "-o", "json"]);
    let paths = explained["from"]["paths"].as_array().unwrap_or_else(|| panic!("no paths: {explained}"));
    let ours = topo.pod(1, 1).ns.name();
    paths
        .iter()
        .filter(|p| std::path::Path::new(p["netns"].as_str().unwrap()).file_name().is_some_and(|n| n == ours))
        .map(|p| p["path"].as_str().unwrap().to_owned())
        .collect()
}

/// The value of the series `name` (with its labels) in `text`.
fn series(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// `ebpf_proxy_pod_packets_total{result="new_flow"}` of node 1's agent.
fn pod_new_flows(topo: &Topology) -> u64 {
    series(&topo.metrics(1), "ebpf_proxy_pod_packets_total{result=\"new_flow\"}")
}

#[test]
fn a_pod_reaches_tcp_and_udp_cluster_ips_per_packet_and_sees_the_service_address() {
    common::require_root!();
    let topo = node_with_pods(&["--socket-lb", "host-namespace"]);
    let both: BTreeSet<String> = ["pod-1-2", "pod-1-3"].map(str::to_owned).into();
    assert_eq!(answering(&topo, &format!("http://{WEB}/"), 24), both, "every backend gets new flows");
    // Translated on the pod-facing device, not at the socket: the per-packet
    // programs counted the 24 connections.
    assert!(pod_new_flows(&topo) >= 24, "the per-packet path did not count the pod's flows");

    // getpeername() in the pod: the ClusterIP (the socket was never
    // translated; the packets were, both ways).
    let (ok, lines) = probe_in_pod(&topo, 1, &["tcp-peer", WEB, "80"]);
    assert!(ok && lines == [format!("peer {WEB}:80")], "{lines:?}");

    // UDP: recvfrom() shows the ClusterIP as the reply's source.
    let (ok, lines) = probe_in_pod(&topo, 1, &["udp-sendto", DNS, "53", "4"]);
    assert!(ok, "{lines:?}");
    for line in &lines {
        let (payload, source) = line.split_once(' ').unwrap();
        assert!(payload.starts_with("pod-1-2:") || payload.starts_with("pod-1-3:"), "{line}");
        assert_eq!(source, format!("{DNS}:53"), "{line}");
    }
    let (ok, lines) = probe_in_pod(&topo, 1, &["udp-connect", DNS, "53", "2"]);
    assert!(ok && lines[0] == format!("peer {DNS}:53"), "{lines:?}");
    assert!(lines[1..].iter().all(|l| l.ends_with(&format!(" {DNS}:53"))), "{lines:?}");
}

/// A pod reaching itself through its own service (hairpin): its packets
/// come back to it from the node's address, so its stack accepts them
/// (kube-proxy masquerades hairpin traffic), and its client sees the
/// service.
#[test]
fn a_pod_reaches_itself_through_its_service() {
    common::require_root!();
    let topo = node_with_pods(&["--socket-lb", "host-namespace"]);
    for _ in 0..5 {
        let out = spawn_in(&topo.pod(1, 2).ns, Some(&topo.node(1).cgroup), "curl")
            .unwrap()
            .args(["-sS", "--connect-timeout", "2", "--max-time", "5", &format!("http://{SELF}/")])
            .output()
            .unwrap();
        assert!(out.status.success(), "hairpin failed: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "pod-1-2");
    }
}

/// The service mesh case, set up as Istio's init container does: the
/// pod's outgoing TCP goes to a sidecar on :15001 (iptables REDIRECT in
/// the pod's namespace, skipping the sidecar's own connections by their
/// mark), which reads SO_ORIGINAL_DST and connects there itself. With
/// `--socket-lb host-namespace` that is the service and port; with `all`
/// (as Cilium's and Calico's socket load balancing do by default) the
/// socket programs have already replaced it with a backend's address, and
/// the mesh's per-service routing and policy see a pod instead.
#[test]
fn a_sidecar_reads_the_service_as_its_original_destination() {
    common::require_root!();
    let mut topo = node_with_pods(&["--socket-lb", "host-namespace"]);
    let pod = &topo.pod(1, 1).ns;
    pod.ip(&["link", "set", "lo", "up"]).unwrap();
    proxy_testkit::sh(
        "ip",
        &[
            "netns",
            "exec",
            pod.name(),
            "iptables",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "-m",
            "mark",
            "!",
            "--mark",
            "0x539",
            "-j",
            "REDIRECT",
            "--to-ports",
            "15001",
        ],
    )
    .expect("iptables REDIRECT in the pod's namespace");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    let mut sidecar = spawn_in(pod, Some(&topo.node(1).cgroup), "/usr/bin/python3")
        .unwrap()
        .arg(script)
        .args(["mesh-proxy", "0.0.0.0", "15001", "0x539"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(sidecar.stdout.take().unwrap()).lines();
    topo.servers.push(ChildGuard(sidecar));
    assert_eq!(lines.next().unwrap().unwrap(), "listening");

    let (ok, body) = topo.curl_from_pod(1, 1, &format!("http://{WEB}/"));
    assert!(ok, "the request through the sidecar failed");
    assert!(body.trim() == "pod-1-2" || body.trim() == "pod-1-3", "{body}");
    assert_eq!(lines.next().unwrap().unwrap(), format!("original {WEB}:80"), "the sidecar must see the service");
    // `status` and `explain` read the same from the kernel: the node's
    // sockets at the socket, the pod's per packet on its devices.
    let status = agent_json(&topo, &["status", "-o", "json"]);
    assert_eq!(status["paths"]["socket_lb"], "host-namespace", "{status}");
    assert!(status["paths"]["socket_lb_netns_cookie"].as_u64().is_some_and(|c| c != 0), "{status}");
    assert!(!status["paths"]["pod_devices"].as_array().unwrap().is_empty(), "{status}");
    assert_eq!(pod_paths(&topo), ["per-packet"], "the pod's connections are translated per packet");

    // Today's default, recorded: the socket programs translate the pod's
    // connect() before netfilter's OUTPUT hook, so the sidecar's original
    // destination is a backend (the request still reaches it).
    topo.stop_agent(1);
    start(&mut topo, &["--socket-lb", "all"]);
    let (ok, _) = topo.curl_from_pod(1, 1, &format!("http://{WEB}/"));
    assert!(ok, "the request through the sidecar failed with --socket-lb all");
    let original = lines.next().unwrap().unwrap();
    assert!(
        original == format!("original {}:8080", pod_ip(1, 2)) || original == format!("original {}:8080", pod_ip(1, 3)),
        "with --socket-lb all the sidecar sees a backend: {original}"
    );
    assert_eq!(agent_json(&topo, &["status", "-o", "json"])["paths"]["socket_lb"], "all");
    assert_eq!(pod_paths(&topo), ["socket"], "with --socket-lb all the pod's sockets are translated");
}

/// An agent killed (SIGKILL) and started again while a pod opens a new
/// connection every 50 ms: the programs stay attached through pinned links
/// and the conntrack entries in pinned maps, so no connection fails.
#[test]
fn a_killed_and_restarted_agent_fails_no_pod_connection() {
    common::require_root!();
    let mut topo = node_with_pods(&["--socket-lb", "host-namespace"]);
    let url = format!("http://{WEB}/?[1-60]");
    let client = spawn_in(&topo.pod(1, 1).ns, Some(&topo.node(1).cgroup), "curl")
        .unwrap()
        .args(["-sS", "--connect-timeout", "2", "--max-time", "30", "--rate", "20/s", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(topo.agents[0].as_ref().unwrap().pid()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    topo.stop_agent(1);
    std::thread::sleep(Duration::from_millis(300));
    start(&mut topo, &["--socket-lb", "host-namespace"]);
    let began = Instant::now();
    let out = client.wait_with_output().unwrap();
    let answers = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("pod-1-")).count();
    assert!(
        out.status.success() && answers == 60,
        "{answers} of 60 answered ({:?} after the restart): {}",
        began.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// IPv6: a pod reaches a service's IPv6 ClusterIP per packet, and its
/// client sees the service as its peer.
#[test]
fn a_pod_reaches_an_ipv6_cluster_ip_per_packet() {
    common::require_root!();
    let mut topo = Topology::new(&[3]);
    topo.enable_ipv6();
    for k in [2, 3] {
        let pod = topo.pod(1, k);
        let addr: std::net::IpAddr = format!("fd00:244:1::1{k}").parse().unwrap();
        let server = proxy_testkit::HttpBackend::start(&pod.ns, addr, 8080, &pod.name).expect("http backend");
        topo.http.push(server);
    }
    topo.write_services(
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: web6, namespace: t}\nspec:\n  clusterIP: fd00:96::10\n  \
         clusterIPs: [\"fd00:96::10\"]\n  ipFamilies: [IPv6]\n  ports: [{name: p, port: 80, protocol: TCP}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web6-1, namespace: t, labels: \
         {kubernetes.io/service-name: web6}}\naddressType: IPv6\nports: [{name: p, port: 8080, protocol: TCP}]\n\
         endpoints:\n- {addresses: [\"fd00:244:1::12\"], nodeName: n1}\n- {addresses: [\"fd00:244:1::13\"], nodeName: n1}\n",
    );
    start(&mut topo, &["--socket-lb", "host-namespace"]);
    let both: BTreeSet<String> = ["pod-1-2", "pod-1-3"].map(str::to_owned).into();
    assert_eq!(answering(&topo, "http://[fd00:96::10]/", 24), both);
    let (ok, lines) = probe_in_pod(&topo, 1, &["tcp-peer", "fd00:96::10", "80"]);
    assert!(ok && lines == ["peer [fd00:96::10]:80"], "{lines:?}");
}

/// A table that outgrows the maps moves the agent to bigger ones (a new
/// set of programs): the pod-facing devices take the new programs too, so
/// a service added with the move is reached per packet at once.
#[test]
fn pod_devices_follow_a_move_to_bigger_maps() {
    common::require_root!();
    let topo = node_with_pods(&["--socket-lb", "host-namespace"]);
    let mut yaml = cluster_ip("web", WEB, (80, 8080, "TCP"), &[2, 3]);
    // Enough services to outgrow the maps the start sized for three.
    for i in 0..3000u32 {
        let ip = format!("10.97.{}.{}", i / 250, i % 250 + 1);
        yaml += &cluster_ip(&format!("filler-{i}"), &ip, (80, 8080, "TCP"), &[2]);
    }
    yaml += &cluster_ip("late", "10.96.0.99", (80, 8080, "TCP"), &[3]);
    let agent = topo.agents[0].as_ref().unwrap();
    let mark = agent.mark();
    topo.write_services(&yaml);
    let agent = topo.agents[0].as_ref().unwrap();
    agent
        .wait_for(mark, Duration::from_mins(1), |r| message(r).is_some_and(|m| m.starts_with("pod-facing devices")))
        .expect("the pod-facing devices were not attached again after the move");
    let _ = agent.wait_applied(mark);
    let (ok, body) = topo.curl_from_pod(1, 1, "http://10.96.0.99/");
    assert!(ok && body.trim() == "pod-1-3", "a service added with the move is not reached from a pod: {body}");
}

/// The conntrack map filling up is seen before the LRU evicts live flows
/// (an LRU map gives no sign of its own): the agent counts the entries at
/// its sweep, exports them beside the map's size, and warns once with a
/// code and a fix. 480 UDP flows from a pod (two entries each) in a map
/// of 1,024, whose LRU starts evicting before it holds 960 (src/observe/ct_fill.rs).
#[test]
fn a_nearly_full_conntrack_map_is_counted_and_warned_about() {
    common::require_root!();
    let topo = node_with_pods(&["--socket-lb", "host-namespace", "--ct-map-size", "1024"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    let mut held = spawn_in(&topo.pod(1, 1).ns, Some(&topo.node(1).cgroup), "/usr/bin/python3")
        .unwrap()
        .arg(script)
        .args(["open-many", "udp", DNS, "53", "480"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(held.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "open 480", "every flow got its answer");
    let agent = topo.agents[0].as_ref().unwrap();
    // The sweep runs every 10 s.
    let warned = agent
        .wait_for(0, Duration::from_secs(25), |r| {
            proxy_testkit::field(r, "code").and_then(|c| c.as_str()) == Some("ConntrackNearlyFull")
        })
        .unwrap_or_else(|e| panic!("no warning that the conntrack map is nearly full ({e}):\n{}", topo.metrics(1)));
    let field = |name: &str| proxy_testkit::field(&warned, name).and_then(serde_json::Value::as_u64).unwrap();
    assert_eq!(field("capacity"), 1024, "{warned}");
    assert!(field("entries") >= field("mark") && field("mark") >= 512, "{warned}");
    let text = topo.metrics(1);
    assert_eq!(series(&text, "ebpf_proxy_ct_capacity"), 1024);
    assert!(series(&text, "ebpf_proxy_ct_entries") >= field("mark"), "{text}");
    drop(held.stdin.take());
    let _ = held.wait();
}

/// `--ct-map-size` raised across a restart: the pinned map is replaced by
/// one of the new size (aya alone would reuse the pin as it is) and its
/// flows are copied over, so a flow held across the restart goes on to its
/// backend (src/datapath/ct_resize.rs).
#[test]
fn a_larger_ct_map_size_takes_effect_at_a_restart_and_keeps_the_flows() {
    common::require_root!();
    let mut topo = node_with_pods(&["--socket-lb", "host-namespace", "--ct-map-size", "1024"]);
    // One connected UDP socket, a datagram every 50 ms for 3 s: one flow,
    // one backend, as long as its entries live.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    let client = spawn_in(&topo.pod(1, 1).ns, Some(&topo.node(1).cgroup), "/usr/bin/python3")
        .unwrap()
        .arg(script)
        .args(["udp-connect-loop", DNS, "53", "60", "0.05"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    topo.stop_agent(1);
    start(&mut topo, &["--socket-lb", "host-namespace", "--ct-map-size", "2048"]);
    let agent = topo.agents[0].as_ref().unwrap();
    let resized = agent
        .wait_for(0, Duration::from_secs(5), |r| {
            message(r).is_some_and(|m| m.starts_with("conntrack map (CT) resized"))
        })
        .expect("the conntrack map was not resized");
    let field = |name: &str| proxy_testkit::field(&resized, name).and_then(serde_json::Value::as_u64).unwrap();
    assert_eq!((field("from"), field("to")), (1024, 2048), "{resized}");
    assert!(field("flows_entries_copied") >= 2, "the held flow's entries: {resized}");
    let out = client.wait_with_output().unwrap();
    // `pod-1-2:ping7 10.96.0.53:53`: the backend, and the service as the
    // reply's source.
    let backends: Vec<String> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| l.split(':').next().unwrap_or(l).to_owned()).collect();
    assert_eq!(backends.len(), 60, "{backends:?}");
    assert!(
        backends.iter().all(|b| *b == backends[0] && b.starts_with("pod-1-")),
        "one flow, one backend: {backends:?}"
    );
    // The kernel's map is the new size.
    let capacity = || series(&topo.metrics(1), "ebpf_proxy_ct_capacity");
    let deadline = Instant::now() + Duration::from_secs(15);
    while capacity() != 2048 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(capacity(), 2048);
}
