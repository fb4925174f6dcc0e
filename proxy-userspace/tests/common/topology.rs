//! A small cluster in network namespaces, for traffic from outside the
//! node: a `lan` namespace with a bridge; node namespaces on it, each with
//! `eth0` (172.30.0.1N), a `cni0` bridge for its pods (10.244.N.0/24),
//! routes to the other nodes' pods and forwarding on; pods as namespaces
//! behind their node; an external client (172.30.0.100 and .101) on the
//! lan. One real agent per node runs inside its node's namespace, with its
//! own cgroup (its pods' processes join it), its own pin directory, and the
//! devices it finds itself. Nothing touches the machine's own namespace;
//! everything is removed on drop, also when a test fails.
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use proxy_testkit::{
    AgentProcess, BpfFs, HttpBackend, NetNs, TestCgroup, UdpBackend, message, sh, spawn_in, unique_name,
};

use super::AGENT;

/// The external client's addresses.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 100);
pub const CLIENT2: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 101);

/// Node `n`'s address (1-based).
#[must_use]
pub fn node_ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(172, 30, 0, 10 + n)
}

/// Pod `k` of node `n`.
#[must_use]
pub fn pod_ip(n: u8, k: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, n, 10 + k)
}

/// A child process killed on drop (servers started inside a namespace).
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Pod {
    pub name: String,
    pub ip: Ipv4Addr,
    pub ns: NetNs,
}

pub struct Node {
    pub n: u8,
    pub ns: NetNs,
    pub cgroup: TestCgroup,
    pub pin_dir: PathBuf,
    pub pods: Vec<Pod>,
}

impl Node {
    /// `program` inside this node's namespace (its own processes).
    pub fn command(&self, program: &str) -> Command {
        spawn_in(&self.ns, None, program).expect("prepare a command on the node")
    }
}

// Fields drop in declaration order: agents and servers first, then the
// private bpffs (its unmount drops the pinned links: the programs detach),
// then the cgroups (inside nodes) and namespaces.
pub struct Topology {
    pub agents: Vec<Option<AgentProcess>>,
    pub http: Vec<HttpBackend>,
    pub udp: Vec<UdpBackend>,
    pub servers: Vec<ChildGuard>,
    /// XDP pass programs on the lan's veth peers (`prepare_veths_for_xdp`).
    pub xdp_pass: Vec<proxy_testkit::veth_xdp::PassAll>,
    pub bpffs: BpfFs,
    pub nodes: Vec<Node>,
    pub client: NetNs,
    pub lan: NetNs,
    pub dir: tempfile::TempDir,
}

fn netns(prefix: &str) -> NetNs {
    NetNs::create(&unique_name(prefix)).expect("create a namespace")
}

fn sysctl(ns: &NetNs, key: &str, value: &str) {
    sh("ip", &["netns", "exec", ns.name(), "sysctl", "-qw", &format!("{key}={value}")]).expect("sysctl");
}

/// A veth pair: `inner` in `ns`, `outer` in `outer_ns`.
fn veth(ns: &NetNs, inner: &str, outer_ns: &NetNs, outer: &str) {
    ns.ip(&["link", "add", inner, "type", "veth", "peer", "name", outer, "netns", outer_ns.name()]).expect("veth");
    ns.ip(&["link", "set", inner, "up"]).expect("up");
    outer_ns.ip(&["link", "set", outer, "up"]).expect("up");
}

impl Topology {
    /// `nodes` nodes with `pods[n-1]` pods each.
    pub fn new(pods: &[u8]) -> Self {
        super::assert_root();
        let lan = netns("ebpf-proxy-lan");
        lan.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
        lan.ip(&["link", "set", "br0", "up"]).unwrap();
        let bpffs = BpfFs::mount_temp(&unique_name("ebpf-proxy-topo")).unwrap();
        let mut nodes = Vec::new();
        for (i, pod_count) in pods.iter().enumerate() {
            let n = u8::try_from(i + 1).unwrap();
            let ns = netns(&format!("ebpf-proxy-n{n}"));
            let port = format!("vn{n}");
            veth(&ns, "eth0", &lan, &port);
            lan.ip(&["link", "set", &port, "master", "br0"]).unwrap();
            ns.ip(&["addr", "add", &format!("{}/24", node_ip(n)), "dev", "eth0"]).unwrap();
            ns.ip(&["link", "add", "cni0", "type", "bridge"]).unwrap();
            ns.ip(&["link", "set", "cni0", "up"]).unwrap();
            ns.ip(&["addr", "add", &format!("10.244.{n}.1/24"), "dev", "cni0"]).unwrap();
            for other in 1..=u8::try_from(pods.len()).unwrap() {
                if other != n {
                    let dst = format!("10.244.{other}.0/24");
                    ns.ip(&["route", "add", &dst, "via", &node_ip(other).to_string(), "dev", "eth0"]).unwrap();
                }
            }
            sysctl(&ns, "net.ipv4.ip_forward", "1");
            let mut node_pods = Vec::new();
            for k in 1..=*pod_count {
                let pod_ns = netns(&format!("ebpf-proxy-p{n}{k}"));
                let peer = format!("vp{k}");
                veth(&pod_ns, "eth0", &ns, &peer);
                ns.ip(&["link", "set", &peer, "master", "cni0"]).unwrap();
                pod_ns.ip(&["addr", "add", &format!("{}/24", pod_ip(n, k)), "dev", "eth0"]).unwrap();
                pod_ns.ip(&["route", "add", "default", "via", &format!("10.244.{n}.1")]).unwrap();
                node_pods.push(Pod { name: format!("pod-{n}-{k}"), ip: pod_ip(n, k), ns: pod_ns });
            }
            let cgroup = TestCgroup::create(&unique_name(&format!("ebpf-proxy-n{n}"))).unwrap();
            let pin_dir = bpffs.path().join(format!("node{n}"));
            nodes.push(Node { n, ns, cgroup, pin_dir, pods: node_pods });
        }
        let client = netns("ebpf-proxy-client");
        veth(&client, "eth0", &lan, "vc");
        lan.ip(&["link", "set", "vc", "master", "br0"]).unwrap();
        for ip in [CLIENT, CLIENT2] {
            client.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]).unwrap();
        }
        let agents = nodes.iter().map(|_| None).collect();
        let dir = tempfile::tempdir().unwrap();
        Self {
            agents,
            http: Vec::new(),
            udp: Vec::new(),
            servers: Vec::new(),
            xdp_pass: Vec::new(),
            bpffs,
            nodes,
            client,
            lan,
            dir,
        }
    }

    #[must_use]
    pub fn node(&self, n: u8) -> &Node {
        &self.nodes[usize::from(n - 1)]
    }

    #[must_use]
    pub fn pod(&self, n: u8, k: u8) -> &Pod {
        &self.node(n).pods[usize::from(k - 1)]
    }

    /// Adds IPv6 beside IPv4: node `n` fd00:30::1N/64 on eth0 (and
    /// forwarding), its pods fd00:244:N::1K behind fd00:244:N::1/64 on
    /// cni0, routes to the other nodes' pods, the client fd00:30::100.
    pub fn enable_ipv6(&self) {
        let count = u8::try_from(self.nodes.len()).unwrap();
        for node in &self.nodes {
            let n = node.n;
            node.ns.ip(&["addr", "add", &format!("fd00:30::1{n}/64"), "dev", "eth0", "nodad"]).unwrap();
            node.ns.ip(&["addr", "add", &format!("fd00:244:{n}::1/64"), "dev", "cni0", "nodad"]).unwrap();
            sysctl(&node.ns, "net.ipv6.conf.all.forwarding", "1");
            for other in (1..=count).filter(|o| *o != n) {
                let (net, via) = (format!("fd00:244:{other}::/64"), format!("fd00:30::1{other}"));
                node.ns.ip(&["-6", "route", "add", &net, "via", &via, "dev", "eth0"]).unwrap();
            }
            for (k, pod) in (1..).zip(&node.pods) {
                pod.ns.ip(&["addr", "add", &format!("fd00:244:{n}::1{k}/64"), "dev", "eth0", "nodad"]).unwrap();
                pod.ns.ip(&["-6", "route", "add", "default", "via", &format!("fd00:244:{n}::1")]).unwrap();
            }
        }
        self.client.ip(&["addr", "add", "fd00:30::100/64", "dev", "eth0", "nodad"]).unwrap();
    }

    /// The client sends traffic for `net` (LoadBalancer or external IPs) to
    /// node `n`, as a load balancer or router would.
    pub fn route_to_node(&self, net: &str, n: u8) {
        self.client.ip(&["route", "replace", net, "via", &node_ip(n).to_string()]).unwrap();
    }

    /// An HTTP server on pod (n, k), port 8080, answering its pod's name.
    pub fn http_on(&mut self, n: u8, k: u8) {
        let pod = self.pod(n, k);
        let server = HttpBackend::start(&pod.ns, pod.ip.into(), 8080, &pod.name).expect("http backend");
        self.http.push(server);
    }

    /// A UDP echo server on pod (n, k), port 5353, answering `NAME:PAYLOAD`.
    pub fn udp_on(&mut self, n: u8, k: u8) {
        let pod = self.pod(n, k);
        let server = UdpBackend::start(&pod.ns, pod.ip.into(), 5353, &pod.name).expect("udp backend");
        self.udp.push(server);
    }

    /// A TCP echo server (tests/clients/probe.py) on pod (n, k), `port`.
    pub fn tcp_echo_on(&mut self, n: u8, k: u8, port: u16) {
        use std::io::BufRead as _;
        let pod = self.pod(n, k);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
        let mut child = spawn_in(&pod.ns, None, "/usr/bin/python3")
            .unwrap()
            .arg(script)
            .args(["tcp-echo-server", &pod.ip.to_string(), &port.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        self.servers.push(ChildGuard(child));
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "listening", "the echo server on pod {n}-{k} did not start");
    }

    /// The HTTP server of pod `name`.
    #[must_use]
    pub fn http_server(&self, name: &str) -> &HttpBackend {
        self.http.iter().find(|b| b.name() == name).expect("an http backend of that name")
    }

    pub fn services_file(&self) -> PathBuf {
        self.dir.path().join("services.yaml")
    }

    /// Replaces the services file atomically.
    pub fn write_services(&self, yaml: &str) {
        let tmp = self.dir.path().join(".services.yaml.tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.services_file()).unwrap();
    }

    /// Writes `yaml` and waits until every running agent applied it.
    pub fn apply(&self, yaml: &str) {
        let marks: Vec<Option<usize>> = self.agents.iter().map(|a| a.as_ref().map(AgentProcess::mark)).collect();
        self.write_services(yaml);
        for (agent, mark) in self.agents.iter().zip(marks) {
            if let (Some(agent), Some(mark)) = (agent, mark) {
                let _ = agent.wait_applied(mark);
            }
        }
    }

    /// The arguments of node `n`'s agent.
    #[must_use]
    pub fn agent_args(&self, n: u8) -> Vec<String> {
        let node = self.node(n);
        [
            "--services-file",
            &self.services_file().display().to_string(),
            "--node-name",
            &format!("n{n}"),
            "--node-ip",
            &node_ip(n).to_string(),
            "--cgroup",
            &node.cgroup.path().display().to_string(),
            "--bpffs-dir",
            &node.pin_dir.display().to_string(),
            // Inside the node's namespace: its own loopback.
            "--healthz-bind-address",
            "127.0.0.1:0",
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--maglev-table-size",
            "1021",
            // Not the machine's socket (several nodes' agents run at once).
            "--explain-socket",
            "none",
        ]
        .iter()
        .map(ToString::to_string)
        .collect()
    }

    /// Starts node `n`'s agent (in its namespace, devices found by itself)
    /// and waits for its first sync and for its TC programs to attach.
    pub fn start_agent(&mut self, n: u8) {
        self.start_agent_with(n, &[]);
    }

    /// `start_agent` with `extra` arguments.
    pub fn start_agent_with(&mut self, n: u8, extra: &[&str]) {
        let mut args = self.agent_args(n);
        args.extend(extra.iter().map(ToString::to_string));
        self.start_agent_args(n, args);
    }

    /// `start_agent` with these arguments instead of `agent_args`.
    pub fn start_agent_args(&mut self, n: u8, args: Vec<String>) {
        let agent = AgentProcess::start_in(&self.node(n).ns, Path::new(AGENT), args).unwrap();
        self.adopt_agent(n, agent);
    }

    /// `start_agent_with`, the agent's process in `cgroup` (one made with
    /// a memory limit, `TestCgroup::with_memory_limit`).
    pub fn start_agent_in(&mut self, n: u8, extra: &[&str], cgroup: &TestCgroup) {
        let mut args = self.agent_args(n);
        args.extend(extra.iter().map(ToString::to_string));
        let cmd = spawn_in(&self.node(n).ns, Some(cgroup), AGENT).unwrap();
        let agent = AgentProcess::start_command(cmd, args).unwrap();
        self.adopt_agent(n, agent);
    }

    /// Waits for node `n`'s `agent` to sync and attach its TC programs,
    /// and keeps it (stopped when the topology goes).
    fn adopt_agent(&mut self, n: u8, agent: AgentProcess) {
        let _ = agent.wait_applied(0);
        agent
            .wait_for(0, std::time::Duration::from_secs(10), |r| {
                message(r).is_some_and(|m| m.starts_with("serving traffic from outside"))
            })
            .expect("the agent attached no TC program");
        self.agents[usize::from(n - 1)] = Some(agent);
    }

    pub fn start_agents(&mut self) {
        for n in 1..=u8::try_from(self.nodes.len()).unwrap() {
            self.start_agent(n);
        }
    }

    /// Stops node `n`'s agent (its datapath stays, pinned).
    pub fn stop_agent(&mut self, n: u8) {
        self.agents[usize::from(n - 1)].take();
    }

    /// curl from the client (from `source`) to `url`: (exit ok, body).
    #[must_use]
    pub fn curl_from(&self, source: Ipv4Addr, url: &str) -> (bool, String) {
        let out = spawn_in(&self.client, None, "curl")
            .unwrap()
            .args(["-sS", "--connect-timeout", "2", "--max-time", "5", "--interface", &source.to_string(), url])
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `n` requests, one connection each, from the client to `http://ADDR/`;
    /// the answering pods' names, failing the test unless all answer.
    #[must_use]
    pub fn requests(&self, addr: &str, n: usize) -> Vec<String> {
        let out = spawn_in(&self.client, None, "curl")
            .unwrap()
            .args(["-sS", "--connect-timeout", "2", "--max-time", "10", &format!("http://{addr}/?[1-{n}]")])
            .output()
            .unwrap();
        super::answered(&out, n, addr)
    }

    /// curl from inside pod (n, k), which is in its node's cgroup (so its
    /// node's socket programs translate its connections).
    #[must_use]
    pub fn curl_from_pod(&self, n: u8, k: u8, url: &str) -> (bool, String) {
        let out = spawn_in(&self.pod(n, k).ns, Some(&self.node(n).cgroup), "curl")
            .unwrap()
            .args(["-sS", "--connect-timeout", "2", "--max-time", "5", url])
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// tests/clients/probe.py ARGS from the client: (ok, output lines).
    #[must_use]
    pub fn probe(&self, args: &[&str]) -> (bool, Vec<String>) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
        let out = spawn_in(&self.client, None, "/usr/bin/python3").unwrap().arg(script).args(args).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect())
    }

    /// Node `n`'s agent's /metrics (read in the node's namespace).
    pub fn metrics(&self, n: u8) -> String {
        let agent = self.agents[usize::from(n - 1)].as_ref().expect("node n's agent runs");
        let record = agent
            .wait_for(0, std::time::Duration::from_secs(10), |r| {
                message(r).is_some_and(|m| m.starts_with("serving metrics"))
            })
            .expect("the agent serves no metrics");
        let address = proxy_testkit::field(&record, "address").and_then(|a| a.as_str()).unwrap().to_owned();
        let out = self.node(n).command("curl").args(["-sS", &format!("http://{address}/metrics")]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts `python3 -m http.server` in pod (n, k) on 8080, serving a
    /// directory with `name.txt` holding the pod's name.
    pub fn python_http_server(&mut self, n: u8, k: u8) {
        let pod = self.pod(n, k);
        let root = self.dir.path().join(&pod.name);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("name.txt"), format!("{}\n", pod.name)).unwrap();
        let child = spawn_in(&pod.ns, None, "/usr/bin/python3")
            .unwrap()
            .args(["-m", "http.server", "8080", "--bind", &pod.ip.to_string(), "--directory"])
            .arg(&root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait until it listens (from its own namespace).
        let url = format!("http://{}:8080/name.txt", pod.ip);
        let ns_path = pod.ns.name().to_owned();
        self.servers.push(ChildGuard(child));
        let pod = self.pod(n, k);
        debug_assert_eq!(pod.ns.name(), ns_path);
        for _ in 0..100 {
            let ok = spawn_in(&pod.ns, None, "curl").unwrap().args(["-s", "-o", "/dev/null", &url]).status().unwrap();
            if ok.success() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("python3 -m http.server did not start in {}", pod.name);
    }
}

/// `IP:PORT` of node `n`'s address.
#[must_use]
pub fn on_node(n: u8, port: u16) -> String {
    format!("{}:{port}", node_ip(n))
}
