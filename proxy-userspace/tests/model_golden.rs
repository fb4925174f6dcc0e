//! Objects captured from a real kube-apiserver, through the parser and the
//! model, against the expected table in a small text file.
use std::path::Path;

use ebpf_proxy::{
    model::{self, NodeContext},
    source::file,
};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

#[test]
fn real_apiserver_objects_translate_to_the_expected_table() {
    let services = file::load(&fixture("real-apiserver/services.yaml")).expect("services parse");
    let slices = file::load(&fixture("real-apiserver/endpointslices.yaml")).expect("slices parse");
    assert!(services.errors.is_empty(), "{:?}", services.errors);
    assert!(slices.errors.is_empty(), "{:?}", slices.errors);
    // The file source leaves out what kube-proxy's label selector does
    // (source/labels.rs); the model's own rule is tested in model/tests.rs.
    assert_eq!(
        services.not_proxied,
        vec![("Service shop/other-proxy".to_owned(), "service.kubernetes.io/service-proxy-name")]
    );
    assert_eq!(services.objects.services.len(), 7);
    assert_eq!(slices.objects.slices.len(), 5);

    let t = model::translate(&services.objects.services, &slices.objects.slices, &NodeContext::new("n1"));
    let expected = std::fs::read_to_string(fixture("model/real-apiserver-node-n1.txt")).unwrap();
    assert_eq!(model::render(&t.table), expected);

    let skipped: Vec<String> = t.skipped.iter().map(|(o, r)| format!("{o}: {}", r.as_str())).collect();
    assert_eq!(skipped, vec!["Service shop/db: headless (clusterIP: None)", "Service shop/ext: type ExternalName",]);
    // SCTP is served; shop/sctp has no EndpointSlice, so its frontend
    // refuses (kube-proxy's REJECT).
    assert!(t.problems.is_empty(), "{:?}", t.problems);
}

#[test]
fn node_addresses_add_node_ports_and_local_external_ips() {
    let services = file::load(&fixture("real-apiserver/services.yaml")).expect("services parse");
    let slices = file::load(&fixture("real-apiserver/endpointslices.yaml")).expect("slices parse");
    let node = NodeContext::new("n1").with_ips(vec!["192.168.1.10".parse().unwrap(), "198.51.100.7".parse().unwrap()]);
    let t = model::translate(&services.objects.services, &slices.objects.slices, &node);
    let mut got: Vec<&str> = Vec::new();
    let rendered = model::render(&t.table);
    got.extend(rendered.lines());
    let expected = std::fs::read_to_string(fixture("model/real-apiserver-node-n1-with-addresses.txt")).unwrap();
    let mut want: Vec<&str> = expected.lines().collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
}

#[test]
fn json_list_response_parses_like_yaml() {
    // A list response body (JSON is YAML) holds the same slices.
    let parsed = file::load(&fixture("real-apiserver/endpointslices-list.json")).expect("parse");
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    assert_eq!(parsed.objects.slices.len(), 5);
}
