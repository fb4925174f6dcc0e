//! Kernel-test environment: one network namespace, one cgroup, one private
//! bpffs, a services file, HTTP backends and the real agent binary, all
//! removed when the environment is dropped (also when a test fails).
#![allow(dead_code, reason = "each test binary uses a different part")]

pub mod cluster;
pub mod packet;
pub mod topology;

use std::{
    fmt::Write as _,
    io::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Output,
};

use proxy_testkit::{AgentProcess, BpfFs, HttpBackend, NetNs, TestCgroup, UdpBackend, spawn_in, unique_name};

pub const AGENT: &str = env!("CARGO_BIN_EXE_ebpf-proxy");

/// Set by `cargo xtask test`: a kernel test that would skip fails instead,
/// so a run that is meant to test the kernel can never pass by skipping.
pub const REQUIRE_KERNEL_TESTS: &str = "EBPF_PROXY_REQUIRE_KERNEL_TESTS";

/// Returns from the calling test when it cannot run here (not root), after
/// one line on standard error saying so; with `EBPF_PROXY_REQUIRE_KERNEL_TESTS=1`
/// it fails instead. The first line of every kernel test (one that loads
/// programs or makes namespaces, cgroups or a bpffs), so `cargo test` as an
/// ordinary user runs the pure tests and skips these.
#[allow(unused_macros, reason = "each test binary uses a different part")]
macro_rules! require_root {
    () => {
        if !$crate::common::kernel_test_can_run() {
            return;
        }
    };
}
#[allow(unused_imports, reason = "each test binary uses a different part")]
pub(crate) use require_root;

/// Whether a kernel test can run (root); see `require_root!`.
pub fn kernel_test_can_run() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os(REQUIRE_KERNEL_TESTS).is_none_or(|v| v != "1"),
        "kernel test skipped (not root) while {REQUIRE_KERNEL_TESTS}=1: run `cargo xtask test` as root"
    );
    // Past the test harness's capture (which takes only print!/eprint!), so
    // the line shows for a passing test too.
    let test = std::thread::current().name().filter(|n| *n != "main").map(|n| format!("{n}: ")).unwrap_or_default();
    let _ = writeln!(std::io::stderr(), "{test}skipped: kernel test needs root (run cargo xtask test)");
    false
}

/// Fails unless the process is root: the guards below (namespaces,
/// cgroups, bpffs) cannot work otherwise. A kernel test starts with
/// `common::require_root!()`, which skips it first.
pub fn assert_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "a kernel test needs root and must start with `common::require_root!();` so it is skipped without it"
    );
}

/// Address of backend `i` (1-based) inside the test namespace.
pub fn backend_ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, 0, 10 + i)
}

/// IPv6 address of backend `i` (1-based): fd00:244::1i.
pub fn backend_ip6(i: u8) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 0x10 + u16::from(i))
}

// Fields drop in declaration order: the agent first; then the private bpffs,
// whose unmount drops the pinned links (the programs detach) and maps; the
// namespace last.
pub struct Env {
    pub agent: Option<AgentProcess>,
    pub backends: Vec<HttpBackend>,
    pub udp: Vec<UdpBackend>,
    pub bpffs: BpfFs,
    pub cgroup: TestCgroup,
    pub ns: NetNs,
    pub dir: tempfile::TempDir,
}

impl Env {
    /// A namespace with `backends` HTTP servers on 10.244.0.11.. port 8080.
    pub fn new(backends: u8) -> Self {
        assert_root();
        let name = unique_name("ebpf-proxy-test");
        let ns = NetNs::create(&name).expect("create netns");
        let mut list = Vec::new();
        for i in 1..=backends {
            ns.add_lo_addr(&format!("{}/32", backend_ip(i))).expect("add address");
            ns.add_lo_addr(&format!("{}/128", backend_ip6(i))).expect("add IPv6 address");
            list.push(
                HttpBackend::start(&ns, backend_ip(i).into(), 8080, &format!("backend-{i}")).expect("start backend"),
            );
        }
        let cgroup = TestCgroup::create(&name).expect("create cgroup");
        let bpffs = BpfFs::mount_temp(&name).expect("mount bpffs");
        let dir = tempfile::tempdir().expect("tempdir");
        Self { agent: None, backends: list, udp: Vec::new(), bpffs, cgroup, ns, dir }
    }

    pub fn services_file(&self) -> PathBuf {
        self.dir.path().join("services.yaml")
    }

    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs.path().join("ebpf-proxy")
    }

    /// Replaces the services file atomically (write, then rename).
    pub fn write_services(&self, yaml: &str) {
        let tmp = self.dir.path().join(".services.yaml.tmp");
        std::fs::write(&tmp, yaml).expect("write services");
        std::fs::rename(&tmp, self.services_file()).expect("rename services");
    }

    /// Writes `yaml`, waits for the running agent to apply it and returns
    /// the "applied" record.
    pub fn apply(&self, yaml: &str) -> serde_json::Value {
        let agent = self.agent.as_ref().expect("agent running");
        let mark = agent.mark();
        self.write_services(yaml);
        agent.wait_applied(mark)
    }

    /// Starts the agent on the current services file and waits for its
    /// first sync; returns the "applied" record.
    pub fn start_agent(&mut self) -> serde_json::Value {
        let agent = AgentProcess::start(Path::new(AGENT), self.agent_args()).expect("start agent");
        let applied = agent.wait_applied(0);
        self.agent = Some(agent);
        applied
    }

    /// Starts the agent watching `cluster` and waits for its first sync;
    /// returns the "applied" record.
    pub fn start_agent_kube(&mut self, cluster: &cluster::Cluster) -> serde_json::Value {
        let agent = AgentProcess::start(Path::new(AGENT), self.kube_args(cluster)).expect("start agent");
        let applied = agent.wait_applied(0);
        self.agent = Some(agent);
        applied
    }

    /// Arguments for an agent watching `cluster`.
    pub fn kube_args(&self, cluster: &cluster::Cluster) -> Vec<String> {
        let mut args = vec!["--kubeconfig".to_owned(), cluster.kubeconfig.display().to_string()];
        args.extend(self.datapath_args());
        args
    }

    pub fn agent_args(&self) -> Vec<String> {
        let mut args = vec!["--services-file".to_owned(), self.services_file().display().to_string()];
        args.extend(self.datapath_args());
        args
    }

    /// Where the agent attaches and pins: this environment's cgroup and bpffs.
    pub fn datapath_args(&self) -> Vec<String> {
        vec![
            "--cgroup".into(),
            self.cgroup.path().display().to_string(),
            "--bpffs-dir".into(),
            self.pin_dir().display().to_string(),
            "--node-name".into(),
            "test-node".into(),
            "--socket-netns".into(),
            self.ns.path().display().to_string(),
            // The agent runs in the machine's own namespace here: its
            // net.ipv4.ip_local_reserved_ports is the machine's, never the
            // test's to change.
            "--node-port-range".into(),
            "none".into(),
            // Free ports, so tests never collide with each other or a real agent.
            "--healthz-bind-address".into(),
            "127.0.0.1:0".into(),
            "--metrics-bind-address".into(),
            "127.0.0.1:0".into(),
            // The agent runs in the machine's own namespace here: nothing is
            // attached to its devices (the multi-node tests attach to theirs).
            "--devices".into(),
            "none".into(),
            "--pod-devices".into(),
            "none".into(),
            // Its own socket for `ebpf-proxy explain`, never the machine's.
            "--explain-socket".into(),
            self.explain_socket().display().to_string(),
        ]
    }

    /// Where the agent serves `ebpf-proxy explain` (`--explain-socket`).
    pub fn explain_socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    pub fn agent(&self) -> &AgentProcess {
        self.agent.as_ref().expect("agent running")
    }

    /// curl from the cgroup connecting to `http://10.96.0.10/` again and
    /// again, until `check_steady_client` stops it.
    pub fn steady_client(&self) -> std::process::Child {
        spawn_in(&self.ns, Some(&self.cgroup), "curl")
            .expect("prepare curl")
            .args(["-sS", "--connect-timeout", "2", "http://10.96.0.10/?[1-10000000]"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start curl")
    }

    /// curl inside the namespace (and the cgroup when `in_cgroup`).
    pub fn curl(&self, in_cgroup: bool, url: &str) -> Output {
        let cgroup = in_cgroup.then_some(&self.cgroup);
        spawn_in(&self.ns, cgroup, "curl")
            .expect("prepare curl")
            .args(["-sS", "--connect-timeout", "3", "--max-time", "10", url])
            .output()
            .expect("run curl")
    }

    /// `n` requests to `http://ADDR/`, one connection each, from the
    /// cgroup; returns the body lines (backend names) in order. Fails the
    /// test unless every request is answered (curl's exit status after a
    /// URL glob only tells of the last one).
    pub fn requests(&self, addr: &str, n: usize) -> Vec<String> {
        let out = if addr.contains('[') {
            // IPv6 URLs have brackets, which curl's globbing takes: list
            // the URL n times instead.
            let url = format!("http://{addr}/");
            let mut args = vec!["-g", "-sS", "--connect-timeout", "3", "--max-time", "10"];
            args.extend(std::iter::repeat_n(url.as_str(), n));
            spawn_in(&self.ns, Some(&self.cgroup), "curl").expect("prepare curl").args(&args).output().expect("curl")
        } else {
            self.curl(true, &format!("http://{addr}/?[1-{n}]"))
        };
        answered(&out, n, addr)
    }

    /// socat TCP connect to `addr` from inside the namespace; returns
    /// (success, stderr).
    pub fn socat_connect(&self, in_cgroup: bool, addr: &str) -> (bool, String) {
        let cgroup = in_cgroup.then_some(&self.cgroup);
        let out = spawn_in(&self.ns, cgroup, "socat")
            .expect("prepare socat")
            .args(["-T", "2", "-u", "OPEN:/dev/null", &format!("TCP:{addr},connect-timeout=2")])
            .output()
            .expect("run socat");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// UDP echo servers on the first `n` backend addresses, port `port`.
    pub fn start_udp(&mut self, n: u8, port: u16) {
        for i in 1..=n {
            let b =
                UdpBackend::start(&self.ns, backend_ip(i).into(), port, &format!("backend-{i}")).expect("udp backend");
            self.udp.push(b);
        }
    }

    /// HTTP servers on the IPv6 addresses of the first `n` backends, port
    /// 8080, named like the IPv4 ones with a `-v6` suffix.
    pub fn start_http6(&mut self, n: u8) {
        for i in 1..=n {
            let b = HttpBackend::start(&self.ns, backend_ip6(i).into(), 8080, &format!("backend-{i}-v6")).expect("v6");
            self.backends.push(b);
        }
    }

    /// tests/clients/probe.py ARGS, set up to run inside the namespace and
    /// cgroup (python3 is installed by `cargo xtask setup`).
    pub fn probe_command(&self, args: &[&str]) -> std::process::Command {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
        let mut cmd = spawn_in(&self.ns, Some(&self.cgroup), "/usr/bin/python3").expect("prepare probe");
        cmd.arg(script).args(args);
        cmd
    }

    /// Runs the probe with ARGS; returns (success, output lines).
    pub fn probe(&self, args: &[&str]) -> (bool, Vec<String>) {
        let out = self.probe_command(args).output().expect("run python3");
        let lines = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
        (out.status.success(), lines)
    }

    pub fn accepted(&self) -> Vec<usize> {
        self.backends.iter().map(HttpBackend::accepted).collect()
    }
}

/// The output lines of a curl of `n` URLs (to `what`), failing the test
/// unless all were answered (curl's exit status after a URL list only
/// tells of the last one).
pub fn answered(out: &Output, n: usize, what: &str) -> Vec<String> {
    let answers: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
    assert!(
        out.status.success() && answers.len() == n,
        "{} of {n} requests to {what} answered: {}",
        answers.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    answers
}

/// A ClusterIP Service with TCP ports `(name, port)`.
pub fn service(name: &str, cluster_ip: &str, ports: &[(&str, u16)]) -> String {
    let mut s = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: test\nspec:\n  type: ClusterIP\n  clusterIP: {cluster_ip}\n  clusterIPs: [\"{cluster_ip}\"]\n  ports:\n"
    );
    for (pname, port) in ports {
        writeln!(s, "  - {{name: {pname}, port: {port}, protocol: TCP, targetPort: {pname}}}").unwrap();
    }
    s
}

/// An EndpointSlice of service `service` with TCP ports `(name, port)` and
/// ready endpoints at `ips`.
pub fn slice(name: &str, service: &str, ports: &[(&str, u16)], ips: &[Ipv4Addr]) -> String {
    let mut s = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: test\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: IPv4\nports:\n"
    );
    for (pname, port) in ports {
        writeln!(s, "- {{name: {pname}, port: {port}, protocol: TCP}}").unwrap();
    }
    s.push_str("endpoints:\n");
    if ips.is_empty() {
        s.truncate(s.len() - 1);
        s.push_str(" []\n");
    }
    for ip in ips {
        writeln!(s, "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n  nodeName: test-node").unwrap();
    }
    s
}

/// Service `web` on 10.96.0.10:80 in front of backends `which` (1-based).
pub fn web(which: &[u8]) -> String {
    let ips: Vec<Ipv4Addr> = which.iter().map(|i| backend_ip(*i)).collect();
    service("web", "10.96.0.10", &[("http", 80)]) + &slice("web-1", "web", &[("http", 8080)], &ips)
}

/// `frontends` of an "applied" record.
pub fn applied_frontends(applied: &serde_json::Value) -> u64 {
    proxy_testkit::field(applied, "frontends").and_then(serde_json::Value::as_u64).expect("frontends field")
}

/// `writes` of an "applied" record.
pub fn writes(applied: &serde_json::Value) -> u64 {
    proxy_testkit::field(applied, "writes").and_then(serde_json::Value::as_u64).expect("writes field")
}

/// `BPF_PROG_TYPE_CGROUP_SOCK_ADDR` in linux/bpf.h (aya does not re-export
/// the enum its `ProgramInfo::program_type` returns).
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;

/// Ids of the cgroup socket-address programs loaded in the kernel. Tests
/// compare id sets, not counts: a program from an earlier test whose cgroup
/// the kernel is still releasing (asynchronously) may vanish at any moment,
/// and the kernel never reuses a program id.
pub fn sock_addr_programs() -> std::collections::BTreeSet<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.program_type() as u32 == BPF_PROG_TYPE_CGROUP_SOCK_ADDR)
        .map(|p| p.id())
        .collect()
}

/// The socket-address programs loaded since `before` was taken.
pub fn new_sock_addr_programs(before: &std::collections::BTreeSet<u32>) -> Vec<u32> {
    sock_addr_programs().difference(before).copied().collect()
}

/// Waits up to 5 s for every socket-address program loaded since `before`
/// to be gone; returns those still loaded.
pub fn wait_new_sock_addr_programs_gone(before: &std::collections::BTreeSet<u32>) -> Vec<u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = new_sock_addr_programs(before);
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The address the agent logged it serves `what` on ("health", "metrics").
pub fn agent_address(agent: &AgentProcess, what: &str) -> String {
    let record = agent
        .wait_for(0, std::time::Duration::from_secs(10), |r| {
            proxy_testkit::message(r) == Some(&format!("serving {what}"))
        })
        .expect("the agent logs where it serves");
    proxy_testkit::field(&record, "address").and_then(|a| a.as_str()).expect("address").to_owned()
}

/// Waits until `agent` serves traffic from outside, from when its
/// `/healthz` can say healthy (after the first sync, once the TC
/// programs are attached: src/observe/health.rs).
pub fn wait_outside_served(agent: &proxy_testkit::AgentProcess) {
    agent
        .wait_for(0, std::time::Duration::from_secs(30), |r| {
            proxy_testkit::message(r) == Some(ebpf_proxy::agent::OUTSIDE_SERVED)
        })
        .expect("the agent serves traffic from outside");
}

/// GET over loopback with curl: (status, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    http_get_in(None, addr, path)
}

/// GET with curl, inside network namespace `ns` when given: (status, body).
pub fn http_get_in(ns: Option<&NetNs>, addr: &str, path: &str) -> (u16, String) {
    let mut curl = match ns {
        Some(ns) => spawn_in(ns, None, "curl").expect("prepare curl"),
        None => std::process::Command::new("curl"),
    };
    let out = curl
        .args(["-sS", "--max-time", "3", "-w", "\n%{http_code}"])
        .arg(format!("http://{addr}{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("status line");
    (code.parse().expect("status"), body.to_owned())
}

/// The value of metric line `name` (with its labels) in a /metrics text.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
        .parse()
        .expect("a number")
}

/// Stops a `steady_client` and checks that it ran and that no connection
/// failed `during` what the test did.
pub fn check_steady_client(mut client: std::process::Child, during: &str) {
    use std::io::Read as _;
    let _ = client.kill();
    let _ = client.wait();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    client.stdout.take().expect("piped").read_to_string(&mut stdout).expect("read curl's output");
    client.stderr.take().expect("piped").read_to_string(&mut stderr).expect("read curl's errors");
    // The point is that none fails; this only checks that the client ran.
    assert!(stdout.lines().count() > 20, "only {} requests", stdout.lines().count());
    assert!(!stderr.contains("curl: ("), "a connection failed {during}: {stderr}");
}
