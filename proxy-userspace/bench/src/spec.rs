//! The service set every variant serves: `n` ClusterIP services of
//! `ENDPOINTS` endpoints each. Service `s` is 10.(96+s/65536).(s/256%256).
//! (s%256):80 (in 10.96.0.0/14); its endpoint `i` is
//! 10.(128+4i+s/65536).(s/256%256).(s%256):8080, in backend namespace `i`
//! (which owns all of 10.(128+4i).0.0/14). A moved endpoint (a change) is
//! 40 higher in the second byte, outside every backend's range.
use std::{fmt::Write as _, net::Ipv4Addr};

use serde_json::{Value, json};

pub const ENDPOINTS: u8 = 10;
pub const SERVICE_PORT: u16 = 80;
pub const BACKEND_PORT: u16 = 8080;
/// Most services the address plan holds (a /14 each for the service
/// addresses and for each backend's endpoints).
pub const MAX_SERVICES: u32 = 1 << 18;

/// Second byte of the first endpoint address of backend `i`.
const ENDPOINT_BASE: u8 = 128;
/// How far a moved endpoint's second byte is from its own.
const MOVED: u8 = 40;

/// The third byte's carry into the second: `s / 65536` (below 4).
fn split(s: u32) -> (u8, u8, u8) {
    assert!(s < MAX_SERVICES, "service {s} is past the address plan ({MAX_SERVICES})");
    let [_, top, hi, lo] = s.to_be_bytes();
    (top, hi, lo)
}

#[must_use]
pub fn vip(s: u32) -> Ipv4Addr {
    let (top, hi, lo) = split(s);
    Ipv4Addr::new(10, 96 + top, hi, lo)
}

#[must_use]
pub fn endpoint(s: u32, i: u8) -> Ipv4Addr {
    let (top, hi, lo) = split(s);
    Ipv4Addr::new(10, ENDPOINT_BASE + 4 * i + top, hi, lo)
}

/// The network backend namespace `i` owns.
#[must_use]
pub fn backend_net(i: u8) -> String {
    format!("10.{}.0.0/14", ENDPOINT_BASE + 4 * i)
}

fn name(s: u32) -> String {
    format!("svc{s}")
}

/// The services and their slices as a services file for the agent.
#[must_use]
pub fn services_yaml(n: u32) -> String {
    let mut out = String::with_capacity(usize::try_from(n).unwrap_or(0) * 700);
    for s in 0..n {
        let (name, vip) = (name(s), vip(s));
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: bench}}\nspec:\n  clusterIP: {vip}\n  ports: [{{name: http, port: {SERVICE_PORT}, protocol: TCP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: bench, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: {BACKEND_PORT}, protocol: TCP}}]\nendpoints:\n"
        );
        for i in 0..ENDPOINTS {
            let _ = writeln!(out, "- {{addresses: [\"{}\"], conditions: {{ready: true}}}}", endpoint(s, i));
        }
    }
    out
}

/// The field manager of the EndpointSlice controller, which writes the
/// slices in a cluster.
pub const SLICE_MANAGER: &str = "kube-controller-manager";

/// A stand-in for the uid the API server gave service `s` (for the slices'
/// owner references: only its shape matters).
fn service_uid(s: u32) -> String {
    format!("5e7f1ce0-0000-4000-8000-{s:012}")
}

/// Service `s` as `kubectl apply` writes it (with its last-applied
/// configuration, as in tests/fixtures/real-apiserver/services.yaml).
#[must_use]
pub fn service_object(s: u32) -> Value {
    let mut service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"annotations": {}, "name": name(s), "namespace": "bench"},
        "spec": {"clusterIP": vip(s).to_string(),
                 "ports": [{"name": "http", "port": SERVICE_PORT, "protocol": "TCP", "targetPort": BACKEND_PORT}],
                 "selector": {"app": name(s)}},
    });
    let applied = format!("{service}\n");
    service["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = json!(applied);
    service
}

/// Service `s`'s EndpointSlice as the EndpointSlice controller writes it
/// (labels, trigger-time annotation, owner reference; endpoints with
/// conditions, node, zone and pod reference), with endpoint `moved` (if
/// any) on its alternative address (10.(110+i)...): a one-endpoint change.
#[must_use]
pub fn slice_object(s: u32, moved: Option<u8>) -> Value {
    let endpoints: Vec<Value> = (0..ENDPOINTS)
        .map(|i| {
            let mut addr = endpoint(s, i);
            if moved == Some(i) {
                let octets = addr.octets();
                addr = Ipv4Addr::new(octets[0], octets[1] + MOVED, octets[2], octets[3]);
            }
            json!({"addresses": [addr.to_string()],
                   "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": format!("node-{i}"), "zone": format!("zone-{}", i % 3),
                   "targetRef": {"kind": "Pod", "name": format!("{}-7d9f8c6b5-{i:05}", name(s)), "namespace": "bench",
                                 "uid": format!("0d0d0000-0000-4000-8000-{:012}", s * u32::from(ENDPOINTS) + u32::from(i))}})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{}-1", name(s)), "namespace": "bench",
                     "labels": {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                                "kubernetes.io/service-name": name(s)},
                     "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-22T00:00:00Z"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name(s), "uid": service_uid(s),
                                          "controller": true, "blockOwnerDeletion": true}]},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": BACKEND_PORT, "protocol": "TCP"}],
        "endpoints": endpoints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A YAML stream of objects through the agent's parser and model, as
    /// on node "bench".
    fn translate(text: &str) -> ebpf_proxy::model::Translation {
        let parsed = ebpf_proxy::source::file::parse(text).unwrap();
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        ebpf_proxy::model::translate(
            &parsed.objects.services,
            &parsed.objects.slices,
            &ebpf_proxy::model::NodeContext::new("bench"),
        )
    }

    #[test]
    fn addresses_follow_the_plan() {
        assert_eq!(vip(0), Ipv4Addr::new(10, 96, 0, 0));
        assert_eq!(vip(258), Ipv4Addr::new(10, 96, 1, 2));
        assert_eq!(endpoint(258, 9), Ipv4Addr::new(10, 164, 1, 2));
        // 100,000 and more: the plan holds them, each address once.
        assert_eq!(vip(100_000), Ipv4Addr::new(10, 97, 134, 160));
        assert_eq!(vip(MAX_SERVICES - 1), Ipv4Addr::new(10, 99, 255, 255));
        assert_eq!(endpoint(MAX_SERVICES - 1, 9), Ipv4Addr::new(10, 167, 255, 255));
        assert_eq!(endpoint(MAX_SERVICES - 1, 0), Ipv4Addr::new(10, 131, 255, 255));
    }

    #[test]
    fn each_endpoint_is_in_its_backends_network_and_nowhere_else() {
        /// An address range `A.B.C.D/LEN`.
        struct Net(u32, u32);
        impl Net {
            fn new(text: &str) -> Self {
                let (addr, len) = text.split_once('/').unwrap();
                let mask = u32::MAX << (32 - len.parse::<u32>().unwrap());
                Self(u32::from(addr.parse::<Ipv4Addr>().unwrap()) & mask, mask)
            }
            fn contains(&self, a: Ipv4Addr) -> bool {
                u32::from(a) & self.1 == self.0
            }
        }
        let nets: Vec<Net> = (0..ENDPOINTS).map(|i| Net::new(&backend_net(i))).collect();
        let services = Net::new("10.96.0.0/14");
        for s in [0, 258, 65_535, 65_536, 100_000, MAX_SERVICES - 1] {
            assert!(services.contains(vip(s)));
            assert!(!nets.iter().any(|n| n.contains(vip(s))), "{s}");
            for i in 0..ENDPOINTS {
                let owners: Vec<usize> = (0..nets.len()).filter(|k| nets[*k].contains(endpoint(s, i))).collect();
                assert_eq!(owners, vec![usize::from(i)], "service {s} endpoint {i}");
                let [a, b, c, d] = endpoint(s, i).octets();
                let moved = Ipv4Addr::new(a, b + MOVED, c, d);
                assert!(!nets.iter().any(|n| n.contains(moved)) && !services.contains(moved), "{moved}");
            }
        }
    }

    #[test]
    fn the_services_file_parses_into_n_services_of_ten_endpoints() {
        let t = translate(&services_yaml(3));
        assert_eq!(t.table.len(), 3);
        assert!(t.table.values().all(|f| f.backends.len() == usize::from(ENDPOINTS)));
    }

    #[test]
    fn the_objects_as_the_api_server_serves_them_translate_into_the_plan() {
        // Written as kubectl and the EndpointSlice controller write them,
        // served with everything the server adds (managed fields and all).
        let server = proxy_testkit::TestApiServer::start();
        server.put_by(SLICE_MANAGER, slice_object(258, None));
        // The slice replaced (a one-endpoint change), as the server keeps it.
        let objects = [server.put(service_object(258)), server.put_by(SLICE_MANAGER, slice_object(258, Some(3)))];
        assert!(objects.iter().all(|o| o.pointer("/metadata/managedFields/0/fieldsV1").is_some()));
        assert_eq!(objects[1]["metadata"]["generation"], 2);
        let stream = objects.iter().fold(String::new(), |mut out, o| {
            let _ = write!(out, "---\n{o}\n");
            out
        });
        let t = translate(&stream);
        assert_eq!(t.table.len(), 1);
        let frontend = t.table.values().next().unwrap();
        assert_eq!(frontend.backends.len(), usize::from(ENDPOINTS));
        let moved = Ipv4Addr::new(10, 128 + 12 + MOVED, 1, 2);
        assert!(format!("{:?}", frontend.backends).contains(&moved.to_string()), "the replaced slice counts");
    }
}
