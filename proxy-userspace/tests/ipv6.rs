//! IPv6 and dual-stack services, and IPv4-mapped IPv6 sockets, through the
//! kernel: real agent, curl and python3 sockets in the test namespace (whose
//! backends have IPv4 and IPv6 addresses on its loopback).
mod common;

use std::{collections::BTreeSet, fmt::Write as _};

use common::{Env, backend_ip, backend_ip6, web};
use proxy_testkit::UdpBackend;

fn endpoints(ips: &[String]) -> String {
    let mut s = String::new();
    for ip in ips {
        let _ = write!(s, "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n");
    }
    s
}

/// A service with `cluster_ips`, TCP 80 -> 8080 and UDP 53 -> 5353, and one
/// slice per family given.
fn service(name: &str, cluster_ips: &[&str], v4: &[u8], v6: &[u8]) -> String {
    let families: Vec<&str> = cluster_ips.iter().map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" }).collect();
    let mut s = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec:\n  clusterIP: {}\n  clusterIPs: {cluster_ips:?}\n  ipFamilies: {families:?}\n  ports:\n  - {{name: http, port: 80, protocol: TCP}}\n  - {{name: dns, port: 53, protocol: UDP}}\n",
        cluster_ips[0]
    );
    for (family, ips) in [
        ("IPv4", v4.iter().map(|i| backend_ip(*i).to_string()).collect::<Vec<_>>()),
        ("IPv6", v6.iter().map(|i| backend_ip6(*i).to_string()).collect()),
    ] {
        if ips.is_empty() {
            continue;
        }
        let _ = write!(
            s,
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-{family}\n  namespace: test\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: {family}\nports:\n- {{name: http, port: 8080, protocol: TCP}}\n- {{name: dns, port: 5353, protocol: UDP}}\nendpoints:\n{}",
            endpoints(&ips)
        );
    }
    s
}

#[test]
fn an_ipv6_service_over_tcp_and_udp() {
    common::require_root!();
    let mut env = Env::new(3);
    env.start_http6(3);
    for i in 1..=3 {
        env.udp.push(UdpBackend::start(&env.ns, backend_ip6(i).into(), 5353, &format!("backend-{i}-v6")).unwrap());
    }
    env.write_services(&service("web6", &["fd00:96::10"], &[], &[1, 2, 3]));
    env.start_agent();

    let answers: BTreeSet<String> = env.requests("[fd00:96::10]", 60).into_iter().collect();
    assert_eq!(answers, ["backend-1-v6", "backend-2-v6", "backend-3-v6"].into_iter().map(String::from).collect());

    let (ok, lines) = env.probe(&["tcp-peer", "fd00:96::10", "80"]);
    assert!(ok, "{lines:?}");
    assert_eq!(lines, vec!["peer [fd00:96::10]:80"], "getpeername() showed a backend");

    let (ok, lines) = env.probe(&["udp-sendto", "fd00:96::10", "53", "5"]);
    assert!(ok, "{lines:?}");
    assert_eq!(lines.len(), 5);
    assert!(lines.iter().all(|l| l.ends_with(" [fd00:96::10]:53")), "recvfrom() showed a backend: {lines:?}");
    assert_eq!(lines.iter().map(|l| l.split(':').next().unwrap()).collect::<BTreeSet<_>>().len(), 1, "{lines:?}");
}

#[test]
fn a_dual_stack_service_is_reached_over_both_families() {
    common::require_root!();
    let mut env = Env::new(2);
    env.start_http6(2);
    env.write_services(&service("dual", &["10.96.0.60", "fd00:96::60"], &[1], &[2]));
    let applied = env.start_agent();
    assert_eq!(common::applied_frontends(&applied), 4, "TCP and UDP, in both families");

    assert_eq!(env.requests("10.96.0.60", 10), vec!["backend-1"; 10]);
    assert_eq!(env.requests("[fd00:96::60]", 10), vec!["backend-2-v6"; 10]);
}

#[test]
fn an_ipv4_mapped_ipv6_socket_reaches_an_ipv4_service() {
    common::require_root!();
    let mut env = Env::new(1);
    env.start_udp(1, 5353);
    env.write_services(&(web(&[1]) + &service("dns", &["10.96.0.53"], &[1], &[])));
    env.start_agent();

    let (ok, lines) = env.probe(&["tcp-peer", "::ffff:10.96.0.10", "80"]);
    assert!(ok, "{lines:?}");
    assert_eq!(lines, vec!["peer [::ffff:10.96.0.10]:80"]);
    assert_eq!(env.accepted(), vec![1], "the connection reached the IPv4 backend");

    let (ok, lines) = env.probe(&["udp-sendto", "::ffff:10.96.0.53", "53", "3"]);
    assert!(ok, "{lines:?}");
    assert_eq!(lines.len(), 3);
    assert!(
        lines.iter().all(|l| l.starts_with("backend-1:ping") && l.ends_with(" [::ffff:10.96.0.53]:53")),
        "{lines:?}"
    );
}
