//! The outside path's service set and kube-proxy's rules for it: the
//! services of `spec` as NodePort services (service `s` on node port
//! `node_port(s)`, its endpoints on the backend node), as a services file
//! for the agent, as `iptables-restore` input and as `nft -f` input. The
//! rule sets are the ClusterIP ones of `rules` with what kube-proxy adds
//! for a NodePort of `externalTrafficPolicy: Cluster`
//! (pkg/proxy/iptables/proxier.go and pkg/proxy/nftables/proxier.go):
//!
//! - iptables: `KUBE-SERVICES`' last rule (`--dst-type LOCAL`) jumps to
//!   `KUBE-NODEPORTS`, which matches the node port and jumps to the
//!   service's `KUBE-EXT-*` chain: "masquerade traffic for ... external
//!   destinations" (`KUBE-MARK-MASQ`), then `KUBE-SVC-*`; `KUBE-POSTROUTING`
//!   masquerades what is marked. The filter table's forward path gets the
//!   jumps kube-proxy installs (`KUBE-PROXY-FIREWALL`, `KUBE-SERVICES`,
//!   `KUBE-EXTERNAL-SERVICES` for new connections, the conntrack accept).
//! - nftables: the `services` chain's second rule, `fib daddr type local`
//!   to the `service-nodeports` verdict map (protocol and port to the
//!   service's `external-*` chain: mark for masquerade, then `goto` its
//!   `service-*` chain), and the `filter-forward` hook's endpoint check
//!   (empty no-endpoint maps: every service has endpoints).
use std::fmt::Write as _;

use super::{
    rules,
    spec::{BACKEND_PORT, ENDPOINTS, SERVICE_PORT, endpoint, vip},
};

/// Service 0's node port.
pub const FIRST_NODE_PORT: u16 = 30_000;
/// Most services with a node port each (up to port 65535).
pub const MAX_SERVICES: u32 = 65_536 - FIRST_NODE_PORT as u32;
/// The backend node's name (the endpoints' `nodeName`).
pub const BACKEND_NODE: &str = "backend-node";

/// Service `s`'s node port. (A wider range than the API server's default
/// 30000-32767: its `--service-node-port-range` allows that.)
#[must_use]
pub fn node_port(s: u32) -> u16 {
    assert!(s < MAX_SERVICES, "service {s} has no node port (at most {MAX_SERVICES} services)");
    FIRST_NODE_PORT + u16::try_from(s).expect("below MAX_SERVICES")
}

/// The `n` NodePort services and their slices as a services file.
#[must_use]
pub fn services_yaml(n: u32) -> String {
    let mut out = String::with_capacity(usize::try_from(n).unwrap_or(0) * 900);
    for s in 0..n {
        let (vip, node_port) = (vip(s), node_port(s));
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc{s}, namespace: bench}}\nspec:\n  type: NodePort\n  clusterIP: {vip}\n  ports: [{{name: http, port: {SERVICE_PORT}, nodePort: {node_port}, protocol: TCP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc{s}-np, namespace: bench, labels: {{kubernetes.io/service-name: svc{s}}}}}\naddressType: IPv4\nports: [{{name: http, port: {BACKEND_PORT}, protocol: TCP}}]\nendpoints:\n"
        );
        for i in 0..ENDPOINTS {
            let _ = writeln!(
                out,
                "- {{addresses: [\"{}\"], nodeName: {BACKEND_NODE}, conditions: {{ready: true}}}}",
                endpoint(s, i)
            );
        }
    }
    out
}

/// `text` with `insert` put right after the first `anchor` in it.
fn insert_after(text: &str, anchor: &str, insert: &str) -> String {
    let at = text.find(anchor).map_or_else(|| panic!("no {anchor:?} in the rules"), |i| i + anchor.len());
    format!("{}{insert}{}", &text[..at], &text[at..])
}

/// `iptables-restore` input for `n` NodePort services.
#[must_use]
pub fn iptables(n: u32) -> String {
    let (mut chains, mut nat) = (String::new(), String::new());
    for s in 0..n {
        let port_name = rules::svc_port_name(s);
        let hash = rules::chain_hash(&port_name);
        let node_port = node_port(s);
        let _ = writeln!(chains, ":KUBE-EXT-{hash} - [0:0]");
        let _ = writeln!(
            nat,
            "-A KUBE-NODEPORTS -m comment --comment {port_name} -m tcp -p tcp --dport {node_port} -j KUBE-EXT-{hash}"
        );
        let _ = writeln!(
            nat,
            "-A KUBE-EXT-{hash} -m comment --comment \"masquerade traffic for {port_name} external destinations\" -j KUBE-MARK-MASQ"
        );
        let _ = writeln!(nat, "-A KUBE-EXT-{hash} -j KUBE-SVC-{hash}");
    }
    let text = rules::iptables(n);
    // The filter table first: its chains after `*filter`, its rules before
    // its COMMIT (the first).
    let text = insert_after(
        &text,
        "*filter\n",
        ":KUBE-EXTERNAL-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n",
    );
    let forward = "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
         -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
         COMMIT\n";
    let text = text.replacen("COMMIT\n", forward, 1);
    // The nat table: the chains after its built-in ones, the rules at its
    // end (its COMMIT is the text's last line).
    let text = insert_after(&text, ":POSTROUTING ACCEPT [0:0]\n", &chains);
    let body = text.strip_suffix("COMMIT\n").expect("the rules end with the nat table's COMMIT");
    format!("{body}{nat}COMMIT\n")
}

/// `nft -f` input for `n` NodePort services: the ClusterIP table, then
/// the NodePort parts added to it.
#[must_use]
pub fn nftables(n: u32) -> String {
    let mut out = rules::nftables(n);
    out.push_str("table ip kube-proxy {\n");
    let mut elements = Vec::new();
    for s in 0..n {
        let external = rules::nft_chain("external", s);
        let _ = write!(
            out,
            "  chain {external} {{\n    jump mark-for-masquerade\n    goto {}\n  }}\n",
            rules::nft_chain("service", s)
        );
        elements.push(format!("      tcp . {} : goto {external}", node_port(s)));
    }
    out.push_str(
        "  map service-nodeports {\n    type inet_proto . inet_service : verdict\n    comment \"NodePort traffic\"\n",
    );
    if !elements.is_empty() {
        let _ = write!(out, "    elements = {{\n{}\n    }}\n", elements.join(",\n"));
    }
    out.push_str(
        "  }\n  map no-endpoint-services {\n    type ipv4_addr . inet_proto . inet_service : verdict\n    comment \"vmap to drop or reject packets to services with no endpoints\"\n  }\n  map no-endpoint-nodeports {\n    type inet_proto . inet_service : verdict\n    comment \"vmap to drop or reject packets to service nodeports with no endpoints\"\n  }\n  chain service-endpoints-check {\n    ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n    fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports\n  }\n  chain filter-forward {\n    type filter hook forward priority -110; policy accept;\n    ct state new jump service-endpoints-check\n  }\n}\nadd rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ports_follow_the_plan() {
        assert_eq!(node_port(0), 30_000);
        assert_eq!(node_port(9_999), 39_999);
        assert_eq!(node_port(MAX_SERVICES - 1), 65_535);
        assert!(std::panic::catch_unwind(|| node_port(MAX_SERVICES)).is_err());
    }

    #[test]
    fn the_services_file_parses_into_node_ports_of_ten_remote_endpoints() {
        let parsed = ebpf_proxy::source::file::parse(&services_yaml(3)).unwrap();
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let node_ip: std::net::IpAddr = [10, 252, 1, 1].into();
        let t = ebpf_proxy::model::translate(
            &parsed.objects.services,
            &parsed.objects.slices,
            &ebpf_proxy::model::NodeContext::new("entry-node").with_ips(vec![node_ip]),
        );
        // Each service: its ClusterIP, and its node port on the node's
        // address, each with the ten endpoints.
        let mut node_ports: Vec<u16> = t.table.keys().filter(|k| k.addr == node_ip).map(|k| k.port).collect();
        node_ports.dedup();
        assert_eq!(node_ports, vec![30_000, 30_001, 30_002], "{:?}", t.table.keys().collect::<Vec<_>>());
        assert!(t.table.values().all(|f| f.backends.len() == usize::from(ENDPOINTS)));
    }

    #[test]
    fn iptables_rules_have_kube_proxys_nodeport_shape() {
        let text = iptables(2);
        let nat = &text[text.find("*nat\n").unwrap()..];
        // Declared before use: every KUBE-EXT chain line precedes the rules.
        let first_rule = nat.find("\n-A ").unwrap();
        assert_eq!(nat[..first_rule].matches(":KUBE-EXT-").count(), 2);
        assert_eq!(text.matches("-A KUBE-NODEPORTS -m comment --comment bench/svc").count(), 2);
        assert!(text.contains("--dport 30001 -j KUBE-EXT-"));
        assert_eq!(text.matches("external destinations\" -j KUBE-MARK-MASQ").count(), 2);
        let hash = rules::chain_hash(&rules::svc_port_name(1));
        assert!(text.contains(&format!("-A KUBE-EXT-{hash} -j KUBE-SVC-{hash}\n")));
        // The ClusterIP part is all there, and the nodeports jump is last
        // in KUBE-SERVICES.
        assert_eq!(text.matches("-j DNAT --to-destination").count(), 20);
        let last = text.lines().rfind(|l| l.starts_with("-A KUBE-SERVICES")).unwrap();
        assert!(last.ends_with("--dst-type LOCAL -j KUBE-NODEPORTS"), "{last}");
        // Two tables, each committed once; the forward path's jumps in filter.
        assert_eq!(text.matches("COMMIT\n").count(), 2);
        let filter = &text[..text.find("*nat\n").unwrap()];
        assert!(filter.contains(":KUBE-EXTERNAL-SERVICES - [0:0]") && filter.contains("-j KUBE-EXTERNAL-SERVICES"));
    }

    #[test]
    fn the_agents_takeover_reads_these_rules_as_the_same_table() {
        // What `--take-over-from-kube-proxy` reads from these rules is
        // what the model makes of the services file: nothing differs.
        let parsed = ebpf_proxy::source::file::parse(&services_yaml(3)).unwrap();
        let node_ip: std::net::IpAddr = [10, 252, 1, 1].into();
        let t = ebpf_proxy::model::translate(
            &parsed.objects.services,
            &parsed.objects.slices,
            &ebpf_proxy::model::NodeContext::new("entry-node").with_ips(vec![node_ip]),
        );
        let (mut rules, mut unserved) = (ebpf_proxy::takeover::RuleTable::new(), Vec::new());
        ebpf_proxy::takeover::iptables::frontends(
            &iptables(3),
            ebpf_proxy::takeover::Family::V4,
            &mut rules,
            &mut unserved,
        )
        .unwrap();
        assert_eq!(rules.len(), 6, "three ClusterIPs and three nodePorts: {rules:?}");
        assert!(rules.values().all(|f| f.backends.len() == usize::from(ENDPOINTS)));
        assert_eq!(ebpf_proxy::takeover::compare(&t.table, &rules, &unserved), []);
        // One endpoint moved in the rules: exactly that is reported.
        let moved = iptables(3).replacen(&format!("{}:{BACKEND_PORT}", endpoint(1, 4)), "10.200.0.1:8080", 2);
        let mut rules = ebpf_proxy::takeover::RuleTable::new();
        ebpf_proxy::takeover::iptables::frontends(&moved, ebpf_proxy::takeover::Family::V4, &mut rules, &mut unserved)
            .unwrap();
        let differences = ebpf_proxy::takeover::compare(&t.table, &rules, &unserved);
        assert_eq!(differences.len(), 2, "the ClusterIP and the nodePort of service 1: {differences:?}");
        assert!(differences.iter().all(|d| d.to_string().contains("only kube-proxy's rules 10.200.0.1:8080")));
    }

    #[test]
    fn nftables_rules_have_kube_proxys_nodeport_shape() {
        let text = nftables(2);
        assert_eq!(text.matches("chain external-").count(), 2);
        assert!(text.contains(&format!("tcp . 30001 : goto {}", rules::nft_chain("external", 1))));
        assert!(text.contains(&format!("    goto {}\n", rules::nft_chain("service", 0))));
        assert!(text.ends_with("vmap @service-nodeports\n"));
        assert_eq!(text.matches("dnat to").count(), 20);
    }
}
