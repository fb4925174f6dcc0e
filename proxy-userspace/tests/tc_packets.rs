//! The TC programs on crafted packets (`BPF_PROG_TEST_RUN`): the real
//! object, loaded and filled by the real loader and reconciler from
//! Services and EndpointSlices, run on frames built here; every rewrite is
//! checked byte by byte and every checksum recomputed from scratch. The
//! runs happen inside a test namespace whose device and routes make the
//! programs' route lookups (source NAT, forwarding) real. The XDP program
//! (`--nodeport-acceleration`) runs on the same frames and must give the
//! same answers, finishing what it can itself and passing the rest to TC.
mod common;

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
};

use aya::programs::{TestRun, TestRunOptions, TestRunResult};
use common::packet::{self, ACK, ACK_NUMBER, FIN, RST, SEQ_NUMBER, SYN, Seen, TcpSeen};
use ebpf_proxy::{
    datapath::{
        acceleration::Acceleration,
        counters::ExternalStats,
        handover::OutsideHandover,
        loader::{Datapath, DsrDispatch, LoadOptions, NodePortMode},
    },
    model::{self, NodeContext},
    reconcile::Reconciler,
    source::file,
};
use proxy_testkit::{BpfFs, NetNs, unique_name};

/// `TC_ACT_OK`, `TC_ACT_SHOT`, `TC_ACT_REDIRECT` (linux/pkt_cls.h).
const OK: i32 = 0;
const SHOT: i32 = 2;
const REDIRECT: i32 = 7;
/// `XDP_DROP`, `XDP_PASS`, `XDP_TX`, `XDP_REDIRECT` (linux/bpf.h).
const XDP_DROP: i32 = 1;
const XDP_PASS: i32 = 2;
const XDP_TX: i32 = 3;
const XDP_REDIRECT: i32 = 4;

/// ext0's link-layer address, and n2's (172.30.0.12, fd00:30::12): a
/// permanent neighbour entry, so XDP can send to n2 itself. The gateway
/// 172.30.0.1 has none: XDP leaves packets to it to TC.
const EXT0_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x11];
const N2_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x12];

/// This node: n1, 172.30.0.11 and fd00:30::11 on ext0; the pods of n2 are
/// routed via 172.30.0.12 / fd00:30::12.
const NODE_IP: &str = "172.30.0.11";
const NODE_IP6: &str = "fd00:30::11";

/// Services on this node: NodePort `web` (TCP, backend on this node, and
/// IPv6 too), LoadBalancer `dns` (UDP, backend on n2, source ranges),
/// NodePort `lonely` (externalTrafficPolicy Local, no endpoint here),
/// LoadBalancer `spread` (four backends on n2), ClusterIP `inside`, and
/// LoadBalancer `empty` (TCP and UDP, both families, an externalIP, no
/// endpoint anywhere).
const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  ipFamilies: [IPv4, IPv6]
  ports: [{name: http, port: 80, nodePort: 30080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-4, namespace: t, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["10.244.1.5"], nodeName: n1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-6, namespace: t, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["fd00:244:1::5"], nodeName: n1}]
---
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: t}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.53
  loadBalancerSourceRanges: [198.51.100.0/24]
  ports: [{name: dns, port: 53, nodePort: 30053, protocol: UDP}]
status: {loadBalancer: {ingress: [{ip: 203.0.113.53}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: t, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, port: 5353, protocol: UDP}]
endpoints: [{addresses: ["10.244.2.7"], nodeName: n2}]
---
apiVersion: v1
kind: Service
metadata: {name: lonely, namespace: t}
spec:
  type: NodePort
  clusterIP: 10.96.0.20
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30090, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lonely-1, namespace: t, labels: {kubernetes.io/service-name: lonely}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["10.244.2.9"], nodeName: n2}]
---
apiVersion: v1
kind: Service
metadata: {name: spread, namespace: t}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.30
  ports: [{name: http, port: 80, nodePort: 30030, protocol: TCP}]
status: {loadBalancer: {ingress: [{ip: 203.0.113.30}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: spread-1, namespace: t, labels: {kubernetes.io/service-name: spread}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: ["10.244.2.21"], nodeName: n2}
- {addresses: ["10.244.2.22"], nodeName: n2}
- {addresses: ["10.244.2.23"], nodeName: n2}
- {addresses: ["10.244.2.24"], nodeName: n2}
---
apiVersion: v1
kind: Service
metadata: {name: inside, namespace: t}
spec:
  clusterIP: 10.96.0.40
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: inside-1, namespace: t, labels: {kubernetes.io/service-name: inside}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["10.244.1.6"], nodeName: n1}]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: t}
spec:
  type: LoadBalancer
  externalIPs: [198.51.100.50]
  clusterIP: 10.96.0.50
  clusterIPs: [10.96.0.50, "fd00:96::50"]
  ipFamilies: [IPv4, IPv6]
  ports:
  - {name: http, port: 80, nodePort: 30050, protocol: TCP}
  - {name: dns, port: 53, nodePort: 30051, protocol: UDP}
status: {loadBalancer: {ingress: [{ip: 203.0.113.50}]}}
"#;

fn sa(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// A network namespace with the node's device `ext0` (veth to `ext1`),
/// its addresses, routes to n2's pods, and forwarding on.
struct Lab {
    ns: NetNs,
    ifindex: u32,
    /// `--dsr-dispatch` of the nodes it loads.
    dispatch: DsrDispatch,
}

impl Lab {
    fn new() -> Self {
        common::assert_root();
        let ns = NetNs::create(&unique_name("ebpf-proxy-tcpkt")).unwrap();
        for args in [
            &["link", "add", "ext0", "type", "veth", "peer", "name", "ext1"][..],
            &["link", "set", "ext0", "address", "02:00:00:00:00:11"],
            &["link", "set", "ext0", "up"],
            &["link", "set", "ext1", "up"],
            &["addr", "add", "172.30.0.11/24", "dev", "ext0"],
            &["addr", "add", "fd00:30::11/64", "dev", "ext0", "nodad"],
            &["route", "add", "10.244.2.0/24", "via", "172.30.0.12", "dev", "ext0"],
            &["route", "add", "fd00:244:2::/64", "via", "fd00:30::12", "dev", "ext0"],
            &["route", "add", "198.51.100.0/24", "via", "172.30.0.1", "dev", "ext0"],
            &["route", "add", "192.0.2.0/24", "via", "172.30.0.1", "dev", "ext0"],
            &["neigh", "add", "172.30.0.12", "lladdr", "02:00:00:00:00:12", "dev", "ext0", "nud", "permanent"],
            &["neigh", "add", "fd00:30::12", "lladdr", "02:00:00:00:00:12", "dev", "ext0", "nud", "permanent"],
        ] {
            ns.ip(args).unwrap();
        }
        let sysctl = |key: &str| {
            proxy_testkit::sh("ip", &["netns", "exec", ns.name(), "sysctl", "-qw", &format!("{key}=1")]).unwrap();
        };
        sysctl("net.ipv4.ip_forward");
        sysctl("net.ipv6.conf.all.forwarding");
        let ifindex = ns.run_inside(|| nix::net::if_::if_nametoindex("ext0").unwrap()).unwrap();
        Self { ns, ifindex, dispatch: DsrDispatch::Option }
    }

    /// Nodes loaded with `--dsr-dispatch` `dispatch`.
    fn with_dispatch(mut self, dispatch: DsrDispatch) -> Self {
        self.dispatch = dispatch;
        self
    }

    /// Runs `f` with a datapath for node `n1` (addresses `node_ips`) filled
    /// from `yaml`, inside the namespace.
    fn with_node<T: Send + 'static>(
        &self,
        yaml: &'static str,
        node_ips: &[&str],
        f: impl FnOnce(&mut Node) -> T + Send + 'static,
    ) -> T {
        self.with_node_ct(yaml, node_ips, 4096, NodePortMode::Snat, f)
    }

    /// `with_node` with `--nodeport-mode` `mode`.
    fn with_node_mode<T: Send + 'static>(
        &self,
        yaml: &'static str,
        node_ips: &[&str],
        mode: NodePortMode,
        f: impl FnOnce(&mut Node) -> T + Send + 'static,
    ) -> T {
        self.with_node_ct(yaml, node_ips, 4096, mode, f)
    }

    /// `with_node` with a `CT` map of `ct_map_size` entries and `mode`.
    fn with_node_ct<T: Send + 'static>(
        &self,
        yaml: &'static str,
        node_ips: &[&str],
        ct_map_size: u32,
        mode: NodePortMode,
        f: impl FnOnce(&mut Node) -> T + Send + 'static,
    ) -> T {
        self.with_node_full(yaml, node_ips, ct_map_size, mode, &[], f)
    }

    /// `with_node` with `--cluster-cidr` `cidrs`.
    fn with_node_cidrs<T: Send + 'static>(
        &self,
        yaml: &'static str,
        node_ips: &[&str],
        cidrs: &[&str],
        f: impl FnOnce(&mut Node) -> T + Send + 'static,
    ) -> T {
        self.with_node_full(yaml, node_ips, 4096, NodePortMode::Snat, cidrs, f)
    }

    fn with_node_full<T: Send + 'static>(
        &self,
        yaml: &'static str,
        node_ips: &[&str],
        ct_map_size: u32,
        mode: NodePortMode,
        cidrs: &[&str],
        f: impl FnOnce(&mut Node) -> T + Send + 'static,
    ) -> T {
        let bpffs = BpfFs::mount_temp(&unique_name("ebpf-proxy-tcpkt-fs")).unwrap();
        let pin_dir = bpffs.path().join("ebpf-proxy");
        let ips: Vec<IpAddr> = node_ips.iter().map(|ip| ip.parse().unwrap()).collect();
        let cidrs: Vec<ipnet::IpNet> = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        let (ifindex, dispatch) = (self.ifindex, self.dispatch);
        let out = self
            .ns
            .run_inside(move || {
                let mut node = Node::load(&pin_dir, yaml, ips, ifindex, (ct_map_size, mode, dispatch), cidrs);
                f(&mut node)
            })
            .expect("the test body panicked (see its message above)");
        drop(bpffs);
        out
    }
}

struct Node {
    datapath: Datapath,
    reconciler: Reconciler,
    ifindex: u32,
    context: NodeContext,
    stats: ExternalStats,
}

impl Node {
    fn load(
        pin_dir: &Path,
        yaml: &str,
        ips: Vec<IpAddr>,
        ifindex: u32,
        (ct_map_size, mode, dsr_dispatch): (u32, NodePortMode, DsrDispatch),
        cluster_cidrs: Vec<ipnet::IpNet>,
    ) -> Self {
        let _ = tracing_subscriber::fmt().with_test_writer().try_init();
        let mut datapath = Datapath::load(&LoadOptions {
            pin_dir: pin_dir.to_owned(),
            // Not attached: the programs only run on crafted packets here.
            cgroup: "/nonexistent".into(),
            bpf_log: false,
            services_map_size: 4096,
            backends_map_size: 4096,
            maglev_size: 1021,
            ct_map_size,
            ct_map_grows: false,
            // Loads the XDP program too (nothing is attached here).
            acceleration: Acceleration::Native,
            outside_handover: OutsideHandover::Off,
            nodeport_mode: mode,
            dsr_dispatch,
            socket_lb: ebpf_proxy::datapath::loader::SocketLb::All,
            cluster_cidrs,
        })
        .unwrap();
        assert!(datapath.serves_external_traffic(), "the TC programs did not load");
        // As the agent does once it attached the TC programs to a device.
        datapath.set_tail_calls().unwrap();
        let stats = datapath.external_stats.take().unwrap();
        let (reconciler, _) = Reconciler::recover(&mut datapath.maps).unwrap();
        let mut node = Self { datapath, reconciler, ifindex, context: NodeContext::new("n1").with_ips(ips), stats };
        node.apply(yaml);
        node
    }

    fn apply(&mut self, yaml: &str) {
        let parsed = file::parse(yaml).unwrap();
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let t = model::translate(&parsed.objects.services, &parsed.objects.slices, &self.context);
        let report = self.reconciler.apply(&mut self.datapath.maps, &t.table);
        assert!(report.failures.is_empty(), "{report:?}");
    }

    /// Runs program `name` on `frame` arriving on (or leaving by) ext0.
    fn run(&self, name: &str, frame: &[u8]) -> (i32, Vec<u8>) {
        let program = self.datapath.tc_program(name).unwrap();
        // `struct __sk_buff` up to `ifindex` (offset 40): the device.
        let mut ctx = [0u8; 44];
        ctx[40..44].copy_from_slice(&self.ifindex.to_ne_bytes());
        test_run(program, frame, &ctx)
    }

    fn ingress(&self, frame: &[u8]) -> (i32, Vec<u8>) {
        self.run("nodeport_ingress", frame)
    }

    /// Runs the XDP program on `frame` arriving on ext0.
    fn xdp(&self, frame: &[u8]) -> (i32, Vec<u8>) {
        let program = self.datapath.xdp_program().expect("the XDP program did not load");
        // `struct xdp_md`: data, data_end, data_meta, ingress_ifindex,
        // rx_queue_index, egress_ifindex.
        let mut ctx = [0u8; 24];
        ctx[4..8].copy_from_slice(&u32::try_from(frame.len()).unwrap().to_ne_bytes());
        ctx[12..16].copy_from_slice(&self.ifindex.to_ne_bytes());
        test_run(program, frame, &ctx)
    }

    fn egress(&self, frame: &[u8]) -> (i32, Vec<u8>) {
        self.run("nodeport_egress", frame)
    }

    fn stat(&self, name: &str) -> u64 {
        self.stats.read().unwrap().into_iter().find(|(n, _)| *n == name).unwrap().1
    }

    /// The per-packet programs of a pod-facing device (here ext0): a
    /// pod's packet arriving from it, and one leaving into it.
    fn pod_ingress(&self, frame: &[u8]) -> (i32, Vec<u8>) {
        self.run("pod_ingress", frame)
    }

    fn pod_egress(&self, frame: &[u8]) -> (i32, Vec<u8>) {
        self.run("pod_egress", frame)
    }

    fn pod_stat(&self, name: &str) -> u64 {
        self.stats.read_pods().unwrap().into_iter().find(|(n, _)| *n == name).unwrap().1
    }
}

#[test]
fn crafted_frames_have_valid_checksums() {
    for (s, d) in [("10.0.0.1:1234", "10.0.0.2:80"), ("[fd00::1]:1234", "[fd00::2]:80")] {
        let (s, d) = (sa(s), sa(d));
        let seen = packet::parse(&packet::frame(s, d, Some(SYN), b""));
        assert_eq!((seen.src, seen.dst, seen.proto), (s, d, packet::TCP));
        let seen = packet::parse(&packet::frame(s, d, None, b"hello"));
        assert_eq!((seen.src, seen.dst, seen.proto), (s, d, packet::UDP));
    }
}

#[test]
fn a_node_port_flow_to_a_local_backend_keeps_the_client_and_its_reply_shows_the_frontend() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP, NODE_IP6], |node| {
        let client = sa("192.0.2.7:40000");
        let frontend = sa("172.30.0.11:30080");
        let (action, out) = node.ingress(&packet::frame(client, frontend, Some(SYN), b""));
        assert_eq!(action, OK, "a local backend: the stack delivers it");
        let seen = packet::parse(&out);
        assert_eq!((seen.src, seen.dst), (client, sa("10.244.1.5:8080")), "DNAT only, the client's address kept");
        assert_eq!(seen.ttl, 64, "the stack forwards it and decrements the TTL itself");

        // Later packets of the flow go the same way.
        let (action, out) = node.ingress(&packet::frame(client, frontend, Some(ACK), b"GET / HTTP/1.1\r\n\r\n"));
        assert_eq!((action, packet::parse(&out).dst), (OK, sa("10.244.1.5:8080")));

        // The backend's reply leaves with the frontend as its source.
        let (action, out) = node.egress(&packet::frame(sa("10.244.1.5:8080"), client, Some(SYN | ACK), b""));
        assert_eq!(action, OK);
        assert_eq!((packet::parse(&out).src, packet::parse(&out).dst), (frontend, client));
        assert_eq!(node.stat("new_flow"), 1);
    });
}

#[test]
fn ipv6_node_port_flows_are_translated_with_valid_checksums() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP, NODE_IP6], |node| {
        let client = sa("[fd00:30::99]:40000");
        let frontend = sa("[fd00:30::11]:30080");
        let (action, out) = node.ingress(&packet::frame(client, frontend, Some(SYN), b""));
        assert_eq!(action, OK);
        let seen = packet::parse(&out);
        assert_eq!((seen.src, seen.dst), (client, sa("[fd00:244:1::5]:8080")));
        let (_, out) = node.egress(&packet::frame(sa("[fd00:244:1::5]:8080"), client, Some(SYN | ACK), b"x"));
        assert_eq!(packet::parse(&out).src, frontend);
    });
}

#[test]
fn a_flow_to_a_remote_backend_is_source_natted_routed_and_its_reply_comes_back() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        let client = sa("198.51.100.20:5000");
        let frontend = sa("203.0.113.53:53");
        let (action, out) = node.ingress(&packet::frame(client, frontend, None, b"query"));
        assert_eq!(action, REDIRECT, "routed by the program: the stack would drop a local source as martian");
        let seen = packet::parse(&out);
        assert_eq!(seen.dst, sa("10.244.2.7:5353"));
        assert_eq!(seen.src.ip(), NODE_IP.parse::<IpAddr>().unwrap(), "the node's address on the way");
        let nat_port = seen.src.port();
        assert!(nat_port >= proxy_common::snat_ports::MIN, "SNAT port {nat_port}");
        assert_eq!(seen.ttl, 63, "forwarded: the TTL goes down");

        // The same flow keeps its SNAT port.
        let (_, again) = node.ingress(&packet::frame(client, frontend, None, b"query2"));
        assert_eq!(packet::parse(&again).src, seen.src);

        // The reply to the node's address goes back to the client, from the
        // frontend.
        let (action, out) = node.ingress(&packet::frame(sa("10.244.2.7:5353"), seen.src, None, b"answer"));
        assert_eq!(action, REDIRECT);
        let back = packet::parse(&out);
        assert_eq!((back.src, back.dst, back.ttl), (frontend, client, 63));
    });
}

#[test]
fn a_udp_datagram_without_checksum_keeps_none() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        let frame = packet::udp4_without_checksum(sa("198.51.100.20:5001"), sa("203.0.113.53:53"), b"q");
        let (action, out) = node.ingress(&frame);
        assert_eq!(action, REDIRECT);
        let seen = packet::parse(&out);
        assert!(seen.udp_checksum_zero, "a UDP checksum of 0 means none and must stay 0");
        assert_eq!(seen.dst, sa("10.244.2.7:5353"));
    });
}

#[test]
fn source_ranges_drop_other_sources() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        let frontend = sa("203.0.113.53:53");
        let (action, _) = node.ingress(&packet::frame(sa("192.0.2.7:5000"), frontend, None, b"q"));
        assert_eq!(action, SHOT, "192.0.2.7 is not in 198.51.100.0/24");
        assert_eq!(node.stat("source_denied"), 1);
        let (action, _) = node.ingress(&packet::frame(sa("198.51.100.9:5000"), frontend, None, b"q"));
        assert_eq!(action, REDIRECT, "198.51.100.9 is");
        // The NodePort of the same LoadBalancer service is restricted too.
        let (action, _) = node.ingress(&packet::frame(sa("192.0.2.7:5000"), sa("172.30.0.11:30053"), None, b"q"));
        assert_eq!(action, SHOT);
        assert_eq!(node.stat("source_denied"), 2);
    });
}

#[test]
fn external_traffic_policy_local_without_a_local_endpoint_drops() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        let (action, _) = node.ingress(&packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:30090"), Some(SYN), b""));
        assert_eq!(action, SHOT);
        assert_eq!(node.stat("no_backend"), 1);
    });
}

#[test]
fn what_is_not_an_external_frontend_is_left_alone() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        for (dst, what) in [
            ("172.30.0.11:22", "another port of the node"),
            ("10.96.0.40:80", "a ClusterIP (traffic from outside does not reach it)"),
            ("10.244.2.7:5353", "a pod address"),
        ] {
            let frame = packet::frame(sa("192.0.2.7:40000"), sa(dst), Some(SYN), b"");
            let (action, out) = node.ingress(&frame);
            assert_eq!((action, out), (OK, frame.clone()), "{what} was changed");
        }
        // An IPv4 fragment has no ports to translate.
        let mut fragment = packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:30080"), Some(SYN), b"");
        fragment[14 + 6] |= 0x20; // more fragments
        let (action, out) = node.ingress(&fragment);
        assert_eq!((action, out), (OK, fragment));
        assert_eq!(node.stat("new_flow"), 0);
    });
}

#[test]
fn a_flow_keeps_its_backend_when_another_is_added_and_a_closed_one_starts_afresh() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        let frontend = sa("203.0.113.30:80");
        let backend_of = |node: &Node, client: SocketAddr, flags: u8| -> Seen {
            let (action, out) = node.ingress(&packet::frame(client, frontend, Some(flags), b""));
            assert_eq!(action, REDIRECT);
            packet::parse(&out)
        };
        let clients: Vec<SocketAddr> =
            (0..40).map(|i| SocketAddr::new("192.0.2.7".parse().unwrap(), 41_000 + i)).collect();
        let before: Vec<SocketAddr> = clients.iter().map(|c| backend_of(node, *c, SYN).dst).collect();
        let distinct: std::collections::BTreeSet<_> = before.iter().collect();
        assert!(distinct.len() >= 3, "40 flows used only {distinct:?}");

        node.apply(&SERVICES.replace(
            "- {addresses: [\"10.244.2.24\"], nodeName: n2}",
            "- {addresses: [\"10.244.2.24\"], nodeName: n2}\n- {addresses: [\"10.244.2.25\"], nodeName: n2}",
        ));
        // Established flows stay where they are.
        let after: Vec<SocketAddr> = clients.iter().map(|c| backend_of(node, *c, ACK).dst).collect();
        assert_eq!(after, before, "a flow moved when a backend was added");
        // A closed flow's tuple, opened again, picks anew (with the fifth
        // backend now in the table, some pick it).
        for c in &clients {
            let _ = backend_of(node, *c, FIN | ACK);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        let again: Vec<SocketAddr> = clients.iter().map(|c| backend_of(node, *c, SYN).dst).collect();
        let moved: Vec<_> = before.iter().zip(&again).filter(|(b, a)| b != a).map(|(_, a)| *a).collect();
        assert!(!moved.is_empty(), "no reopened flow picked the new backend");
        assert!(moved.iter().all(|a| *a == sa("10.244.2.25:8080")), "flows moved between old backends: {moved:?}");
    });
}

/// Active connections of every backend (`ACTIVE_CONNS`).
fn active_connections(node: &Node) -> u64 {
    (0..4096).map(|id| node.datapath.active.get(id)).sum()
}

/// Makes every `CT` entry a closed flow's (`CLOSING`, 10 s to live)
/// unused since the clock started: expired (a TCP flow's open lifetime,
/// 6 h, may be longer than the machine has been up).
fn age_ct(node: &Node) {
    use proxy_common::{CtKey, CtValue};
    let path = node.datapath.maps_dir().join(proxy_common::map_names::CT);
    let data = aya::maps::MapData::from_pin(&path).unwrap();
    let mut ct: aya::maps::HashMap<_, CtKey, CtValue> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(data)).unwrap();
    let entries: Vec<(CtKey, CtValue)> = ct.iter().map(Result::unwrap).collect();
    for (key, value) in entries {
        let flags = value.flags | proxy_common::ct_flags::CLOSING;
        ct.insert(key, CtValue { last_seen_ns: 1, flags, ..value }, 0).unwrap();
    }
}

/// A new flow from outside counts as an active connection of its backend
/// once, for as long as its entry lives: more packets count nothing, a new
/// connection on a closing flow's tuple ends the old one's count, and an
/// expired entry's count is taken back once, by the first packet that
/// finds it or else by the agent's sweep.
#[test]
fn flows_from_outside_count_while_their_entries_live() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        let frontend = sa("203.0.113.30:80");
        let send = |node: &Node, client: SocketAddr, flags: u8| {
            let (action, _) = node.ingress(&packet::frame(client, frontend, Some(flags), b""));
            assert_eq!(action, REDIRECT);
        };
        assert_eq!(active_connections(node), 0);
        let clients: Vec<SocketAddr> =
            (0..20).map(|i| SocketAddr::new("192.0.2.8".parse().unwrap(), 42_000 + i)).collect();
        for c in &clients {
            send(node, *c, SYN);
        }
        assert_eq!(active_connections(node), 20, "one count per new flow");
        for c in &clients {
            send(node, *c, ACK);
        }
        assert_eq!(active_connections(node), 20, "packets of known flows counted again");
        send(node, clients[0], FIN | ACK);
        send(node, clients[0], SYN);
        assert_eq!(active_connections(node), 20, "a new connection on a closing tuple");
        age_ct(node);
        // A new connection on an expired flow's tuple: the old count is
        // taken back, the new one counted.
        send(node, clients[1], SYN);
        assert_eq!(active_connections(node), 20);
        assert_eq!(node.datapath.sweep_ended_flows().unwrap().taken, 19, "the sweep took back the others");
        assert_eq!(active_connections(node), 1, "only the renewed flow is live");
        assert_eq!(node.datapath.sweep_ended_flows().unwrap().taken, 0, "a count taken back twice");
        assert_eq!(active_connections(node), 1);
    });
}

/// `spread` with `lb-algorithm: least-connections` and only the backends
/// `ips` of its four.
fn spread_by_load(ips: &[&str]) -> String {
    let all = ["10.244.2.21", "10.244.2.22", "10.244.2.23", "10.244.2.24"];
    let mut yaml = SERVICES.replace(
        "metadata: {name: spread, namespace: t}",
        "metadata: {name: spread, namespace: t, annotations: {ebpf-proxy.io/lb-algorithm: least-connections}}",
    );
    for ip in all.iter().filter(|ip| !ips.contains(ip)) {
        yaml = yaml.replace(&format!("- {{addresses: [\"{ip}\"], nodeName: n2}}\n"), "");
    }
    yaml
}

/// A `least-connections` frontend sends new flows from outside away from a
/// backend holding many: ten flows open to backend .21 while it is alone,
/// then none of 18 new ones with all four (each other backend stays below
/// ten, so .21 always loses the comparison).
#[test]
fn least_connections_from_outside_avoids_a_loaded_backend() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        let frontend = sa("203.0.113.30:80");
        let open = |node: &Node, i: u16| -> SocketAddr {
            let client = SocketAddr::new("192.0.2.9".parse().unwrap(), 43_000 + i);
            let (action, out) = node.ingress(&packet::frame(client, frontend, Some(SYN), b""));
            assert_eq!(action, REDIRECT);
            packet::parse(&out).dst
        };
        node.apply(&spread_by_load(&["10.244.2.21"]));
        for i in 0..10 {
            assert_eq!(open(node, i), sa("10.244.2.21:8080"));
        }
        node.apply(&spread_by_load(&["10.244.2.21", "10.244.2.22", "10.244.2.23", "10.244.2.24"]));
        let to: Vec<SocketAddr> = (10..28).map(|i| open(node, i)).collect();
        assert!(!to.contains(&sa("10.244.2.21:8080")), "a new flow went to the loaded backend: {to:?}");
        assert_eq!(active_connections(node), 28);
    });
}

/// One NodePort service with one backend, on n2: every flow from outside
/// is source-NATed to it, from `snat_ports` (4,536 ports).
const BUSY: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: busy, namespace: t}
spec:
  type: NodePort
  clusterIP: 10.96.0.60
  ports: [{name: http, port: 80, nodePort: 30100, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: busy-1, namespace: t, labels: {kubernetes.io/service-name: busy}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["10.244.2.31"], nodeName: n2}]
"#;

/// Flows from outside to `busy`, each from its own client, and the SNAT
/// port each got.
struct BusyFlows {
    next_client: u32,
}

impl BusyFlows {
    const FRONTEND: &str = "172.30.0.11:30100";
    const BACKEND: &str = "10.244.2.31:8080";

    fn client(&mut self) -> SocketAddr {
        let n = self.next_client;
        self.next_client += 1;
        let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(192, 0, 2, 0)) + n / 50_000);
        SocketAddr::new(ip.into(), u16::try_from(10_000 + n % 50_000).unwrap())
    }

    /// Opens a flow from a new client: its client and SNAT address, or
    /// `None` when it was dropped.
    fn open(&mut self, node: &Node) -> Option<(SocketAddr, SocketAddr)> {
        let client = self.client();
        let (action, out) = node.ingress(&packet::frame(client, sa(Self::FRONTEND), Some(SYN), b""));
        if action == SHOT {
            return None;
        }
        assert_eq!(action, REDIRECT);
        let seen = packet::parse(&out);
        assert_eq!(seen.dst, sa(Self::BACKEND));
        Some((client, seen.src))
    }

    /// Opens `count` flows; every one must get a port.
    fn open_all(&mut self, node: &Node, count: usize, what: &str) -> Vec<(SocketAddr, SocketAddr)> {
        let flows: Vec<_> = (0..count).map_while(|_| self.open(node)).collect();
        assert_eq!(flows.len(), count, "{what}: only {} of {count} new flows got a SNAT port", flows.len());
        flows
    }

    /// The client sends `flags` on its flow.
    fn from_client(node: &Node, (client, _): (SocketAddr, SocketAddr), flags: u8) {
        let (action, _) = node.ingress(&packet::frame(client, sa(Self::FRONTEND), Some(flags), b""));
        assert_eq!(action, REDIRECT);
    }

    /// The backend sends `flags` to the flow's SNAT address: where the
    /// node sends it (the client it translates to).
    fn from_backend(node: &Node, (_, nat): (SocketAddr, SocketAddr), flags: u8) -> SocketAddr {
        let (action, out) = node.ingress(&packet::frame(sa(Self::BACKEND), nat, Some(flags), b""));
        assert_eq!(action, REDIRECT, "the reply to {nat} was not translated");
        packet::parse(&out).dst
    }

    /// Every flow's replies still reach its own client: no other flow took
    /// its SNAT port.
    fn assert_ports_kept(node: &Node, flows: &[(SocketAddr, SocketAddr)], what: &str) {
        for &(client, nat) in flows {
            assert_eq!(Self::from_backend(node, (client, nat), ACK), client, "{what}: the port {nat} was taken");
        }
    }
}

/// Busy NodePort, one remote backend: a closed flow gives its SNAT port
/// back (an RST at once, both FINs after a short grace), so ports do not
/// run out at a high rate of short connections; a live or half-closed
/// flow's port is never taken. Linux conntrack (kube-proxy's masquerade)
/// lets a new SYN take over a tuple in CLOSE or TIME_WAIT
/// (`nf_conntrack_proto_tcp.c`); it keeps established and half-closed
/// ones.
#[test]
fn closed_flows_give_their_snat_ports_back_and_live_ones_keep_theirs() {
    use proxy_common::{ct_lifetime, snat_ports};
    common::require_root!();
    Lab::new().with_node_ct(BUSY, &[NODE_IP], 65_536, NodePortMode::Snat, |node| {
        let ports = usize::from(snat_ports::MAX - snat_ports::MIN) + 1;
        let mut busy = BusyFlows { next_client: 0 };
        // Live flows until the ports run out: each a port of its own.
        let mut live = Vec::new();
        while let Some(flow) = busy.open(node) {
            live.push(flow);
            assert!(live.len() <= ports, "more flows than ports");
        }
        assert_eq!(node.stat("no_snat_port"), 1);
        let distinct: std::collections::BTreeSet<_> = live.iter().map(|(_, nat)| *nat).collect();
        assert_eq!(distinct.len(), live.len(), "two live flows share a SNAT port");
        assert!(live.len() > ports * 3 / 4, "ports ran out at {} of {ports}", live.len());
        BusyFlows::assert_ports_kept(node, &live, "live");

        // Reset by the client: their ports are free at once (before, they
        // were held for ct_lifetime::TCP_CLOSING, 10 s, and new flows were
        // dropped).
        for &flow in &live {
            BusyFlows::from_client(node, flow, RST | ACK);
        }
        let count = live.len() * 3 / 5;
        let after_rst = busy.open_all(node, count, "after RST");

        // Closed by both ends' FINs: free after the grace.
        for &flow in &after_rst {
            BusyFlows::from_client(node, flow, FIN | ACK);
            assert_eq!(BusyFlows::from_backend(node, flow, FIN | ACK), flow.0);
        }
        std::thread::sleep(std::time::Duration::from_secs(ct_lifetime::TCP_PORT_AFTER_FINS + 1));
        let after_fin = busy.open_all(node, count, "after both FINs");

        // Half-closed (the client's FIN only): the backend may still send,
        // so the ports stay held past the grace, while new flows take the
        // free ones until none is left.
        for &flow in &after_fin {
            BusyFlows::from_client(node, flow, FIN | ACK);
        }
        std::thread::sleep(std::time::Duration::from_secs(ct_lifetime::TCP_PORT_AFTER_FINS + 1));
        let mut more = Vec::new();
        while let Some(flow) = busy.open(node) {
            more.push(flow);
            assert!(more.len() <= ports, "more flows than ports");
        }
        assert_eq!(node.stat("no_snat_port"), 2);
        BusyFlows::assert_ports_kept(node, &after_fin, "half-closed");
        BusyFlows::assert_ports_kept(node, &more, "live");
    });
}

#[test]
fn every_node_picks_the_same_backend_for_a_flow() {
    common::require_root!();
    let lab = Lab::new();
    let pick = |node: &Node| -> Vec<SocketAddr> {
        (0..30)
            .map(|i| {
                let client = SocketAddr::new("192.0.2.7".parse().unwrap(), 42_000 + i);
                let (_, out) = node.ingress(&packet::frame(client, sa("203.0.113.30:80"), Some(SYN), b""));
                packet::parse(&out).dst
            })
            .collect()
    };
    // Two nodes: their own maps, backend ids allocated in another order (the
    // second had another service first), the same Maglev choice.
    let first = lab.with_node(SERVICES, &[NODE_IP], move |node| pick(node));
    let second = lab.with_node(SERVICES, &[NODE_IP], move |node| {
        node.apply(&SERVICES.replace("10.244.2.21", "10.244.2.99"));
        node.apply(SERVICES);
        pick(node)
    });
    assert_eq!(first, second);
}

/// The reply's Ethernet addresses are the packet's, swapped: it goes back
/// to the neighbour the packet came from.
fn assert_sent_back(frame: &[u8], reply: &[u8]) {
    assert_eq!((&reply[..6], &reply[6..12]), (&frame[6..12], &frame[..6]), "Ethernet addresses not swapped");
}

/// kube-proxy rejects traffic from outside to a service without endpoints
/// (KUBE-EXTERNAL-SERVICES, pkg/proxy/iptables/proxier.go: "-j REJECT"
/// when `!hasEndpoints`); here a TCP reset (RFC 9293 3.10.7.1: a segment
/// without ACK is acknowledged, one with ACK gives the reset its number)
/// and ICMP/ICMPv6 port unreachable for UDP, quoting the datagram's IP and
/// UDP headers. Every checksum is recomputed from scratch by the parser.
#[test]
fn a_frontend_without_endpoints_is_answered_with_a_reset_or_a_port_unreachable() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP, NODE_IP6], |node| {
        for (client, frontend) in
            [("192.0.2.7:40000", "172.30.0.11:30050"), ("[fd00:30::99]:40000", "[fd00:30::11]:30050")]
        {
            let (client, frontend) = (sa(client), sa(frontend));
            let syn = packet::frame(client, frontend, Some(SYN), b"");
            let (action, out) = node.ingress(&syn);
            assert_eq!(action, REDIRECT, "sent back out of the device it came in on");
            assert_sent_back(&syn, &out);
            let reset = packet::parse(&out);
            assert_eq!((reset.src, reset.dst, reset.proto, reset.ttl), (frontend, client, packet::TCP, 64));
            let expected = TcpSeen { flags: RST | ACK, seq: 0, ack: SEQ_NUMBER + 1, header_len: 20, data_len: 0 };
            assert_eq!(reset.tcp, Some(expected), "a SYN's reset acknowledges the SYN");

            // A segment of a connection the node does not know (its
            // endpoints left): the reset takes the segment's ACK number.
            let data = packet::frame(client, frontend, Some(ACK), b"GET / HTTP/1.1\r\n\r\n");
            let (action, out) = node.ingress(&data);
            assert_eq!(action, REDIRECT);
            let reset = packet::parse(&out);
            let expected = TcpSeen { flags: RST, seq: ACK_NUMBER, ack: 0, header_len: 20, data_len: 0 };
            assert_eq!((reset.dst, reset.tcp), (client, Some(expected)));

            // Data without ACK: the reset acknowledges the data and the FIN.
            let (_, out) = node.ingress(&packet::frame(client, frontend, Some(FIN), b"12345"));
            assert_eq!(packet::parse(&out).tcp.map(|t| (t.flags, t.ack)), Some((RST | ACK, SEQ_NUMBER + 5 + 1)));

            // A reset is never answered.
            let (action, _) = node.ingress(&packet::frame(client, frontend, Some(RST), b""));
            assert_eq!(action, SHOT);
        }
        for (client, frontend, kind, header) in [
            ("192.0.2.7:5000", "172.30.0.11:30051", (3, 3), 20),
            ("[fd00:30::99]:5000", "[fd00:30::11]:30051", (1, 4), 40),
        ] {
            let (client, frontend) = (sa(client), sa(frontend));
            let query = packet::frame(client, frontend, None, b"a query of some length");
            let (action, out) = node.ingress(&query);
            assert_eq!(action, REDIRECT);
            assert_sent_back(&query, &out);
            let icmp = packet::parse_icmp(&out);
            assert_eq!((icmp.src, icmp.dst, icmp.kind), (frontend.ip(), client.ip(), kind), "port unreachable");
            assert_eq!(icmp.quoted, query[14..14 + header + 8], "quotes the IP header and the UDP header");
        }
        // Its LoadBalancer IP and externalIP alike.
        for frontend in ["203.0.113.50:80", "198.51.100.50:80"] {
            let (action, out) = node.ingress(&packet::frame(sa("192.0.2.7:40001"), sa(frontend), Some(SYN), b""));
            assert_eq!(action, REDIRECT, "{frontend}");
            assert_eq!(packet::parse(&out).src, sa(frontend), "the reset comes from {frontend}");
        }
        assert_eq!(node.stat("rejected"), 2 * 3 + 2 + 2);
        assert_eq!(node.stat("no_backend"), 2, "the resets were dropped");
        assert_eq!(node.stat("new_flow"), 0);
    });
}

/// With endpoints only on other nodes, externalTrafficPolicy: Local drops
/// (kube-proxy: "has no local endpoints", DROP, since the load balancer's
/// health check steers clients away); with no endpoint anywhere it rejects
/// like any other service (`!hasEndpoints` wins over the policy).
#[test]
fn external_traffic_policy_local_rejects_only_without_any_endpoint() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        let syn = packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:30090"), Some(SYN), b"");
        assert_eq!(node.ingress(&syn).0, SHOT, "an endpoint on n2: dropped");
        node.apply(&SERVICES.replace(r#"endpoints: [{addresses: ["10.244.2.9"], nodeName: n2}]"#, "endpoints: []"));
        let (action, out) = node.ingress(&syn);
        assert_eq!(action, REDIRECT, "no endpoint anywhere: rejected");
        assert_eq!(packet::parse(&out).tcp.map(|t| t.flags), Some(RST | ACK));
    });
}

/// Rejections cost the node a reply each: a token bucket per CPU
/// (`reject_limit`) bounds them; the rest are dropped and counted.
#[test]
fn rejections_are_rate_limited() {
    use proxy_common::reject_limit::{BURST, PER_SECOND};
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        const SENT: u64 = 3000;
        let started = std::time::Instant::now();
        let mut answered = 0u64;
        for i in 0..SENT {
            let client = SocketAddr::new("192.0.2.7".parse().unwrap(), u16::try_from(10_000 + i).unwrap());
            let (action, _) = node.ingress(&packet::frame(client, sa("172.30.0.11:30050"), Some(SYN), b""));
            if action == REDIRECT {
                answered += 1;
            }
        }
        let elapsed = started.elapsed();
        let cpus = u64::try_from(aya::util::nr_cpus().unwrap()).unwrap();
        // Each CPU's bucket starts full (BURST) and refills at PER_SECOND.
        let refilled = u64::try_from(elapsed.as_millis()).unwrap() * PER_SECOND / 1000 + 1;
        let ceiling = cpus * (BURST + refilled);
        assert!(answered <= ceiling, "{answered} of {SENT} answered in {elapsed:?}; at most {ceiling} may be");
        assert!(answered >= BURST, "only {answered} answered: a full bucket answers {BURST}");
        // The limit must have bitten, or the ceiling above proved nothing
        // (it grows with the time the packets took).
        assert!(answered < SENT, "all {SENT} answered in {elapsed:?}: the limit never applied");
        assert_eq!((node.stat("rejected"), node.stat("reject_limited")), (answered, SENT - answered));
    });
}

/// Runs `program` on `frame` with context `ctx` (`BPF_PROG_TEST_RUN`):
/// its verdict and the frame after.
fn test_run<P>(program: &P, frame: &[u8], ctx: &[u8]) -> (i32, Vec<u8>)
where
    P: for<'a> TestRun<Opts<'a> = TestRunOptions<'a>, Result = TestRunResult>,
{
    let mut out = vec![0u8; frame.len() + 128];
    let result = program
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(ctx),
            ..TestRunOptions::default()
        })
        .unwrap();
    out.truncate(result.data_size_out as usize);
    (i32::try_from(result.return_value).unwrap(), out)
}

/// What became of a frame on its way in, whichever hook decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// To the stack.
    Pass,
    Drop,
    /// Sent out by the program (to a backend, to a client, or answered).
    Sent,
}

/// What the kernel does with `frame` arriving on ext0 with the XDP
/// program in front of TC: XDP, then TC on what XDP passes. Also says
/// whether XDP sent the frame itself.
fn xdp_then_tc(node: &Node, frame: &[u8]) -> (Fate, Vec<u8>, bool) {
    let (action, out) = node.xdp(frame);
    match action {
        XDP_DROP => (Fate::Drop, out, false),
        XDP_TX | XDP_REDIRECT => (Fate::Sent, out, true),
        XDP_PASS => {
            let (fate, out) = tc_only(node, &out);
            (fate, out, false)
        }
        other => panic!("XDP verdict {other}"),
    }
}

fn tc_only(node: &Node, frame: &[u8]) -> (Fate, Vec<u8>) {
    let (action, out) = node.ingress(frame);
    let fate = match action {
        OK => Fate::Pass,
        SHOT => Fate::Drop,
        REDIRECT => Fate::Sent,
        other => panic!("TC verdict {other}"),
    };
    (fate, out)
}

/// Frames from outside, in order (a flow's later packets and its replies
/// after its first), each with what it is. `nat` is the source the node
/// gave the `dns` flow (its reply goes there), learnt from the run.
fn outside_frames(nat: SocketAddr) -> Vec<(&'static str, Vec<u8>)> {
    let mut fragment = packet::frame(sa("192.0.2.7:40002"), sa("172.30.0.11:30080"), Some(SYN), b"");
    fragment[14 + 6] |= 0x20; // more fragments
    vec![
        ("a NodePort, backend here", packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:30080"), Some(SYN), b"")),
        (
            "its next segment",
            packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:30080"), Some(ACK), b"GET / HTTP/1.1\r\n\r\n"),
        ),
        ("IPv6, backend here", packet::frame(sa("[fd00:30::99]:40000"), sa("[fd00:30::11]:30080"), Some(SYN), b"")),
        (
            "a LoadBalancer IP, backend on n2",
            packet::frame(sa("192.0.2.8:41000"), sa("203.0.113.30:80"), Some(SYN), b""),
        ),
        ("its next segment", packet::frame(sa("192.0.2.8:41000"), sa("203.0.113.30:80"), Some(ACK), b"data")),
        ("UDP, backend on n2", packet::frame(sa("198.51.100.20:5000"), sa("203.0.113.53:53"), None, b"query")),
        ("the reply, to a client behind a gateway without a neighbour entry", {
            packet::frame(sa("10.244.2.7:5353"), nat, None, b"answer")
        }),
        ("UDP without checksum", packet::udp4_without_checksum(sa("198.51.100.21:5001"), sa("203.0.113.53:53"), b"q")),
        ("a NodePort of a service without endpoints", {
            packet::frame(sa("192.0.2.7:40001"), sa("172.30.0.11:30050"), Some(SYN), b"")
        }),
        ("externalTrafficPolicy Local, no endpoint here", {
            packet::frame(sa("192.0.2.7:40003"), sa("172.30.0.11:30090"), Some(SYN), b"")
        }),
        (
            "a source outside loadBalancerSourceRanges",
            packet::frame(sa("192.0.2.9:5000"), sa("203.0.113.53:53"), None, b"q"),
        ),
        ("a fragment", fragment),
        ("not a frontend", packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:22"), Some(SYN), b"")),
    ]
}

/// The `dns` flow's source after translation (where its reply goes).
fn dns_nat(node: &Node) -> SocketAddr {
    let (_, out) = node.ingress(&packet::frame(sa("198.51.100.20:5000"), sa("203.0.113.53:53"), None, b"query"));
    packet::parse(&out).src
}

#[test]
fn xdp_and_tc_give_the_same_packets_and_xdp_leaves_to_tc_what_it_cannot_finish() {
    common::require_root!();
    let lab = Lab::new();
    // Where the dns flow's replies go: the same on every fresh node (the
    // SNAT port is derived from the flow).
    let nat = lab.with_node(SERVICES, &[NODE_IP, NODE_IP6], |node| dns_nat(node));
    let tc: Vec<(Fate, Vec<u8>)> = lab.with_node(SERVICES, &[NODE_IP, NODE_IP6], move |node| {
        outside_frames(nat).iter().map(|(_, f)| tc_only(node, f)).collect()
    });
    let (xdp, stats) = lab.with_node(SERVICES, &[NODE_IP, NODE_IP6], move |node| {
        let runs: Vec<(Fate, Vec<u8>, bool)> = outside_frames(nat).iter().map(|(_, f)| xdp_then_tc(node, f)).collect();
        (runs, (node.stat("xdp_translated"), node.stat("xdp_to_tc"), node.stat("new_flow")))
    });
    let frames = outside_frames(nat);
    let mut sent_by_xdp = 0;
    for (((what, input), (tc_fate, tc_out)), (xdp_fate, xdp_out, by_xdp)) in frames.iter().zip(&tc).zip(&xdp) {
        assert_eq!(xdp_fate, tc_fate, "{what}: XDP+TC and TC alone decide differently");
        if *by_xdp {
            // XDP writes the Ethernet header itself (from the FIB's
            // neighbour); TC leaves it to bpf_redirect_neigh. The rest must
            // be the same bytes.
            assert_eq!(&xdp_out[..6], &N2_MAC, "{what}: to n2's link-layer address");
            assert_eq!(&xdp_out[6..12], &EXT0_MAC, "{what}: from ext0's");
            assert_eq!(&xdp_out[14..], &tc_out[14..], "{what}: XDP and TC rewrote it differently");
            assert_eq!(&tc_out[..14], &input[..14], "{what}: TC leaves the Ethernet header to the kernel");
            // Its checksums are valid (parse verifies them).
            assert_eq!(packet::parse(xdp_out).dst, packet::parse(tc_out).dst, "{what}");
            sent_by_xdp += 1;
        } else {
            assert_eq!(xdp_out, tc_out, "{what}: XDP+TC and TC alone rewrote it differently");
        }
    }
    // Finished by XDP: the two local flows' three packets (passed to the
    // stack rewritten) and the four sent to n2; the reply to a client
    // without a neighbour entry and the rejection went to TC.
    assert_eq!(sent_by_xdp, 4, "{xdp:?}");
    let (translated, to_tc, new_flows) = stats;
    assert_eq!((translated, to_tc), (7, 2), "xdp_translated, xdp_to_tc");
    assert_eq!(new_flows, 5, "each flow counted once, by the hook that admitted it");
    // The no-checksum datagram kept none through XDP.
    let udp0 = frames.iter().position(|(w, _)| *w == "UDP without checksum").unwrap();
    assert!(packet::parse(&xdp[udp0].1).udp_checksum_zero);
}

/// Taking over from kube-proxy (`--outside-handover`), the decisions that
/// need no conntrack state: in `defer` every packet to a frontend goes to
/// the kernel untouched, XDP passing it to TC, and its flow is remembered
/// as netfilter's; after the switch to `handover` those flows stay
/// netfilter's (TCP and UDP, whatever their segments) while new flows are
/// translated as usual.
#[test]
fn defer_leaves_frontends_to_the_kernel_and_its_flows_stay_there_in_handover() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP, NODE_IP6], |node| {
        node.datapath.set_outside_handover(OutsideHandover::Defer).unwrap();
        assert_eq!(node.datapath.outside_handover().unwrap(), Some(OutsideHandover::Defer));
        let old_tcp = packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:30080"), Some(SYN), b"");
        let old_udp = packet::frame(sa("198.51.100.20:5000"), sa("203.0.113.53:53"), None, b"query");
        let old_remote = packet::frame(sa("192.0.2.8:41000"), sa("203.0.113.30:80"), Some(SYN), b"");
        for frame in [&old_tcp, &old_udp, &old_remote] {
            assert_eq!(node.xdp(frame), (XDP_PASS, frame.clone()), "XDP passes it untouched");
            assert_eq!(node.ingress(frame), (OK, frame.clone()), "TC leaves it to the kernel");
        }
        assert_eq!(node.stat("left_to_kernel"), 3, "counted once per packet, by TC");
        assert_eq!((node.stat("new_flow"), node.stat("xdp_translated")), (0, 0));
        // Not a frontend: as ever, untouched and not counted.
        let other = packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:22"), Some(SYN), b"");
        assert_eq!(node.ingress(&other), (OK, other.clone()));
        assert_eq!(node.stat("left_to_kernel"), 3);

        node.datapath.set_outside_handover(OutsideHandover::Handover { ends_after: None }).unwrap();
        // The flows seen while deferring stay netfilter's: a later segment,
        // a retransmitted SYN, the next datagram.
        let old_tcp_data = packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:30080"), Some(ACK), b"GET /");
        let old_remote_data = packet::frame(sa("192.0.2.8:41000"), sa("203.0.113.30:80"), Some(ACK), b"x");
        for frame in [&old_tcp_data, &old_tcp, &old_udp, &old_remote_data] {
            assert_eq!(node.xdp(frame), (XDP_PASS, frame.clone()), "XDP passes netfilter's flow");
            assert_eq!(node.ingress(frame), (OK, frame.clone()), "TC leaves netfilter's flow to the kernel");
        }
        assert_eq!(node.stat("left_to_kernel"), 7);
        // New flows are ours.
        let (action, out) =
            node.ingress(&packet::frame(sa("192.0.2.7:40001"), sa("172.30.0.11:30080"), Some(SYN), b""));
        assert_eq!((action, packet::parse(&out).dst), (OK, sa("10.244.1.5:8080")));
        let (action, out) = node.ingress(&packet::frame(sa("198.51.100.20:5001"), sa("203.0.113.53:53"), None, b"q"));
        assert_eq!((action, packet::parse(&out).dst), (REDIRECT, sa("10.244.2.7:5353")));
        assert_eq!((node.stat("new_flow"), node.stat("left_to_kernel")), (2, 7));

        // Off: netfilter's remembered flows still go to the kernel until
        // they end; a FIN closes one and a new SYN on its tuple is ours.
        node.datapath.set_outside_handover(OutsideHandover::Off).unwrap();
        assert_eq!(node.ingress(&old_tcp_data), (OK, old_tcp_data.clone()));
        let fin = packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:30080"), Some(FIN | ACK), b"");
        assert_eq!(node.ingress(&fin), (OK, fin.clone()));
        let (action, out) = node.ingress(&old_tcp);
        assert_eq!((action, packet::parse(&out).dst), (OK, sa("10.244.1.5:8080")), "a new connection on the tuple");
        assert_eq!((node.stat("new_flow"), node.stat("left_to_kernel")), (3, 9));
    });
}

/// In `defer`, a SYN reusing the tuple of a closing flow of ours (a client
/// that opens a connection again from the same port) starts a connection
/// netfilter serves, all of it: not its SYN alone while its later segments
/// follow the old flow's entry to the old backend.
#[test]
fn in_defer_a_syn_reusing_a_closing_flows_tuple_goes_to_the_kernel_with_its_segments() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP], |node| {
        let (client, frontend) = (sa("192.0.2.7:40000"), sa("172.30.0.11:30080"));
        let (action, out) = node.ingress(&packet::frame(client, frontend, Some(SYN), b""));
        assert_eq!((action, packet::parse(&out).dst), (OK, sa("10.244.1.5:8080")), "ours before the takeover");
        let fin = packet::frame(client, frontend, Some(FIN | ACK), b"");
        assert_eq!(node.ingress(&fin).0, OK);

        node.datapath.set_outside_handover(OutsideHandover::Defer).unwrap();
        let syn = packet::frame(client, frontend, Some(SYN), b"");
        assert_eq!(node.ingress(&syn), (OK, syn.clone()), "the new connection's SYN goes to netfilter");
        let data = packet::frame(client, frontend, Some(ACK), b"GET /");
        assert_eq!(node.ingress(&data), (OK, data.clone()), "and so do its later segments");
        assert_eq!(node.stat("left_to_kernel"), 2);
    });
}

/// In `handover`, a TCP segment without SYN of a connection the programs
/// never saw (one kube-proxy's DNAT set up before their time, idle while
/// deferring) goes to the kernel, whose conntrack holds its translation;
/// a SYN starts a flow of ours, whose later segments stay ours. When the
/// handover ends, such a segment gets a backend again as before.
#[test]
fn handover_leaves_segments_of_unknown_tcp_connections_to_the_kernel_until_it_ends() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP, NODE_IP6], |node| {
        node.datapath.set_outside_handover(OutsideHandover::Handover { ends_after: None }).unwrap();
        for (client, frontend) in
            [("192.0.2.7:40000", "172.30.0.11:30080"), ("[fd00:30::99]:40000", "[fd00:30::11]:30080")]
        {
            let unknown = packet::frame(sa(client), sa(frontend), Some(ACK), b"data");
            assert_eq!(node.xdp(&unknown), (XDP_PASS, unknown.clone()));
            assert_eq!(node.ingress(&unknown), (OK, unknown.clone()));
        }
        // An unknown UDP flow cannot be told from a new one: it is ours.
        let (action, _) = node.ingress(&packet::frame(sa("198.51.100.20:5000"), sa("203.0.113.53:53"), None, b"q"));
        assert_eq!(action, REDIRECT);
        assert_eq!((node.stat("left_to_kernel"), node.stat("new_flow")), (2, 1));

        let client = sa("192.0.2.7:40010");
        let frontend = sa("172.30.0.11:30080");
        let (action, out) = node.ingress(&packet::frame(client, frontend, Some(SYN), b""));
        assert_eq!((action, packet::parse(&out).dst), (OK, sa("10.244.1.5:8080")));
        let (action, out) = node.ingress(&packet::frame(client, frontend, Some(ACK), b"GET /"));
        assert_eq!((action, packet::parse(&out).dst), (OK, sa("10.244.1.5:8080")), "our flow stays ours");
        assert_eq!((node.stat("left_to_kernel"), node.stat("new_flow")), (2, 2));

        // A handover that has ended serves every flow.
        node.datapath
            .set_outside_handover(OutsideHandover::Handover { ends_after: Some(std::time::Duration::ZERO) })
            .unwrap();
        assert_eq!(node.datapath.outside_handover().unwrap(), Some(OutsideHandover::Off));
        let unknown = packet::frame(sa("192.0.2.7:40020"), frontend, Some(ACK), b"data");
        let (action, out) = node.ingress(&unknown);
        assert_eq!((action, packet::parse(&out).dst), (OK, sa("10.244.1.5:8080")));
        assert_eq!(node.stat("left_to_kernel"), 2);
    });
}
/// Beside `SERVICES`, for DSR: LoadBalancer `spread6` (IPv6, two backends
/// on n2) and NodePort `echo` (UDP, a backend here, and a LoadBalancer IP).
const DSR_EXTRA: &str = r#"
---
apiVersion: v1
kind: Service
metadata: {name: spread6, namespace: t}
spec:
  type: LoadBalancer
  clusterIP: "fd00:96::60"
  clusterIPs: ["fd00:96::60"]
  ipFamilies: [IPv6]
  ports: [{name: http, port: 80, nodePort: 30060, protocol: TCP}]
status: {loadBalancer: {ingress: [{ip: "2001:db8:60::1"}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: spread6-1, namespace: t, labels: {kubernetes.io/service-name: spread6}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: ["fd00:244:2::21"], nodeName: n2}
- {addresses: ["fd00:244:2::22"], nodeName: n2}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: t}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.70
  ports: [{name: echo, port: 70, nodePort: 30070, protocol: UDP}]
status: {loadBalancer: {ingress: [{ip: 203.0.113.70}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo-1, namespace: t, labels: {kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{name: echo, port: 7000, protocol: UDP}]
endpoints: [{addresses: ["10.244.1.8"], nodeName: n1}]
"#;

fn dsr_services() -> &'static str {
    Box::leak(format!("{SERVICES}{DSR_EXTRA}").into_boxed_str())
}

/// Whether `seen` went to one of `spread`'s backends on n2.
fn to_spread(seen: &Seen) -> bool {
    let ip = seen.dst.ip().to_string();
    seen.dst.port() == 8080 && ["10.244.2.21", "10.244.2.22", "10.244.2.23", "10.244.2.24"].contains(&ip.as_str())
}

/// A UDP datagram that fills the MTU (1,472 bytes of payload on a
/// 1,500-byte link) has no room for the DSR option, and UDP has no path MTU
/// discovery to make it shorter: its flow goes by source NAT from then on
/// (the tail-called `nodeport_dsr_to_snat`), as the issue asks ("goes by
/// SNAT for that flow"); the device used to drop it unseen. Its reply
/// comes back through this node; a flow whose datagrams fit stays DSR.
#[test]
fn a_dsr_datagram_the_option_would_make_too_long_moves_its_flow_to_source_nat() {
    common::require_root!();
    Lab::new().with_node_mode(dsr_services(), &[NODE_IP, NODE_IP6], NodePortMode::Dsr, |node| {
        let frontend = sa("203.0.113.53:53");
        let client = sa("198.51.100.20:5000");
        let (action, out) = node.ingress(&packet::frame(client, frontend, None, &[7u8; 1472]));
        assert_eq!(action, REDIRECT, "1,500 bytes and the option do not fit a 1,500-byte MTU: by source NAT");
        assert_source_natted(&out, 1472);
        let nat = packet::parse(&out).src;
        assert_eq!((node.stat("dsr_to_snat"), node.stat("dsr_too_big")), (1, 0));

        // Later datagrams of the flow, small ones too, keep its port.
        let (action, out) = node.ingress(&packet::frame(client, frontend, None, b"small"));
        assert_eq!(action, REDIRECT);
        assert_source_natted(&out, 5);
        assert_eq!(packet::parse(&out).src, nat, "the flow keeps its SNAT port");
        assert_eq!(node.stat("dsr_to_snat"), 1, "moved once");

        // The backend's reply comes back here and goes to the client, from
        // the frontend.
        let (action, out) = node.ingress(&packet::frame(sa("10.244.2.7:5353"), nat, None, b"answer"));
        assert_eq!(action, REDIRECT);
        let back = packet::parse(&out);
        assert_eq!((back.src, back.dst), (frontend, client));

        // Another flow whose datagrams fit goes by DSR.
        let (action, out) = node.ingress(&packet::frame(sa("198.51.100.21:5000"), frontend, None, &[7u8; 1464]));
        assert_eq!(action, REDIRECT, "with 8 bytes to spare it goes by DSR");
        assert_eq!(packet::dsr_option(&out), Some(frontend));
        assert_eq!(out.len(), 14 + 1500);
        assert_eq!(node.stat("dsr_to_snat"), 1);
    });
}

/// `out` is a datagram of `len` bytes of payload from the node's address
/// (a SNAT port) to the echo backend on n2, without a DSR option.
fn assert_source_natted(out: &[u8], len: usize) {
    let seen = packet::parse(out);
    assert_eq!(seen.src.ip(), NODE_IP.parse::<IpAddr>().unwrap(), "from the node's address");
    assert!(seen.src.port() >= proxy_common::snat_ports::MIN, "from a SNAT port: {seen:?}");
    assert_eq!(seen.dst, sa("10.244.2.7:5353"));
    assert_eq!(packet::dsr_option(out), None);
    assert_eq!(out.len(), 14 + 20 + 8 + len, "{seen:?}");
}

#[test]
fn dsr_forwards_with_the_client_s_source_and_the_frontend_in_an_option_on_syns_and_datagrams() {
    common::require_root!();
    Lab::new().with_node_mode(dsr_services(), &[NODE_IP, NODE_IP6], NodePortMode::Dsr, |node| {
        let client = sa("192.0.2.8:41000");
        let frontend = sa("203.0.113.30:80");
        let syn = packet::frame(client, frontend, Some(SYN), b"");
        let (action, out) = node.ingress(&syn);
        assert_eq!(action, REDIRECT, "routed by the program to n2");
        let seen = packet::parse(&out);
        assert_eq!(seen.src, client, "DSR keeps the client's address");
        assert!(to_spread(&seen), "{seen:?}");
        assert_eq!(seen.ttl, 63);
        assert_eq!(packet::dsr_option(&out), Some(frontend), "the SYN carries the frontend");
        assert_eq!(out.len(), syn.len() + 8);

        // A later segment goes to the same backend, without the option.
        let (action, next) = node.ingress(&packet::frame(client, frontend, Some(ACK), b"data"));
        assert_eq!(action, REDIRECT);
        let next_seen = packet::parse(&next);
        assert_eq!((next_seen.src, next_seen.dst), (client, seen.dst));
        assert_eq!(packet::dsr_option(&next), None);
        assert_eq!(next_seen.tcp.unwrap().data_len, 4);

        // A NodePort: the option names this node's address.
        let (action, out) =
            node.ingress(&packet::frame(sa("192.0.2.8:41001"), sa("172.30.0.11:30030"), Some(SYN), b""));
        assert_eq!(action, REDIRECT);
        assert_eq!(packet::dsr_option(&out), Some(sa("172.30.0.11:30030")));

        // UDP: every datagram carries it.
        let udp_client = sa("198.51.100.20:5000");
        for payload in [&b"query"[..], b"query2"] {
            let (action, out) = node.ingress(&packet::frame(udp_client, sa("203.0.113.53:53"), None, payload));
            assert_eq!(action, REDIRECT);
            let seen = packet::parse(&out);
            assert_eq!((seen.src, seen.dst), (udp_client, sa("10.244.2.7:5353")));
            assert_eq!(packet::dsr_option(&out), Some(sa("203.0.113.53:53")));
        }

        // IPv6: a Destination Options header.
        let client6 = sa("[fd00:30::99]:42000");
        let frontend6 = sa("[2001:db8:60::1]:80");
        let (action, out) = node.ingress(&packet::frame(client6, frontend6, Some(SYN), b""));
        assert_eq!(action, REDIRECT);
        let seen = packet::parse(&out);
        assert_eq!(seen.src, client6);
        assert!(["[fd00:244:2::21]:8080", "[fd00:244:2::22]:8080"].contains(&seen.dst.to_string().as_str()));
        assert_eq!((seen.ttl, packet::dsr_option(&out)), (63, Some(frontend6)));

        // The flow to a backend here is as in SNAT mode: no option.
        let (action, out) =
            node.ingress(&packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.11:30080"), Some(SYN), b""));
        assert_eq!((action, packet::dsr_option(&out)), (OK, None));
        assert_eq!(node.stat("new_flow"), 5);
    });
}

#[test]
fn hybrid_mode_takes_dsr_for_tcp_and_source_nat_for_udp() {
    common::require_root!();
    Lab::new().with_node_mode(dsr_services(), &[NODE_IP], NodePortMode::Hybrid, |node| {
        let (action, out) = node.ingress(&packet::frame(sa("192.0.2.8:41000"), sa("203.0.113.30:80"), Some(SYN), b""));
        assert_eq!(action, REDIRECT);
        assert_eq!(packet::parse(&out).src, sa("192.0.2.8:41000"), "TCP: DSR");
        assert_eq!(packet::dsr_option(&out), Some(sa("203.0.113.30:80")));
        let (action, out) = node.ingress(&packet::frame(sa("198.51.100.20:5000"), sa("203.0.113.53:53"), None, b"q"));
        assert_eq!(action, REDIRECT);
        let seen = packet::parse(&out);
        assert_eq!(seen.src.ip(), NODE_IP.parse::<IpAddr>().unwrap(), "UDP: source NAT");
        assert_eq!(packet::dsr_option(&out), None);
    });
}

#[test]
fn a_backend_node_answers_a_dsr_flow_from_the_frontend_and_refuses_options_naming_no_such_frontend() {
    common::require_root!();
    // The mode of the backend's node does not matter: it answers the DSR
    // flows entry nodes send it.
    Lab::new().with_node(dsr_services(), &[NODE_IP, NODE_IP6], |node| {
        let client = sa("192.0.2.7:40000");
        let backend = sa("10.244.1.5:8080");
        // n2's NodePort, whose service has this node's backend.
        let entry = sa("172.30.0.12:30080");
        let arriving = packet::with_dsr_option(&packet::frame(client, backend, Some(SYN), b""), entry);
        let (action, out) = node.ingress(&arriving);
        assert_eq!(action, OK, "to the stack");
        assert_eq!(out, arriving, "unchanged, the option left in");
        let (action, out) = node.egress(&packet::frame(backend, client, Some(SYN | ACK), b""));
        assert_eq!(action, OK);
        let reply = packet::parse(&out);
        assert_eq!((reply.src, reply.dst), (entry, client), "the reply leaves from the frontend");
        // The flow's later packets pass untouched (no option, not a frontend).
        let later = packet::frame(client, backend, Some(ACK), b"x");
        assert_eq!(node.ingress(&later), (OK, later.clone()));

        // UDP, to a LoadBalancer IP.
        let udp_client = sa("198.51.100.30:6000");
        let echo = sa("10.244.1.8:7000");
        let arriving = packet::with_dsr_option(&packet::frame(udp_client, echo, None, b"ping"), sa("203.0.113.70:70"));
        assert_eq!(node.ingress(&arriving).0, OK);
        let (_, out) = node.egress(&packet::frame(echo, udp_client, None, b"pong"));
        assert_eq!(packet::parse(&out).src, sa("203.0.113.70:70"));

        // IPv6.
        let client6 = sa("[fd00:30::99]:40000");
        let backend6 = sa("[fd00:244:1::5]:8080");
        let entry6 = sa("[fd00:30::12]:30080");
        let arriving = packet::with_dsr_option(&packet::frame(client6, backend6, Some(SYN), b""), entry6);
        assert_eq!(node.ingress(&arriving), (OK, arriving.clone()));
        let (_, out) = node.egress(&packet::frame(backend6, client6, Some(SYN | ACK), b""));
        assert_eq!(packet::parse(&out).src, entry6);

        // Options naming no NodePort, or a frontend without this backend,
        // are dropped, and replies of those tuples keep their source.
        let forged = [
            (sa("192.0.2.66:1000"), sa("172.30.0.12:30099")),
            (sa("192.0.2.66:1001"), sa("203.0.113.30:80")),
            (sa("192.0.2.66:1002"), sa("10.96.0.10:80")),
        ];
        for (source, named) in forged {
            let frame = packet::with_dsr_option(&packet::frame(source, backend, Some(SYN), b""), named);
            assert_eq!(node.ingress(&frame).0, SHOT, "an option naming {named}");
            let (_, out) = node.egress(&packet::frame(backend, source, Some(SYN | ACK), b""));
            assert_eq!(packet::parse(&out).src, backend, "no DSR state for {named}");
        }
        assert_eq!(node.stat("dsr_refused"), 3);
    });
}

/// A node with the option dispatch leaves IPIP packets alone, DSR-shaped
/// or not: it never takes another tunnel's packets apart.
#[test]
fn with_the_option_dispatch_ipip_packets_pass_untouched() {
    common::require_root!();
    Lab::new().with_node(dsr_services(), &[NODE_IP, NODE_IP6], |node| {
        let inner = packet::frame(sa("192.0.2.7:40000"), sa("172.30.0.12:30080"), Some(SYN), b"");
        let frame = packet::encapsulated(&inner, "172.30.0.12".parse().unwrap(), "10.244.1.5".parse().unwrap());
        assert_eq!(node.ingress(&frame), (OK, frame.clone()));
    });
}

/// `--dsr-dispatch ipip`: every packet of a DSR flow leaves inside an
/// outer header from this node to the backend (IPIP, IP6IP6), the client's
/// packet untouched within but for its TTL; no option.
#[test]
fn ipip_dispatch_sends_every_packet_of_a_dsr_flow_inside_an_outer_header_to_the_backend() {
    common::require_root!();
    let lab = Lab::new().with_dispatch(DsrDispatch::Ipip);
    lab.with_node_mode(dsr_services(), &[NODE_IP, NODE_IP6], NodePortMode::Dsr, |node| {
        let client = sa("192.0.2.8:41000");
        let frontend = sa("203.0.113.30:80");
        let (action, out) = node.ingress(&packet::frame(client, frontend, Some(SYN), b""));
        assert_eq!(action, REDIRECT, "routed by the program to n2");
        let (outer_src, backend, inner) = packet::decapsulated(&out);
        assert_eq!(outer_src, NODE_IP.parse::<IpAddr>().unwrap());
        assert!(
            ["10.244.2.21", "10.244.2.22", "10.244.2.23", "10.244.2.24"].contains(&backend.to_string().as_str()),
            "to one of spread's backends: {backend}"
        );
        let seen = packet::parse(&inner);
        assert_eq!((seen.src, seen.dst, seen.ttl), (client, frontend, 63), "the client's packet, untouched");
        assert_eq!(packet::dsr_option(&inner), None);
        // A later segment: to the same backend, inside a header too.
        let (action, next) = node.ingress(&packet::frame(client, frontend, Some(ACK), b"data"));
        assert_eq!(action, REDIRECT);
        let (_, next_backend, next_inner) = packet::decapsulated(&next);
        assert_eq!(next_backend, backend);
        assert_eq!(packet::parse(&next_inner).tcp.unwrap().data_len, 4);

        // IPv6: IP6IP6.
        let frontend6 = sa("[2001:db8:60::1]:80");
        let (action, out) = node.ingress(&packet::frame(sa("[fd00:30::99]:42000"), frontend6, Some(SYN), b""));
        assert_eq!(action, REDIRECT);
        let (src6, backend6, inner6) = packet::decapsulated(&out);
        assert_eq!(src6, NODE_IP6.parse::<IpAddr>().unwrap());
        assert!(["fd00:244:2::21", "fd00:244:2::22"].contains(&backend6.to_string().as_str()), "{backend6}");
        assert_eq!(packet::parse(&inner6).dst, frontend6);
        assert_eq!(node.stat("dsr_refused"), 0);
    });
}

/// With the 20 bytes of the outer header a full-size packet no longer fits
/// the 1,500-byte link: a TCP segment is answered with ICMP fragmentation
/// needed naming 1,480 (the client's path MTU discovery then sends smaller
/// segments), a UDP datagram's flow goes by source NAT; one that fits goes.
#[test]
fn ipip_dispatch_answers_a_segment_too_long_for_the_outer_header_with_fragmentation_needed() {
    common::require_root!();
    let lab = Lab::new().with_dispatch(DsrDispatch::Ipip);
    lab.with_node_mode(dsr_services(), &[NODE_IP, NODE_IP6], NodePortMode::Dsr, |node| {
        let client = sa("192.0.2.8:41002");
        let frontend = sa("203.0.113.30:80");
        assert_eq!(node.ingress(&packet::frame(client, frontend, Some(SYN), b"")).0, REDIRECT);
        let (action, out) = node.ingress(&packet::frame(client, frontend, Some(ACK), &[7u8; 1460]));
        assert_eq!(action, REDIRECT, "the answer goes back out");
        let icmp = packet::parse_icmp(&out);
        assert_eq!(icmp.kind, (3, 4), "fragmentation needed");
        assert_eq!((icmp.src, icmp.dst), (frontend.ip(), client.ip()));
        assert_eq!(packet::quoted_ends(&icmp.quoted), (client, frontend));
        assert_eq!(u16::from_be_bytes([out[14 + 20 + 6], out[14 + 20 + 7]]), 1480, "the MTU less the header");
        assert_eq!(node.stat("dsr_frag_needed"), 1);
        let (action, out) = node.ingress(&packet::frame(client, frontend, Some(ACK), &[7u8; 1440]));
        assert_eq!(action, REDIRECT);
        assert_eq!(out.len(), 14 + 1500, "1,480 bytes and the header fill the link");

        // A UDP datagram has no path MTU discovery: its flow goes by
        // source NAT, without an outer header.
        let (udp_client, dns) = (sa("198.51.100.20:5000"), sa("203.0.113.53:53"));
        let (action, out) = node.ingress(&packet::frame(udp_client, dns, None, &[7u8; 1472]));
        assert_eq!(action, REDIRECT);
        assert_source_natted(&out, 1472);
        assert_eq!((node.stat("dsr_to_snat"), node.stat("dsr_too_big")), (1, 0));
        let (action, out) = node.ingress(&packet::frame(sa("198.51.100.21:5000"), dns, None, &[7u8; 1452]));
        assert_eq!(action, REDIRECT);
        assert_eq!(packet::decapsulated(&out).1, "10.244.2.7".parse::<IpAddr>().unwrap());
    });
}

/// On the backend's node an encapsulated DSR packet has its outer header
/// taken off and is translated to its backend (the outer destination),
/// which answers from the frontend; a packet of another tunnel, or one
/// whose frontend does not pick this backend, goes on as it came.
#[test]
fn an_encapsulated_dsr_packet_is_taken_out_translated_to_its_backend_and_answered_from_the_frontend() {
    common::require_root!();
    Lab::new().with_dispatch(DsrDispatch::Ipip).with_node(dsr_services(), &[NODE_IP, NODE_IP6], |node| {
        let n2: IpAddr = "172.30.0.12".parse().unwrap();
        let client = sa("192.0.2.7:40000");
        let backend = sa("10.244.1.5:8080");
        // n2's NodePort, whose service has this node's backend.
        let entry = sa("172.30.0.12:30080");
        let arriving = packet::encapsulated(&packet::frame(client, entry, Some(SYN), b""), n2, backend.ip());
        let (action, out) = node.ingress(&arriving);
        assert_eq!(action, OK, "to the stack");
        let seen = packet::parse(&out);
        assert_eq!((seen.src, seen.dst), (client, backend), "the header off, the frontend translated");
        let (action, out) = node.egress(&packet::frame(backend, client, Some(SYN | ACK), b""));
        assert_eq!(action, OK);
        assert_eq!(packet::parse(&out).src, entry, "the reply leaves from the frontend");
        let later = packet::encapsulated(&packet::frame(client, entry, Some(ACK), b"x"), n2, backend.ip());
        let (_, out) = node.ingress(&later);
        assert_eq!(packet::parse(&out).dst, backend);

        // IPv6.
        let client6 = sa("[fd00:30::99]:40000");
        let backend6 = sa("[fd00:244:1::5]:8080");
        let entry6 = sa("[fd00:30::12]:30080");
        let n2_6: IpAddr = "fd00:30::12".parse().unwrap();
        let arriving = packet::encapsulated(&packet::frame(client6, entry6, Some(SYN), b""), n2_6, backend6.ip());
        let (action, out) = node.ingress(&arriving);
        assert_eq!(action, OK);
        assert_eq!(packet::parse(&out).dst, backend6);
        let (_, out) = node.egress(&packet::frame(backend6, client6, Some(SYN | ACK), b""));
        assert_eq!(packet::parse(&out).src, entry6);

        // Not a DSR flow's: unchanged, no state.
        let others = [
            ("a NodePort without this backend", sa("192.0.2.66:1000"), sa("172.30.0.12:30099"), backend.ip()),
            ("another tunnel's, to this node", sa("192.0.2.66:1001"), sa("10.1.2.3:80"), NODE_IP.parse().unwrap()),
        ];
        for (what, source, to, outer_dst) in others {
            let frame = packet::encapsulated(&packet::frame(source, to, Some(SYN), b""), n2, outer_dst);
            assert_eq!(node.ingress(&frame), (OK, frame.clone()), "{what}");
            let (_, out) = node.egress(&packet::frame(backend, source, Some(SYN | ACK), b""));
            assert_eq!(packet::parse(&out).src, backend, "no DSR state for {what}");
        }
    });
}

#[test]
fn xdp_and_tc_agree_on_dsr_frames_and_xdp_leaves_the_options_to_tc() {
    common::require_root!();
    let frames = || {
        let client = sa("192.0.2.8:41000");
        let frontend = sa("203.0.113.30:80");
        vec![
            ("a SYN to a backend on n2", packet::frame(client, frontend, Some(SYN), b"")),
            ("its next segment", packet::frame(client, frontend, Some(ACK), b"data")),
            ("a UDP datagram", packet::frame(sa("198.51.100.20:5000"), sa("203.0.113.53:53"), None, b"q")),
            ("IPv6 SYN", packet::frame(sa("[fd00:30::99]:42000"), sa("[2001:db8:60::1]:80"), Some(SYN), b"")),
            (
                "a DSR flow arriving for a backend here",
                packet::with_dsr_option(
                    &packet::frame(sa("192.0.2.7:40000"), sa("10.244.1.5:8080"), Some(SYN), b""),
                    sa("172.30.0.12:30080"),
                ),
            ),
            (
                "a forged option",
                packet::with_dsr_option(
                    &packet::frame(sa("192.0.2.66:1000"), sa("10.244.1.5:8080"), Some(SYN), b""),
                    sa("172.30.0.12:30099"),
                ),
            ),
        ]
    };
    let lab = Lab::new();
    let tc: Vec<(Fate, Vec<u8>)> =
        lab.with_node_mode(dsr_services(), &[NODE_IP, NODE_IP6], NodePortMode::Dsr, move |node| {
            frames().iter().map(|(_, f)| tc_only(node, f)).collect()
        });
    let (xdp, to_tc) = lab.with_node_mode(dsr_services(), &[NODE_IP, NODE_IP6], NodePortMode::Dsr, move |node| {
        let runs: Vec<(Fate, Vec<u8>, bool)> = frames().iter().map(|(_, f)| xdp_then_tc(node, f)).collect();
        (runs, node.stat("xdp_to_tc"))
    });
    let mut by_xdp = Vec::new();
    for (((what, _), (tc_fate, tc_out)), (xdp_fate, xdp_out, sent)) in frames().iter().zip(&tc).zip(&xdp) {
        assert_eq!(xdp_fate, tc_fate, "{what}: XDP+TC and TC alone decide differently");
        if *sent {
            assert_eq!(&xdp_out[..6], &N2_MAC, "{what}");
            assert_eq!(&xdp_out[14..], &tc_out[14..], "{what}: XDP and TC rewrote it differently");
            by_xdp.push(*what);
        } else {
            assert_eq!(xdp_out, tc_out, "{what}: XDP+TC and TC alone rewrote it differently");
        }
    }
    assert_eq!(by_xdp, ["its next segment"], "XDP sends on what needs no option; the rest goes to TC");
    assert_eq!(to_tc, 3, "the SYNs and the datagram, which need the option, went to TC");
}

/// The per-packet path for the pods' own traffic (`pod_ingress` and
/// `pod_egress` on a pod-facing device): a ClusterIP, a NodePort on the
/// node's address and a LoadBalancer IP reached from a pod get a backend
/// with the pod's source kept (no SNAT: kube-proxy masquerades only
/// traffic from outside the cluster CIDR and hairpin), and the replies
/// the pod receives show the frontend again.
#[test]
fn a_pod_s_packets_to_services_are_translated_per_packet_and_replies_show_the_frontend() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP, NODE_IP6], |node| {
        let pod = sa("10.244.1.9:41000");
        for (frontend, backend) in [
            ("10.96.0.40:80", "10.244.1.6:8080"),
            ("172.30.0.11:30080", "10.244.1.5:8080"),
            ("203.0.113.30:80", ""),
            ("10.96.0.53:53", "10.244.2.7:5353"),
        ] {
            let frontend = sa(frontend);
            let udp = frontend.port() == 53;
            let flags = if udp { None } else { Some(SYN) };
            let (action, out) = node.pod_ingress(&packet::frame(pod, frontend, flags, b""));
            assert_eq!(action, OK, "{frontend}: the stack routes it on");
            let seen = packet::parse(&out);
            assert_eq!(seen.src, pod, "{frontend}: the pod's address is kept");
            if backend.is_empty() {
                assert!(seen.dst.ip().to_string().starts_with("10.244.2.2"), "{frontend}: {}", seen.dst);
            } else {
                assert_eq!(seen.dst, sa(backend), "{frontend}");
            }
            assert_eq!(seen.ttl, 64, "not forwarded by the program");
            // Every later packet of the flow keeps its backend.
            let (_, again) = node.pod_ingress(&packet::frame(pod, frontend, if udp { None } else { Some(ACK) }, b"x"));
            assert_eq!(packet::parse(&again).dst, seen.dst, "{frontend}");
            // The backend's reply enters the pod from the frontend.
            let reply = packet::frame(seen.dst, pod, if udp { None } else { Some(SYN | ACK) }, b"y");
            let (action, out) = node.pod_egress(&reply);
            assert_eq!(action, OK);
            let back = packet::parse(&out);
            assert_eq!((back.src, back.dst), (frontend, pod), "{frontend}: reverse NAT on the way into the pod");
        }
        assert_eq!(node.pod_stat("new_flow"), 4);
        assert_eq!(node.stat("new_flow"), 0, "counted apart from traffic from outside");

        // The same ClusterIP from another pod: its own flow.
        let other = sa("10.244.1.10:41000");
        let (_, out) = node.pod_ingress(&packet::frame(other, sa("10.96.0.40:80"), Some(SYN), b""));
        assert_eq!(packet::parse(&out).src, other);
        assert_eq!(node.pod_stat("new_flow"), 5);
    });
}

/// What is not a service passes untouched both ways; a service without
/// endpoints is answered at once (kube-proxy's REJECT in KUBE-SERVICES),
/// counted as the pods'.
#[test]
fn a_pod_s_other_packets_pass_untouched_and_a_service_without_endpoints_is_rejected() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP, NODE_IP6], |node| {
        let pod = sa("10.244.1.9:41000");
        for dst in ["10.244.2.7:5353", "172.30.0.11:22", "8.8.8.8:443", "10.96.0.40:81"] {
            let frame = packet::frame(pod, sa(dst), Some(SYN), b"");
            assert_eq!(node.pod_ingress(&frame), (OK, frame.clone()), "{dst}");
            let reply = packet::frame(sa(dst), pod, Some(SYN | ACK), b"");
            assert_eq!(node.pod_egress(&reply), (OK, reply.clone()), "{dst}");
        }
        let frame = packet::frame(pod, sa("10.96.0.50:80"), Some(SYN), b"");
        let (action, out) = node.pod_ingress(&frame);
        assert_eq!(action, REDIRECT, "sent back into the pod");
        let rst = packet::parse(&out);
        assert_eq!((rst.src, rst.dst), (sa("10.96.0.50:80"), pod));
        assert_eq!(node.pod_stat("rejected"), 1);
        assert_eq!(node.stat("rejected"), 0);
        assert_eq!(node.pod_stat("new_flow"), 0);
    });
}

/// An SCTP NodePort service (Diameter's port) whose endpoints listen on
/// another port, both families, its backend on this node.
const SCTP_SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: sig, namespace: t}
spec:
  type: NodePort
  clusterIP: 10.96.0.80
  clusterIPs: [10.96.0.80, "fd00:96::80"]
  ipFamilies: [IPv4, IPv6]
  ports: [{name: s, port: 3868, nodePort: 30868, protocol: SCTP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sig-4, namespace: t, labels: {kubernetes.io/service-name: sig}}
addressType: IPv4
ports: [{name: s, port: 13868, protocol: SCTP}]
endpoints: [{addresses: ["10.244.1.8"], nodeName: n1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sig-6, namespace: t, labels: {kubernetes.io/service-name: sig}}
addressType: IPv6
ports: [{name: s, port: 13868, protocol: SCTP}]
endpoints: [{addresses: ["fd00:244:1::8"], nodeName: n1}]
"#;

/// SCTP (kube-proxy serves it; this kernel has no SCTP sockets, so the
/// packets are crafted): INIT and DATA chunks to a NodePort from outside
/// and to the ClusterIP from a pod reach the backend's address and port,
/// and the replies come back from the frontend, each with a CRC32c that
/// is right when computed from scratch (its ports changed, short and long
/// packets, both families).
#[test]
fn sctp_packets_are_translated_with_their_crc32c_kept_right() {
    common::require_root!();
    Lab::new().with_node(SCTP_SERVICES, &[NODE_IP, NODE_IP6], |node| {
        let big = vec![0x5a; 1200];
        for (client, frontend, backend, from_pod) in [
            ("192.0.2.7:5000", "172.30.0.11:30868", "10.244.1.8:13868", false),
            ("10.244.1.9:5000", "10.96.0.80:3868", "10.244.1.8:13868", true),
            ("[fd00:244:1::9]:5000", "[fd00:96::80]:3868", "[fd00:244:1::8]:13868", true),
            ("[fd00:30::99]:5000", "[fd00:30::11]:30868", "[fd00:244:1::8]:13868", false),
        ] {
            let (client, frontend, backend) = (sa(client), sa(frontend), sa(backend));
            for (kind, payload) in [(packet::SCTP_INIT, &b"init"[..]), (packet::SCTP_DATA, &big[..])] {
                let frame = packet::sctp(client, frontend, kind, payload);
                let (action, out) = if from_pod { node.pod_ingress(&frame) } else { node.ingress(&frame) };
                assert_eq!(action, OK, "{client} -> {frontend}");
                // `parse` checks the CRC32c from scratch.
                let seen = packet::parse(&out);
                assert_eq!((seen.proto, seen.src, seen.dst), (packet::SCTP, client, backend), "{client} -> {frontend}");
                let reply = packet::sctp(backend, client, packet::SCTP_DATA, payload);
                let (action, out) = if from_pod { node.pod_egress(&reply) } else { node.egress(&reply) };
                assert_eq!(action, OK);
                let back = packet::parse(&out);
                assert_eq!((back.src, back.dst), (frontend, client), "the reply to {client}");
            }
        }
        assert_eq!(node.stat("new_flow"), 2);
        assert_eq!(node.pod_stat("new_flow"), 2);
    });
}

/// Packets routed to the node for a ClusterIP (kube-proxy serves them from
/// PREROUTING): translated on the node's device once the cluster's CIDR is
/// known, with source NAT for a source outside it (kube-proxy's
/// detectLocalMode ClusterCIDR) and none for a pod's; left alone without
/// `--cluster-cidr`.
#[test]
fn packets_routed_to_a_cluster_ip_are_translated_with_the_cluster_cidr() {
    common::require_root!();
    let lab = Lab::new();
    lab.with_node_cidrs(SERVICES, &[NODE_IP], &["10.244.0.0/16"], |node| {
        // From outside the cluster: source NAT, so the reply comes back here.
        let client = sa("192.0.2.7:40000");
        let (action, out) = node.ingress(&packet::frame(client, sa("10.96.0.30:80"), Some(SYN), b""));
        assert_eq!(action, REDIRECT);
        let seen = packet::parse(&out);
        assert!(seen.dst.ip().to_string().starts_with("10.244.2.2"), "{}", seen.dst);
        assert_eq!(seen.src.ip(), NODE_IP.parse::<IpAddr>().unwrap(), "masqueraded: the node's address");
        let (action, out) = node.ingress(&packet::frame(seen.dst, seen.src, Some(SYN | ACK), b""));
        assert_eq!(action, REDIRECT);
        let back = packet::parse(&out);
        assert_eq!((back.src, back.dst), (sa("10.96.0.30:80"), client), "the reply shows the ClusterIP");
        // From a pod of the cluster (another node's): DNAT only.
        let pod = sa("10.244.3.9:40000");
        let (action, out) = node.ingress(&packet::frame(pod, sa("10.96.0.40:80"), Some(SYN), b""));
        assert_eq!(action, OK);
        let seen = packet::parse(&out);
        assert_eq!((seen.src, seen.dst), (pod, sa("10.244.1.6:8080")));
        assert_eq!(node.stat("new_flow"), 2);
    });
    lab.with_node(SERVICES, &[NODE_IP], |node| {
        let frame = packet::frame(sa("192.0.2.7:40000"), sa("10.96.0.30:80"), Some(SYN), b"");
        assert_eq!(
            node.ingress(&frame),
            (OK, frame.clone()),
            "without --cluster-cidr a ClusterIP is not served from outside"
        );
    });
}

/// ICMP errors about a pod's translated flow, on their way into the pod:
/// a router's "fragmentation needed" (IPv6 "packet too big") and a
/// backend's "port unreachable" quote the packet as translated (to the
/// backend); the pod's stack can match them to its socket only when they
/// name the service again, so path MTU discovery works through it. The
/// error's source becomes the service when the backend sent it; every
/// checksum (ICMP, ICMPv6 with its pseudo-header, the quoted IPv4 header)
/// stays right.
#[test]
fn icmp_errors_about_a_pod_s_flow_name_the_service_again() {
    common::require_root!();
    Lab::new().with_node(SERVICES, &[NODE_IP, NODE_IP6], |node| {
        let router: IpAddr = "172.30.0.1".parse().unwrap();
        let router6: IpAddr = "fd00:30::1".parse().unwrap();
        for (pod, frontend, udp, sender) in [
            (sa("10.244.1.9:41000"), sa("10.96.0.40:80"), false, Some(router)),
            (sa("10.244.1.9:41001"), sa("10.96.0.53:53"), true, None),
            (sa("[fd00:244:1::9]:41000"), sa("[fd00:96::10]:80"), false, Some(router6)),
            (sa("[fd00:244:1::9]:41001"), sa("[fd00:96::10]:80"), false, None),
        ] {
            let flags = if udp { None } else { Some(SYN) };
            let (_, out) = node.pod_ingress(&packet::frame(pod, frontend, flags, b"0123456789"));
            let backend = packet::parse(&out).dst;
            // From a router on the way, or (None) from the backend itself.
            let from = sender.unwrap_or(backend.ip());
            let kind = match (pod.is_ipv4(), sender.is_some()) {
                (true, true) => (3, 4),
                (true, false) => (3, 3),
                (false, true) => (2, 0),
                (false, false) => (1, 4),
            };
            let error = packet::icmp_error(from, pod.ip(), kind, &out);
            let (action, back) = node.pod_egress(&error);
            assert_eq!(action, OK);
            let seen = packet::parse_icmp(&back);
            assert_eq!(seen.kind, kind);
            assert_eq!(packet::quoted_ends(&seen.quoted), (pod, frontend), "{kind:?} about {pod} -> {frontend}");
            let want_sender = if sender.is_some() { from } else { frontend.ip() };
            assert_eq!((seen.src, seen.dst), (want_sender, pod.ip()), "{kind:?}");
        }
        // An error about no flow of ours passes untouched.
        let stray = packet::frame(sa("10.244.1.9:42000"), sa("10.244.2.99:80"), Some(SYN), b"");
        let error = packet::icmp_error(router, "10.244.1.9".parse().unwrap(), (3, 4), &stray);
        assert_eq!(node.pod_egress(&error), (OK, error.clone()));
    });
}
