//! One test per Kubernetes rule of the model.
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use super::{NoLocalEndpoints, NodeContext, ServiceSpec, SkipReason, TableState, render, translate};
use crate::source::file;

/// Translates a YAML stream of Services and EndpointSlices for node `n1`.
fn table(yaml: &str) -> (String, Vec<String>) {
    let parsed = file::parse(yaml).expect("yaml");
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let t = translate(&parsed.objects.services, &parsed.objects.slices, &NodeContext::new("n1"));
    (render(&t.table), t.problems.iter().map(ToString::to_string).collect())
}

const SVC: &str = "
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns}
spec:
  clusterIP: 10.96.0.1
  ports:
  - {name: http, port: 80, targetPort: web}
  - {name: dns, port: 53, protocol: UDP}
";

fn slice(name: &str, ports: &str, endpoints: &str) -> String {
    format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: ns, labels: {{kubernetes.io/service-name: s}}}}\naddressType: IPv4\nports: {ports}\nendpoints: {endpoints}\n"
    )
}

const PORTS: &str = "[{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]";

#[test]
fn ports_are_matched_by_name_and_protocol() {
    let yaml = format!("{SVC}{}", slice("a", PORTS, "[{addresses: [10.0.0.1]}]"));
    let (t, problems) = table(&yaml);
    assert_eq!(t, "10.96.0.1:53/UDP ns/s:dns -> 10.0.0.1:5353\n10.96.0.1:80/TCP ns/s:http -> 10.0.0.1:8080\n");
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn slices_are_merged_and_deduplicated() {
    let yaml = format!(
        "{SVC}{}{}",
        slice("a", PORTS, "[{addresses: [10.0.0.2]}, {addresses: [10.0.0.1]}]"),
        slice("b", PORTS, "[{addresses: [10.0.0.1]}, {addresses: [10.0.0.3]}]")
    );
    let (t, _) = table(&yaml);
    assert!(t.contains("10.96.0.1:80/TCP ns/s:http -> 10.0.0.1:8080 10.0.0.2:8080 10.0.0.3:8080\n"), "{t}");
}

#[test]
fn ready_endpoints_win_over_terminating_ones() {
    let eps = "[{addresses: [10.0.0.1], conditions: {ready: true}}, {addresses: [10.0.0.2], conditions: {ready: false, serving: true, terminating: true}}, {addresses: [10.0.0.3], conditions: {ready: false, serving: false}}]";
    let (t, _) = table(&format!("{SVC}{}", slice("a", PORTS, eps)));
    assert!(t.contains(":80/TCP ns/s:http -> 10.0.0.1:8080\n"), "{t}");
}

#[test]
fn serving_terminating_endpoints_are_the_fallback() {
    let eps = "[{addresses: [10.0.0.2], conditions: {ready: false, serving: true, terminating: true}}, {addresses: [10.0.0.3], conditions: {ready: false, serving: false, terminating: true}}]";
    let (t, _) = table(&format!("{SVC}{}", slice("a", PORTS, eps)));
    assert!(t.contains(":80/TCP ns/s:http -> ~10.0.0.2:8080\n"), "{t}");
}

#[test]
fn no_usable_endpoint_gives_an_empty_frontend() {
    let (t, _) = table(SVC);
    assert_eq!(t, "10.96.0.1:53/UDP ns/s:dns -> (none)\n10.96.0.1:80/TCP ns/s:http -> (none)\n");
}

#[test]
fn internal_traffic_policy_local_keeps_this_nodes_endpoints() {
    let svc = SVC.replace("  clusterIP: 10.96.0.1\n", "  clusterIP: 10.96.0.1\n  internalTrafficPolicy: Local\n");
    let eps = "[{addresses: [10.0.0.1], nodeName: n1}, {addresses: [10.0.0.2], nodeName: n2}]";
    let (t, _) = table(&format!("{svc}{}", slice("a", PORTS, eps)));
    assert!(t.contains(":80/TCP ns/s:http -> 10.0.0.1:8080(local)\n"), "{t}");
}

#[test]
fn skipped_kinds_are_not_programmed() {
    for (patch, label) in [
        ("  clusterIP: None\n", ""),
        ("  clusterIP: 10.96.0.1\n  type: ExternalName\n  externalName: example.com\n", ""),
        ("  clusterIP: 10.96.0.1\n", "  labels: {service.kubernetes.io/service-proxy-name: other}\n"),
    ] {
        let svc = SVC.replace("  clusterIP: 10.96.0.1\n", patch).replace(
            "metadata: {name: s, namespace: ns}\n",
            &format!("metadata:\n  name: s\n  namespace: ns\n{label}"),
        );
        let (t, _) = table(&svc);
        assert_eq!(t, "", "{svc}");
    }
}

/// SCTP is served (per packet, as kube-proxy serves it); its slice ports
/// match by name and protocol as TCP's and UDP's do. An unknown protocol
/// is skipped with a problem.
#[test]
fn sctp_is_served_and_unknown_protocols_are_skipped_with_a_problem() {
    let svc = SVC.replace("protocol: UDP}", "protocol: SCTP}")
        + "---\napiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: ns}\nspec: {clusterIP: 10.96.0.2, ports: [{port: 1, protocol: QUIC}]}\n";
    let ports = "[{name: http, port: 8080, protocol: TCP}, {name: dns, port: 53, protocol: SCTP}, {name: dns, port: 5353, protocol: UDP}]";
    let (t, problems) = table(&format!("{svc}{}", slice("a", ports, "[{addresses: [10.0.0.1]}]")));
    assert_eq!(t, "10.96.0.1:53/SCTP ns/s:dns -> 10.0.0.1:53\n10.96.0.1:80/TCP ns/s:http -> 10.0.0.1:8080\n");
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("dns\"/UDP matches no port"), "{problems:?}");
    assert!(problems[1].contains("Service ns/x: spec.ports[0].protocol"), "{problems:?}");
}

#[test]
fn bad_endpoint_addresses_and_ports_are_reported_and_skipped() {
    let eps = "[{addresses: [10.0.0.1]}, {addresses: [not-an-ip]}, {addresses: []}]";
    let ports = "[{name: http, port: 8080}, {name: nope, port: 1}, {name: dns, port: 70000, protocol: UDP}]";
    let (t, problems) = table(&format!("{SVC}{}", slice("a", ports, eps)));
    assert!(t.contains(":80/TCP ns/s:http -> 10.0.0.1:8080\n"), "{t}");
    assert!(t.contains(":53/UDP ns/s:dns -> (none)\n"), "{t}");
    let all = problems.join("\n");
    assert!(all.contains("EndpointSlice ns/a: endpoints[1].addresses[0]"), "{all}");
    assert!(all.contains("EndpointSlice ns/a: endpoints[2].addresses"), "{all}");
    assert!(all.contains("EndpointSlice ns/a: ports[1].name: port \"nope\""), "{all}");
    assert!(all.contains("EndpointSlice ns/a: ports[2].port: 70000"), "{all}");
}

#[test]
fn two_services_on_one_frontend_keep_the_first() {
    let other = SVC.replace("name: s,", "name: t,");
    let (t, problems) = table(&format!("{other}---{SVC}"));
    assert!(t.contains("ns/s:http"), "{t}");
    assert!(
        problems.iter().any(|p| p.starts_with("Service ns/t") && p.contains("already served by ns/s:http")),
        "{problems:?}"
    );
}

#[test]
fn order_of_objects_does_not_matter() {
    let a = slice("a", PORTS, "[{addresses: [10.0.0.2]}]");
    let b = slice("b", PORTS, "[{addresses: [10.0.0.1]}]");
    assert_eq!(table(&format!("{SVC}{a}{b}")).0, table(&format!("{b}---{SVC}{a}")).0);
}

#[test]
fn more_endpoints_than_a_frontend_holds_are_capped_with_a_warning() {
    let eps = "[{addresses: [10.0.0.3]}, {addresses: [10.0.0.1]}, {addresses: [10.0.0.2]}]";
    let parsed = file::parse(&format!("{SVC}{}", slice("a", PORTS, eps))).unwrap();
    let node = NodeContext { max_backends: 2, ..NodeContext::new("n1") };
    let t = translate(&parsed.objects.services, &parsed.objects.slices, &node);
    assert!(render(&t.table).contains(":80/TCP ns/s:http -> 10.0.0.1:8080 10.0.0.2:8080\n"));
    assert!(
        t.problems.iter().any(|p| p.to_string().contains("3 endpoints, more than the 2 a frontend holds")),
        "{:?}",
        t.problems
    );
}

/// Endpoints 10.0.0.1 (hint zone-a), .2 (zone-b), .3 (zone-a, or none).
fn hinted(third_has_hint: bool) -> String {
    let third = if third_has_hint { ", hints: {forZones: [{name: zone-a}]}" } else { "" };
    let eps = format!(
        "[{{addresses: [10.0.0.1], hints: {{forZones: [{{name: zone-a}}]}}}}, {{addresses: [10.0.0.2], hints: {{forZones: [{{name: zone-b}}]}}}}, {{addresses: [10.0.0.3]{third}}}]"
    );
    format!("{SVC}{}", slice("a", PORTS, &eps))
}

fn table_in_zone(yaml: &str, zone: Option<&str>) -> String {
    let parsed = file::parse(yaml).unwrap();
    let node = NodeContext { zone: zone.map(str::to_owned), ..NodeContext::new("n1") };
    render(&translate(&parsed.objects.services, &parsed.objects.slices, &node).table)
}

#[test]
fn zone_hints_keep_traffic_in_this_zone() {
    let t = table_in_zone(&hinted(true), Some("zone-a"));
    assert!(t.contains(":80/TCP ns/s:http -> 10.0.0.1:8080 10.0.0.3:8080\n"), "{t}");
    let t = table_in_zone(&hinted(true), Some("zone-b"));
    assert!(t.contains(":80/TCP ns/s:http -> 10.0.0.2:8080\n"), "{t}");
}

#[test]
fn zone_hints_are_ignored_unless_complete_and_useful() {
    let all = ":80/TCP ns/s:http -> 10.0.0.1:8080 10.0.0.2:8080 10.0.0.3:8080\n";
    // An endpoint without hints: hints are not trusted.
    assert!(table_in_zone(&hinted(false), Some("zone-a")).contains(all));
    // No endpoint for this zone.
    assert!(table_in_zone(&hinted(true), Some("zone-c")).contains(all));
    // This node's zone is unknown.
    assert!(table_in_zone(&hinted(true), None).contains(all));
    // internalTrafficPolicy: Local selects by node, not by zone.
    let local =
        hinted(true).replace("  clusterIP: 10.96.0.1\n", "  clusterIP: 10.96.0.1\n  internalTrafficPolicy: Local\n");
    assert!(table_in_zone(&local, Some("zone-a")).contains(":80/TCP ns/s:http -> (none)\n"));
}

#[test]
fn the_zone_comes_from_this_nodes_labels() {
    let yaml = "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {topology.kubernetes.io/zone: zone-b}}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n2, labels: {topology.kubernetes.io/zone: zone-a}}\n";
    let parsed = file::parse(yaml).unwrap();
    assert_eq!(NodeContext::from_nodes("n1", &parsed.objects.nodes).zone.as_deref(), Some("zone-b"));
    assert_eq!(NodeContext::from_nodes("n3", &parsed.objects.nodes).zone, None);
}

#[test]
fn dual_stack_frontends_take_the_slices_of_their_own_family() {
    let svc =
        SVC.replace("  clusterIP: 10.96.0.1\n", "  clusterIP: 10.96.0.1\n  clusterIPs: [10.96.0.1, \"fd00::1\"]\n");
    let v6 = slice("b", PORTS, "[{addresses: [\"fd00::a\"]}, {addresses: [10.0.0.9]}]")
        .replace("addressType: IPv4", "addressType: IPv6");
    let yaml = format!("{svc}{}{v6}", slice("a", PORTS, "[{addresses: [10.0.0.1]}]"));
    let parsed = file::parse(&yaml).unwrap();
    let t = translate(&parsed.objects.services, &parsed.objects.slices, &NodeContext::new("n1"));
    let text = render(&t.table);
    assert!(text.contains("10.96.0.1:80/TCP ns/s:http -> 10.0.0.1:8080\n"), "{text}");
    assert!(text.contains("[fd00::1]:80/TCP ns/s:http -> [fd00::a]:8080\n"), "{text}");
    // An IPv4 address in an IPv6 slice is reported, not used.
    assert!(
        t.problems.iter().any(|p| p.to_string().contains("\"10.0.0.9\" is not an IPv6 address")),
        "{:?}",
        t.problems
    );
}

/// A LoadBalancer service `lb` on node addresses 192.168.1.10 (this node)
/// with NodePort 30080, ingress IP 203.0.113.50, externalIPs 192.168.1.10
/// (this node's) and 198.51.100.7 (elsewhere), and `extra` in its spec.
fn load_balancer(extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: s, namespace: ns}}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.1\n  externalIPs: [192.168.1.10, 198.51.100.7]\n  ports:\n  - {{name: http, port: 80, nodePort: 30080}}\n{extra}status:\n  loadBalancer: {{ingress: [{{ip: 203.0.113.50}}]}}\n{}",
        slice("a", PORTS, "[{addresses: [10.0.0.1], nodeName: n1}, {addresses: [10.0.0.2], nodeName: n2}]")
    )
}

fn translate_on_node(yaml: &str) -> super::Translation {
    translate_with(yaml, &NodeContext::new("n1").with_ips(vec!["192.168.1.10".parse().unwrap()]))
}

fn translate_with(yaml: &str, node: &NodeContext) -> super::Translation {
    let parsed = file::parse(yaml).expect("yaml");
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    translate(&parsed.objects.services, &parsed.objects.slices, node)
}

/// `translate_on_node` with `--external-ips-local-only`.
fn translate_local_only(yaml: &str) -> super::Translation {
    let node = NodeContext {
        external_ips_local_only: true,
        ..NodeContext::new("n1").with_ips(vec!["192.168.1.10".parse().unwrap()])
    };
    translate_with(yaml, &node)
}

#[test]
fn external_traffic_policy_cluster_serves_everyone_from_one_entry() {
    let t = render(&translate_on_node(&load_balancer("")).table);
    let all = "-> 10.0.0.1:8080(local) 10.0.0.2:8080\n";
    for line in [
        "192.168.1.10:30080/TCP ns/s:http NodePort ",
        "127.0.0.1:30080/TCP ns/s:http NodePort local-clients ",
        "203.0.113.50:80/TCP ns/s:http LoadBalancer ",
        "192.168.1.10:80/TCP ns/s:http ExternalIP ",
    ] {
        assert!(t.contains(&format!("{line}{all}")), "{line}\n{t}");
    }
    // An externalIP of another machine too, as kube-proxy captures it in
    // OUTPUT as well as PREROUTING.
    assert!(t.contains(&format!("198.51.100.7:80/TCP ns/s:http ExternalIP {all}")), "{t}");
    assert!(!t.contains("(external)"), "no twins with externalTrafficPolicy: Cluster\n{t}");
    // --external-ips-local-only: traffic from outside only (CVE-2020-8554:
    // local clients reach the real address); this node's own is served.
    let t = render(&translate_local_only(&load_balancer("")).table);
    assert!(t.contains(&format!("198.51.100.7:80/TCP ns/s:http ExternalIP outside-only {all}")), "{t}");
    assert!(t.contains(&format!("192.168.1.10:80/TCP ns/s:http ExternalIP {all}")), "{t}");
}

#[test]
fn external_traffic_policy_local_gives_outside_traffic_this_nodes_endpoints() {
    let tr = translate_on_node(&load_balancer("  externalTrafficPolicy: Local\n  healthCheckNodePort: 32000\n"));
    let t = render(&tr.table);
    // Local clients keep every endpoint; traffic from outside gets a twin
    // with this node's only.
    assert!(
        t.contains("192.168.1.10:30080/TCP ns/s:http NodePort local-clients -> 10.0.0.1:8080(local) 10.0.0.2:8080\n"),
        "{t}"
    );
    assert!(
        t.contains("192.168.1.10:30080/TCP (external) ns/s:http NodePort outside-only -> 10.0.0.1:8080(local)\n"),
        "{t}"
    );
    assert!(
        t.contains("203.0.113.50:80/TCP (external) ns/s:http LoadBalancer outside-only -> 10.0.0.1:8080(local)\n"),
        "{t}"
    );
    assert!(
        t.contains("198.51.100.7:80/TCP (external) ns/s:http ExternalIP outside-only -> 10.0.0.1:8080(local)\n"),
        "{t}"
    );
    assert!(
        t.contains("198.51.100.7:80/TCP ns/s:http ExternalIP local-clients -> 10.0.0.1:8080(local) 10.0.0.2:8080\n")
    );
    // --external-ips-local-only: the entry every client would use is for
    // traffic from outside only too, and keeps every endpoint, so that the
    // TC programs tell "none anywhere" (rejected) from "none here" (dropped).
    let t = render(&translate_local_only(&load_balancer("  externalTrafficPolicy: Local\n")).table);
    assert!(
        t.contains("198.51.100.7:80/TCP ns/s:http ExternalIP outside-only -> 10.0.0.1:8080(local) 10.0.0.2:8080\n"),
        "{t}"
    );
    assert!(
        t.contains("198.51.100.7:80/TCP (external) ns/s:http ExternalIP outside-only -> 10.0.0.1:8080(local)\n"),
        "{t}"
    );
    assert_eq!(tr.health_checks.len(), 1);
    assert_eq!((tr.health_checks[0].port, tr.health_checks[0].local_endpoints), (32000, 1));
    assert_eq!(tr.health_checks[0].service.to_string(), "Service ns/s");
}

#[test]
fn no_local_endpoint_leaves_the_external_twin_empty_and_the_health_check_at_zero() {
    let yaml = load_balancer("  externalTrafficPolicy: Local\n  healthCheckNodePort: 32000\n")
        .replace("nodeName: n1", "nodeName: n3");
    let tr = translate_on_node(&yaml);
    let t = render(&tr.table);
    assert!(t.contains("203.0.113.50:80/TCP (external) ns/s:http LoadBalancer outside-only -> (none)\n"), "{t}");
    assert_eq!(tr.health_checks[0].local_endpoints, 0);
}

#[test]
fn source_ranges_restrict_traffic_from_outside_to_load_balancer_ips_and_node_ports() {
    let tr = translate_on_node(&load_balancer("  loadBalancerSourceRanges: [203.0.113.0/24, \"10.1.2.3/8\"]\n"));
    let t = render(&tr.table);
    let sources = "sources=203.0.113.0/24,10.0.0.0/8";
    assert!(t.contains(&format!("203.0.113.50:80/TCP ns/s:http LoadBalancer {sources} ->")), "{t}");
    assert!(t.contains(&format!("192.168.1.10:30080/TCP ns/s:http NodePort {sources} ->")), "{t}");
    assert!(!t.contains(&format!("127.0.0.1:30080/TCP ns/s:http NodePort local-clients {sources}")), "{t}");
    assert!(!t.contains(&format!("ExternalIP {sources}")), "externalIPs are not restricted\n{t}");
    assert!(!tr.problems.iter().any(|p| p.field.contains("SourceRanges")), "{:?}", tr.problems);
}

/// `ebpf-proxy.io/nodeport-mode` marks the frontends traffic from outside
/// reaches (NodePort, LoadBalancer IP, externalIP), never a ClusterIP nor
/// the NodePort on 127.0.0.1 (only clients on the node reach those); a
/// value it does not name is reported and leaves the node's mode.
#[test]
fn the_nodeport_mode_annotation_marks_the_frontends_reached_from_outside() {
    let annotated = |value: &str| {
        load_balancer("").replacen(
            "metadata: {name: s, namespace: ns}",
            &format!("metadata: {{name: s, namespace: ns, annotations: {{ebpf-proxy.io/nodeport-mode: {value}}}}}"),
            1,
        )
    };
    let tr = translate_on_node(&annotated("snat"));
    let t = render(&tr.table);
    for line in [
        "192.168.1.10:30080/TCP ns/s:http NodePort forward=snat ->",
        "203.0.113.50:80/TCP ns/s:http LoadBalancer forward=snat ->",
        "192.168.1.10:80/TCP ns/s:http ExternalIP forward=snat ->",
        "127.0.0.1:30080/TCP ns/s:http NodePort local-clients ->",
        "10.96.0.1:80/TCP ns/s:http ->",
    ] {
        assert!(t.contains(line), "{line}\n{t}");
    }
    assert!(!tr.problems.iter().any(|p| p.field.contains("annotations")), "{:?}", tr.problems);
    let t = render(&translate_on_node(&annotated("dsr")).table);
    assert_eq!(t.matches("forward=dsr").count(), 4, "NodePort, LoadBalancer IP, two externalIPs\n{t}");

    let tr = translate_on_node(&annotated("Direct"));
    assert!(!render(&tr.table).contains("forward="));
    let problems: Vec<String> =
        tr.problems.iter().filter(|p| p.field.contains("annotations")).map(ToString::to_string).collect();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("metadata.annotations[ebpf-proxy.io/nodeport-mode]")
            && problems[0].contains("snat, dsr; the node's --nodeport-mode is used"),
        "{problems:?}"
    );
}

#[test]
fn invalid_source_ranges_fail_closed() {
    let tr = translate_on_node(&load_balancer("  loadBalancerSourceRanges: [nowhere]\n"));
    let t = render(&tr.table);
    assert!(t.contains("203.0.113.50:80/TCP ns/s:http LoadBalancer sources=none ->"), "{t}");
    let problems: Vec<String> = tr.problems.iter().map(ToString::to_string).collect();
    assert!(
        problems.iter().any(|p| p.contains("loadBalancerSourceRanges[0]") && p.contains("not a CIDR")),
        "{problems:?}"
    );
    assert!(problems.iter().any(|p| p.contains("no valid range")), "{problems:?}");
}

/// kube-proxy's `sync_proxy_rules_no_local_endpoints_total`: service ports
/// whose Local policy leaves them no endpoint on this node, by policy; a
/// service with an endpoint here, or without a Local policy, is not counted.
#[test]
fn ports_with_a_local_policy_and_no_local_endpoint_are_counted() {
    let svc = |name: &str, extra: &str| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}}]\n{extra}"
        )
    };
    let slice = |service: &str, node: &str| {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {service}-a, namespace: ns, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints: [{{addresses: [10.244.2.1], conditions: {{ready: true}}, nodeName: {node}}}]\n"
        )
    };
    let services = [
        svc("internal", "  internalTrafficPolicy: Local\n"),
        svc("external", "  type: NodePort\n  externalTrafficPolicy: Local\n"),
        svc("both", "  type: NodePort\n  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local\n"),
        svc("cluster", "  type: NodePort\n"),
    ]
    .concat();
    let node = NodeContext::new("node-a").with_ips(vec!["192.168.1.10".parse().unwrap()]);
    let count = |endpoints_on: &str| {
        let names = ["internal", "external", "both", "cluster"];
        let yaml = services.clone() + &names.map(|n| slice(n, endpoints_on)).concat();
        let parsed = file::parse(&yaml).expect("yaml");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let (services, slices) = parsed.objects.inputs();
        let mut state = TableState::default();
        state.replace_all(&services, &slices, &node);
        state.no_local_endpoints()
    };
    assert_eq!(count("node-b"), NoLocalEndpoints { internal: 2, external: 2 });
    assert_eq!(count("node-a"), NoLocalEndpoints::default(), "the endpoints are on this node");
}

/// A Service from YAML (not through the services file, which leaves out
/// Services labelled for another proxy).
fn service(yaml: &str) -> Service {
    serde_norway::from_str(yaml).expect("a Service")
}

const SKIPPED: &[(&str, &str, SkipReason)] = &[
    ("headless", "spec: {clusterIP: None, ports: [{port: 80}]}", SkipReason::Headless),
    ("headless (clusterIPs)", "spec: {clusterIPs: [None], ports: [{port: 80}]}", SkipReason::Headless),
    (
        "ExternalName",
        "spec: {type: ExternalName, externalName: example.com, ports: [{port: 80}]}",
        SkipReason::ExternalName,
    ),
    (
        "another proxy",
        "metadata: {name: s, namespace: ns, labels: {service.kubernetes.io/service-proxy-name: other}}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}",
        SkipReason::OtherProxy,
    ),
    // Not "no clusterIP allocated": the object has no spec at all.
    ("no spec", "", SkipReason::NoSpec),
    ("no clusterIP", "spec: {ports: [{port: 80}]}", SkipReason::NoClusterIp),
    ("no valid clusterIP", "spec: {clusterIP: nonsense, ports: [{port: 80}]}", SkipReason::NoClusterIp),
    // kube-proxy makes one service port per spec.ports entry: none, none.
    ("no ports", "spec: {clusterIP: 10.96.0.1}", SkipReason::NoPorts),
    ("empty ports", "spec: {clusterIP: 10.96.0.1, ports: []}", SkipReason::NoPorts),
];

/// The Service of a `SKIPPED` case.
fn skipped_case(rest: &str) -> Service {
    let meta = if rest.starts_with("metadata:") { "" } else { "metadata: {name: s, namespace: ns}\n" };
    service(&format!("apiVersion: v1\nkind: Service\n{meta}{rest}\n"))
}

#[test]
fn each_skipped_service_has_its_reason() {
    for (name, rest, reason) in SKIPPED {
        let t = translate(&[skipped_case(rest)], &[] as &[EndpointSlice], &NodeContext::new("n1"));
        let got: Vec<SkipReason> = t.skipped.iter().map(|(_, r)| *r).collect();
        assert_eq!(got, [*reason], "{name}");
        assert_eq!(render(&t.table), "", "{name}");
        assert!(!reason.as_str().is_empty());
    }
}

#[test]
fn a_skip_reason_is_told_once_and_again_when_it_changes() {
    let node = NodeContext::new("n1");
    let mut state = TableState::default();
    let mut sync = |rest: &str| -> Vec<SkipReason> {
        let services = [ServiceSpec::from(&skipped_case(rest))];
        state.replace_all(&services, &[], &node).skipped.into_iter().map(|(_, r)| r).collect()
    };
    let headless = "spec: {clusterIP: None, ports: [{port: 80}]}";
    assert_eq!(sync(headless), [SkipReason::Headless], "a new skipped service");
    assert_eq!(sync(headless), [], "an unrelated sync");
    assert_eq!(sync(&headless.replace("80", "81")), [], "a change that keeps the reason");
    assert_eq!(sync("spec: {type: ExternalName, externalName: a.example}"), [SkipReason::ExternalName], "changed");
    assert_eq!(sync("spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}"), [], "proxied");
    assert_eq!(sync(headless), [SkipReason::Headless], "skipped again");
    // A service skipped for the same reason as another is told too.
    let services = [
        ServiceSpec::from(&skipped_case(headless)),
        ServiceSpec::from(&service(
            "apiVersion: v1\nkind: Service\nmetadata: {name: t, namespace: ns}\nspec: {clusterIP: None}\n",
        )),
    ];
    let delta = state.replace_all(&services, &[], &node);
    let told: Vec<String> = delta.skipped.iter().map(|(o, r)| format!("{o} {}", r.as_str())).collect();
    assert_eq!(told, ["Service ns/t headless (clusterIP: None)"]);
}

/// hints.forNodes, as kube-proxy's topologyModeFromHints
/// (pkg/proxy/topology.go): node hints are followed when every ready
/// endpoint has one and one names this node, before zone hints; else zone
/// hints are considered as if there were no node hints.
#[test]
fn node_hints_come_before_zone_hints() {
    let ep = |last: u8, nodes: &str, zone: &str| {
        format!("{{addresses: [10.0.0.{last}], hints: {{forNodes: [{nodes}], forZones: [{{name: {zone}}}]}}}}")
    };
    let cases: &[(&str, Vec<String>, Option<&str>, &str)] = &[
        (
            "this node's endpoints only",
            vec![ep(1, "{name: n1}", "za"), ep(2, "{name: n2}", "za"), ep(3, "{name: n2}, {name: n1}", "zb")],
            Some("za"),
            "10.0.0.1:8080 10.0.0.3:8080",
        ),
        (
            "no endpoint for this node: zone hints",
            vec![ep(1, "{name: n2}", "za"), ep(2, "{name: n3}", "zb")],
            Some("za"),
            "10.0.0.1:8080",
        ),
        (
            "no endpoint for this node, no zone: all",
            vec![ep(1, "{name: n2}", "za"), ep(2, "{name: n3}", "zb")],
            None,
            "10.0.0.1:8080 10.0.0.2:8080",
        ),
        (
            "one ready endpoint without node hints: zone hints",
            vec![ep(1, "{name: n1}", "zb"), ep(2, "{name: n2}", "za"), ep(3, "", "za")],
            Some("za"),
            "10.0.0.2:8080 10.0.0.3:8080",
        ),
        (
            "a not ready endpoint without node hints does not count",
            vec![ep(1, "{name: n1}", "za"), ep(2, "{name: n2}", "za"), "{addresses: [10.0.0.3], conditions: {ready: false}}".into()],
            Some("za"),
            "10.0.0.1:8080",
        ),
        (
            "terminating endpoints (none ready): hints are not followed",
            vec![
                "{addresses: [10.0.0.1], conditions: {ready: false, serving: true, terminating: true}, hints: {forNodes: [{name: n1}]}}".into(),
                "{addresses: [10.0.0.2], conditions: {ready: false, serving: true, terminating: true}, hints: {forNodes: [{name: n2}]}}".into(),
            ],
            None,
            "~10.0.0.1:8080 ~10.0.0.2:8080",
        ),
    ];
    for (name, endpoints, zone, expected) in cases {
        let yaml = format!("{SVC}{}", slice("a", PORTS, &format!("[{}]", endpoints.join(", "))));
        let t = table_in_zone(&yaml, *zone);
        assert!(t.contains(&format!(":80/TCP ns/s:http -> {expected}\n")), "{name}: {t}");
    }
    // internalTrafficPolicy: Local: kube-proxy's CategorizeEndpoints takes
    // this node's endpoints without looking at hints (they narrow cluster
    // endpoints only).
    let svc = SVC.replace("  clusterIP: 10.96.0.1\n", "  clusterIP: 10.96.0.1\n  internalTrafficPolicy: Local\n");
    let eps = "[{addresses: [10.0.0.1], nodeName: n1, hints: {forNodes: [{name: n2}]}}, {addresses: [10.0.0.2], nodeName: n1, hints: {forNodes: [{name: n1}]}}]";
    let t = table_in_zone(&format!("{svc}{}", slice("a", PORTS, eps)), None);
    assert!(t.contains(":80/TCP ns/s:http -> 10.0.0.1:8080(local) 10.0.0.2:8080(local)\n"), "{t}");
}

/// A key several services claim passes between them as they come and go
/// (the first by namespace and name serves it, as `translate` decides over
/// sorted services): at every step the kept state holds the table and the
/// conflict problems a translation from scratch gives, and says which keys
/// changed. The table holds a served frontend's one copy, the claims the
/// others' (see `state.rs`), so every hand-over moves one.
#[test]
fn a_shared_key_passes_between_its_claimants() {
    let node = NodeContext::new("n1");
    let svc = |name: &str| SVC.replace("name: s,", &format!("name: {name},"));
    let mut state = TableState::default();
    let mut before = String::new();
    let steps: &[&[&str]] = &[&["t"], &["s", "t"], &["a", "s", "t"], &["s", "t"], &["t"], &["a"], &[], &["t", "s"]];
    for names in steps {
        // Only `s` has endpoints, so its frontends differ from the others'.
        let yaml = names.iter().map(|n| svc(n)).collect::<Vec<_>>().join("---\n")
            + &if names.contains(&"s") { slice("a", PORTS, "[{addresses: [10.0.0.1]}]") } else { String::new() };
        let parsed = file::parse(&yaml).expect("yaml");
        let (services, slices) = parsed.objects.inputs();
        let delta = state.replace_all(&services, &slices, &node);
        let fresh = translate(&parsed.objects.services, &parsed.objects.slices, &node);
        let now = render(state.table());
        assert_eq!(now, render(&fresh.table), "{names:?}");
        let problems = |p: Vec<String>| {
            let mut p = p;
            p.sort();
            p
        };
        assert_eq!(
            problems(state.problems().map(ToString::to_string).collect()),
            problems(fresh.problems.iter().map(ToString::to_string).collect()),
            "{names:?}"
        );
        assert_eq!(delta.keys.is_empty(), now == before, "{names:?}: changed keys {:?}", delta.keys);
        before = now;
    }
}

/// Every frontend of a service port holds the same strings (one copy per
/// port, see `ServicePort`), and another port its own.
#[test]
fn the_frontends_of_a_port_share_its_name() {
    let two_ports = load_balancer("").replace(
        "  - {name: http, port: 80, nodePort: 30080}\n",
        "  - {name: http, port: 80, nodePort: 30080}\n  - {name: https, port: 443, nodePort: 30443}\n",
    );
    let tr = translate_on_node(&two_ports);
    let of = |name: &str| -> Vec<&super::ServicePort> {
        tr.table.values().map(|f| &f.service_port).filter(|p| p.port() == name).collect()
    };
    let (http, https) = (of("http"), of("https"));
    assert!(http.len() >= 5, "ClusterIP, NodePorts, LoadBalancer and external IPs: {}", http.len());
    assert_eq!(http.len(), https.len());
    assert!(http.iter().all(|p| p.shares(http[0])) && https.iter().all(|p| p.shares(https[0])), "{http:?}");
    assert!(!http[0].shares(https[0]), "another port holds its own name");
}

/// A start's translation of thousands of services runs on two threads
/// (`state::translate_all`): it keeps object order, so the state, the
/// delta and who wins a key two services claim (one in each half) are
/// those of translating service by service.
#[test]
fn a_large_start_translated_on_two_threads_is_what_one_by_one_gives() {
    let node = NodeContext::new("n1");
    let n = 3_000;
    let mut yaml = String::new();
    for i in 0..n {
        // Services i and i + n/2 claim the same address and ports.
        let ip = i % (n / 2);
        let name = format!("s{i:04}");
        yaml += &SVC
            .replace("name: s,", &format!("name: {name},"))
            .replace("10.96.0.1", &format!("10.96.{}.{}", ip / 200, ip % 200 + 1));
        if i % 3 == 0 {
            yaml +=
                &slice(&format!("{name}-a"), PORTS, &format!("[{{addresses: [10.0.{}.{}]}}]", i / 200, i % 200 + 1))
                    .replace("kubernetes.io/service-name: s}", &format!("kubernetes.io/service-name: {name}}}"));
        }
        yaml += "---\n";
    }
    let parsed = file::parse(&yaml).expect("yaml");
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let (services, slices) = parsed.objects.inputs();
    let mut built = TableState::default();
    let got = built.replace_all(&services, &slices, &node);
    // The same inputs, grouped as `replace_all` groups them.
    let inputs = super::state::group_inputs(std::iter::empty(), &services, &slices);
    let mut updated = TableState::default();
    let want = updated.update(inputs, &node);
    assert_eq!(got.keys, want.keys);
    assert_eq!(got.appeared, want.appeared);
    assert_eq!(got.appeared.len(), n, "each conflict is one problem per port");
    assert_eq!(format!("{built:?}"), format!("{updated:?}"));
    // The first by name serves each shared address.
    let t = render(built.table());
    assert!(t.contains("10.96.0.1:80/TCP ns/s0000:http -> 10.0.0.1:8080\n"), "{}", &t[..400]);
    assert_eq!(built.table().len(), n, "two ports for each of n/2 addresses");
}
