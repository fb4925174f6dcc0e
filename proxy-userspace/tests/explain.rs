//! `ebpf-proxy explain` reads the pinned maps: a ClusterIP with affinity,
//! and a LoadBalancer restricted to a source range, whose `--from` answer
//! names the Maglev entry a client's flow hashes to; the same with the
//! agent running and after it stopped. And it asks the running agent, on
//! its socket, which endpoints are not used and why (not ready, a slice
//! without the port's name, another node's endpoint of a Local service),
//! says what it cannot tell once the agent is gone, and with `--from`
//! shows the affinity entry of a client that connected.
mod common;

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::Command,
};

use common::{Env, backend_ip, service, slice};
use ebpf_proxy::{datapath::KernelMaps, reconcile::ServiceMaps as _};

/// `ebpf-proxy explain ARGS` asking no agent (a socket that does not
/// exist): what the maps alone tell.
fn explain(env: &Env, args: &[&str]) -> (bool, String) {
    explain_asking(env, &env.dir.path().join("no-agent.sock"), args)
}

/// `ebpf-proxy explain ARGS` asking the agent at `socket`.
fn explain_asking(env: &Env, socket: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(common::AGENT)
        .arg("explain")
        .args(args)
        .arg("--bpffs-dir")
        .arg(env.pin_dir())
        .arg("--agent-socket")
        .arg(socket)
        .output()
        .expect("run ebpf-proxy explain");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn services() -> String {
    let ips: Vec<_> = (1..=3).map(backend_ip).collect();
    let sticky = service("web", "10.96.0.10", &[("http", 80)]).replace(
        "  type: ClusterIP\n",
        "  type: ClusterIP\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n",
    );
    let lb = "---\napiVersion: v1\nkind: Service\nmetadata: {name: edge, namespace: test}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.40\n  clusterIPs: [10.96.0.40]\n  loadBalancerSourceRanges: [192.0.2.0/24]\n  ports: [{name: http, port: 80, nodePort: 30080, protocol: TCP}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 203.0.113.10}]\n";
    sticky
        + &slice("web-1", "web", &[("http", 8080)], &ips[..2])
        + lb
        + &slice("edge-1", "edge", &[("http", 8080)], &ips)
}

/// The backend a flow from `client` to port 80 gets in the Maglev table of
/// 203.0.113.10:80, computed here from the maps with the TC program's hash.
fn expected_pick(env: &Env, client: std::net::SocketAddr) -> (u32, IpAddr) {
    let dir = ebpf_proxy::paths::current_maps_dir(&env.pin_dir()).unwrap();
    let dump = KernelMaps::open_pinned(&dir).unwrap().dump().unwrap();
    let lb = ebpf_proxy::reconcile::inspect::frontends(&dump)
        .into_iter()
        .find(|f| f.address.to_string() == "203.0.113.10")
        .expect("the LoadBalancer IP's frontend");
    let table = &dump.maglev[&lb.maglev_table.expect("a Maglev table")];
    let hash = proxy_common::flow_hash(
        &proxy_common::net::encode(client.ip()),
        u16::from_ne_bytes(client.port().to_be_bytes()),
        u16::from_ne_bytes(80u16.to_be_bytes()),
        6,
    );
    let entry = proxy_common::maglev_index(hash, u32::try_from(table.len()).unwrap());
    let backend = dump.backends[&table[entry as usize]];
    let (addr, _) = ebpf_proxy::reconcile::codec::endpoint_of(&backend.addr, backend.port);
    (entry, addr)
}

fn check(env: &Env) -> String {
    let (ok, text) = explain(env, &["10.96.0.10:80"]);
    assert!(ok, "{text}");
    for want in [
        "service        test/web:http",
        "type           ClusterIP",
        "affinity       ClientIP, 60s",
        "10.244.0.11:8080  active",
        "not known: ",
    ] {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }
    let (ok, json) = explain(env, &["203.0.113.10:80/TCP", "--from", "192.0.2.7:40000", "-o", "json"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["frontends"][0]["type"], "LoadBalancer");
    assert_eq!(v["frontends"][0]["source_ranges"][0], "192.0.2.0/24");
    let (entry, addr) = expected_pick(env, "192.0.2.7:40000".parse().unwrap());
    assert_eq!(v["from"]["admitted"], true, "{json}");
    assert_eq!(v["from"]["maglev_entry"], entry, "{json}");
    assert_eq!(v["from"]["backend"]["address"], addr.to_string(), "{json}");
    // Another port hashes elsewhere; over a few ports more than one backend shows.
    let picked: std::collections::BTreeSet<String> = (40000..40016)
        .map(|p| {
            let (_, json) = explain(env, &["203.0.113.10:80", "--from", &format!("192.0.2.7:{p}"), "-o", "json"]);
            let v: serde_json::Value = serde_json::from_str(&json).unwrap();
            v["from"]["backend"]["address"].as_str().unwrap().to_owned()
        })
        .collect();
    assert!(picked.len() > 1, "{picked:?}");
    let (ok, outside) = explain(env, &["203.0.113.10:80", "--from", "198.51.100.1:5000"]);
    assert!(ok && outside.contains("the source ranges do not admit 198.51.100.1"), "{outside}");
    let (ok, no_port) = explain(env, &["203.0.113.10:80", "--from", "192.0.2.7"]);
    assert!(ok && no_port.contains("give --from IP:PORT"), "{no_port}");
    let (ok, none) = explain(env, &["10.96.0.99:80"]);
    assert!(!ok && none.contains("no frontend 10.96.0.99:80"), "{none}");
    text + &json
}

#[test]
fn explain_reads_the_maps_with_and_without_the_agent() {
    common::require_root!();
    let mut env = Env::new(3);
    env.write_services(&services());
    env.start_agent();
    let answers = check(&env);
    env.agent.take(); // stopped: the maps stay, and so do the answers
    assert_eq!(check(&env), answers);
}

/// An EndpointSlice of service `service` in namespace `test`, port
/// `(name, 8080)`, with `endpoints` (YAML flow items).
fn slice_of(name: &str, service: &str, port_name: &str, endpoints: &[String]) -> String {
    format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: test\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: IPv4\nports: [{{name: {port_name}, port: 8080, protocol: TCP}}]\nendpoints: [{}]\n",
        endpoints.join(", ")
    )
}

fn endpoint(i: u8, ready: bool, node: &str) -> String {
    format!("{{addresses: [\"{}\"], conditions: {{ready: {ready}}}, nodeName: {node}}}", backend_ip(i))
}

/// `web` (affinity): backends 1 and 2 ready, 3 not ready, 4 in a slice whose
/// port is named `metrics`, not `http`. `local` (internalTrafficPolicy:
/// Local): backend 1 on this node, 2 on another.
fn services_with_unused_endpoints() -> String {
    let web = service("web", "10.96.0.10", &[("http", 80)]).replace(
        "  type: ClusterIP\n",
        "  type: ClusterIP\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n",
    );
    let local = service("local", "10.96.0.20", &[("http", 80)])
        .replace("  type: ClusterIP\n", "  type: ClusterIP\n  internalTrafficPolicy: Local\n");
    web + &slice_of(
        "web-1",
        "web",
        "http",
        &[endpoint(1, true, "test-node"), endpoint(2, true, "test-node"), endpoint(3, false, "test-node")],
    ) + &slice_of("web-2", "web", "metrics", &[endpoint(4, true, "test-node")])
        + &local
        + &slice_of("local-1", "local", "http", &[endpoint(1, true, "test-node"), endpoint(2, true, "other-node")])
}

/// The unused endpoints of the first frontend of an explain JSON answer:
/// address -> reason.
fn unused(v: &serde_json::Value) -> BTreeMap<String, String> {
    v["frontends"][0]["unused"]
        .as_array()
        .unwrap_or_else(|| panic!("the agent's reasons in {v}"))
        .iter()
        .map(|u| (u["address"].as_str().unwrap().to_owned(), u["reason"].as_str().unwrap().to_owned()))
        .collect()
}

/// The backends of the first frontend in the maps, as addresses.
fn map_backends(v: &serde_json::Value) -> Vec<String> {
    let mut out: Vec<String> = v["frontends"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["address"].as_str().unwrap().to_owned())
        .collect();
    out.sort();
    out
}

#[test]
fn explain_asks_the_agent_why_endpoints_are_not_used() {
    common::require_root!();
    let mut env = Env::new(3);
    env.write_services(&services_with_unused_endpoints());
    env.start_agent();
    let socket = env.explain_socket();
    let mode = std::fs::metadata(&socket).expect("the agent serves its socket").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only root may ask");
    check_reasons(&env, &socket);
    check_affinity_entry(&env, &socket);

    // The agent stopped: the maps' part stays, the reasons are not known,
    // and the answer names the socket.
    env.agent.take();
    let (ok, text) = explain_asking(&env, &socket, &["10.96.0.10:80"]);
    assert!(ok, "exit 0 with what the maps tell: {text}");
    assert!(text.contains(&format!("{}:8080  active", backend_ip(1))), "{text}");
    let not_known = text.lines().find(|l| l.starts_with("not known: ")).unwrap_or_else(|| panic!("{text}"));
    assert!(
        not_known.contains(&socket.display().to_string()) && not_known.contains("only the running agent knows"),
        "{not_known}"
    );
    assert!(!socket.exists(), "the agent removed its socket on exit");
}

fn ip(i: u8) -> String {
    backend_ip(i).to_string()
}

/// Not ready, a slice without the port's name, another node's endpoint of
/// a Local service: each with its reason, the rest the maps' backends.
fn check_reasons(env: &Env, socket: &Path) {
    // Not ready, and a slice without the port's name.
    let (ok, json) = explain_asking(env, socket, &["10.96.0.10:80", "-o", "json"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        unused(&v),
        BTreeMap::from([(ip(3), "not-ready".to_owned()), (ip(4), "port-name-unmatched".to_owned())]),
        "{json}"
    );
    assert_eq!(map_backends(&v), [ip(1), ip(2)], "the used endpoints are the maps' backends");
    assert_eq!(v["frontends"][0]["agrees_with_maps"], true, "{json}");
    assert_eq!(v["unknown"], serde_json::json!([]), "the agent told everything: {json}");
    let (ok, text) = explain_asking(env, socket, &["10.96.0.10:80"]);
    assert!(ok, "{text}");
    for want in
        ["  not used", &format!("{}:8080 (node test-node)  not ready", ip(3)), "its slice has no port of this name"]
    {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }
    assert!(!text.contains("not known"), "{text}");

    // Local: the endpoint on another node. kube-proxy too sends a
    // internalTrafficPolicy: Local service's traffic to this node's
    // endpoints only (pkg/proxy/topology.go, CategorizeEndpoints).
    let (ok, json) = explain_asking(env, socket, &["10.96.0.20:80/TCP", "-o", "json"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(unused(&v), BTreeMap::from([(ip(2), "other-node".to_owned())]), "{json}");
    assert_eq!(v["frontends"][0]["unused"][0]["node"], "other-node");
    assert_eq!(map_backends(&v), [ip(1)]);
    assert_eq!(v["frontends"][0]["agrees_with_maps"], true, "{json}");
}

/// A client in the test namespace connects through the affinity service:
/// `--from` its address shows its entry, with the backend it reached.
fn check_affinity_entry(env: &Env, socket: &Path) {
    let out = env.curl(true, "http://10.96.0.10/");
    let reached = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let n: u8 = reached.strip_prefix("backend-").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{out:?}"));
    let (ok, json) = explain_asking(env, socket, &["10.96.0.10:80", "--from", &ip(1), "-o", "json"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let entries = v["from"]["affinity"].as_array().unwrap_or_else(|| panic!("affinity entries in {json}"));
    assert_eq!(entries.len(), 1, "{json}");
    assert_eq!(entries[0]["backend"]["address"], ip(n), "the backend the client reached: {json}");
    let expires = entries[0]["expires_in_seconds"].as_u64().unwrap();
    assert!((1..=60).contains(&expires), "{json}");
    let (ok, text) = explain_asking(env, socket, &["10.96.0.10:80", "--from", &ip(1)]);
    let backend = SocketAddr::new(backend_ip(n).into(), 8080);
    assert!(ok && text.contains(&format!("affinity entry {backend} (netns ")), "{text}");
    // An address no namespace here holds has no entry.
    let (ok, json) = explain_asking(env, socket, &["10.96.0.10:80", "--from", "192.0.2.99", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(ok && v["from"]["affinity"] == serde_json::json!([]), "{json}");
}
