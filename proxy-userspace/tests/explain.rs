//! `ebpf-proxy explain` reads the pinned maps: a ClusterIP with affinity,
//! and a LoadBalancer restricted to a source range, whose `--from` answer
//! names the Maglev entry a client's flow hashes to; the same with the
//! agent running and after it stopped.
mod common;

use std::{net::IpAddr, process::Command};

use common::{Env, backend_ip, service, slice};
use ebpf_proxy::datapath::{KernelMaps, ServiceMaps as _};

fn explain(env: &Env, args: &[&str]) -> (bool, String) {
    let out = Command::new(common::AGENT)
        .arg("explain")
        .args(args)
        .arg("--bpffs-dir")
        .arg(env.pin_dir())
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
    let lb = ebpf_proxy::datapath::inspect::frontends(&dump)
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
    let (addr, _) = ebpf_proxy::datapath::codec::endpoint_of(&backend.addr, backend.port);
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
