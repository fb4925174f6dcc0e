//! `--take-over-from-kube-proxy` in the kernel: a namespace with
//! kube-proxy-shaped rules (iptables-nft, iptables-legacy, nftables) in
//! front of real backends, connections through them, then the agent
//! started in the namespace with the flag. Checked: the rules are removed
//! (and nobody else's), a connection made through kube-proxy's DNAT before
//! the agent started keeps working to its end (conntrack), a steady client
//! sees no failure across the takeover, new connections go through
//! ebpf-proxy, and rules that differ from the table make it refuse, report
//! and keep them until they agree.
mod common;

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Read as _},
    net::Ipv4Addr,
    path::Path,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use common::{
    AGENT, Env, backend_ip, require_root, service, slice,
    topology::{ChildGuard, Topology, node_ip, pod_ip},
};
use proxy_testkit::{AgentProcess, field, message, spawn_in};

/// The echo service's address and port (its backend: backend 1, port 9000).
const ECHO: &str = "10.96.0.11:9000";
const REMOVED: &str = "took over from kube-proxy: its rules are removed";
const REFUSED: &str = "kube-proxy's rules differ from ebpf-proxy's table";

/// Kills the child on drop (by its pid, which this test started).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `web` (10.96.0.10:80 in front of backends `web` on 8080) and `echo`
/// (10.96.0.11:9000 in front of backend 1 on 9000) as a services file.
fn services(web: &[u8]) -> String {
    let ips: Vec<Ipv4Addr> = web.iter().map(|i| backend_ip(*i)).collect();
    service("web", "10.96.0.10", &[("http", 80)])
        + &slice("web-1", "web", &[("http", 8080)], &ips)
        + &service("echo", "10.96.0.11", &[("echo", 9000)])
        + &slice("echo-1", "echo", &[("echo", 9000)], &[backend_ip(1)])
}

/// The same two services as kube-proxy's iptables mode writes them
/// (pkg/proxy/iptables/proxier.go), with one rule and chain of someone
/// else's in each table.
fn iptables_rules(web: &[u8]) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    let mut service = |name: &str, vip: &str, port: u16, backends: Vec<(Ipv4Addr, u16)>| {
        let svc = format!("KUBE-SVC-{}", name.to_uppercase());
        let _ = writeln!(chains, ":{svc} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {vip}/32 -p tcp -m comment --comment \"test/{name}:{name} cluster IP\" -m tcp --dport {port} -j {svc}"
        );
        for (i, (ip, bport)) in backends.iter().enumerate() {
            let sep = format!("KUBE-SEP-{}{i}", name.to_uppercase());
            let _ = writeln!(chains, ":{sep} - [0:0]");
            let left = backends.len() - i;
            let random = if left > 1 {
                format!(
                    " -m statistic --mode random --probability {:.11}",
                    1.0 / f64::from(u32::try_from(left).unwrap())
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                rules,
                "-A {svc} -m comment --comment \"test/{name}:{name} -> {ip}:{bport}\"{random} -j {sep}"
            );
            let _ =
                writeln!(rules, "-A {sep} -s {ip}/32 -m comment --comment \"test/{name}:{name}\" -j KUBE-MARK-MASQ");
            let _ = writeln!(
                rules,
                "-A {sep} -p tcp -m comment --comment \"test/{name}:{name}\" -m tcp -j DNAT --to-destination {ip}:{bport}"
            );
        }
    };
    service("web", "10.96.0.10", 80, web.iter().map(|i| (backend_ip(*i), 8080)).collect());
    service("echo", "10.96.0.11", 9000, vec![(backend_ip(1), 9000)]);
    format!(
        "*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n:OTHER - [0:0]\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
         -A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
         -A INPUT -s 198.51.100.7/32 -j OTHER\n-A OTHER -j ACCEPT\nCOMMIT\n\
         *nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
         :KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n{chains}\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A POSTROUTING -d 198.51.100.7/32 -j RETURN\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         {rules}\
         -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
         COMMIT\n"
    )
}

/// The same two services as kube-proxy's nftables mode writes them
/// (pkg/proxy/nftables/proxier.go), and a table of someone else's.
fn nft_rules(web: &[u8]) -> String {
    let mut out = String::from(
        "table ip kube-proxy {\n  chain mark-for-masquerade {\n    mark set mark or 0x4000\n  }\n\
         chain masquerading {\n    mark and 0x4000 == 0 return\n    mark set mark xor 0x4000\n    masquerade fully-random\n  }\n\
         chain nat-output {\n    type nat hook output priority -100; policy accept;\n    jump services\n  }\n\
         chain nat-postrouting {\n    type nat hook postrouting priority 100; policy accept;\n    jump masquerading\n  }\n",
    );
    let mut elements = Vec::new();
    let mut service = |name: &str, vip: &str, port: u16, backends: Vec<(Ipv4Addr, u16)>| {
        let chain = format!("service-ABCDEFGH-test/{name}/tcp/{name}");
        let mut arms = Vec::new();
        for (i, (ip, bport)) in backends.iter().enumerate() {
            let ep = format!("endpoint-{i:08}-test/{name}/tcp/{name}__{ip}/{bport}");
            let _ = write!(
                out,
                "  chain {ep} {{\n    ip saddr {ip} jump mark-for-masquerade\n    meta l4proto tcp dnat to {ip}:{bport}\n  }}\n"
            );
            arms.push(format!("{i} : goto {ep}"));
        }
        let _ = write!(
            out,
            "  chain {chain} {{\n    numgen random mod {} vmap {{ {} }}\n  }}\n",
            backends.len(),
            arms.join(", ")
        );
        elements.push(format!("{vip} . tcp . {port} : goto {chain}"));
    };
    service("web", "10.96.0.10", 80, web.iter().map(|i| (backend_ip(*i), 8080)).collect());
    service("echo", "10.96.0.11", 9000, vec![(backend_ip(1), 9000)]);
    let _ = write!(
        out,
        "  map service-ips {{\n    type ipv4_addr . inet_proto . inet_service : verdict\n    elements = {{ {} }}\n  }}\n\
         chain services {{\n    ip daddr . meta l4proto . th dport vmap @service-ips\n  }}\n}}\n\
         table ip other {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    ip saddr 198.51.100.7 accept\n  }}\n}}\n",
        elements.join(", ")
    );
    out
}

/// Runs `program args` in the test's namespace with `input` on stdin.
fn run_in(env: &Env, program: &str, args: &[&str], input: &str) -> String {
    let mut child = spawn_in(&env.ns, None, program)
        .expect("prepare")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The namespace set up for the rules: a route for the service range
/// (kube-proxy's DNAT happens after the routing decision of a locally made
/// packet, so the service address needs one; it only leads to lo, inside
/// this namespace) and the echo backend.
fn prepare(env: &Env) -> Guard {
    env.ns.ip(&["route", "add", "10.96.0.0/16", "dev", "lo"]).expect("route");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    let server = spawn_in(&env.ns, None, "/usr/bin/python3")
        .expect("prepare echo")
        .arg(&script)
        .args(["tcp-echo-server", &backend_ip(1).to_string(), "9000"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start echo");
    std::thread::sleep(Duration::from_millis(300));
    Guard(server)
}

/// A connection to the echo service held for `seconds`, made now; returns
/// once it is connected.
fn hold(env: &Env, seconds: f32) -> Held {
    hold_in(&env.ns, Some(&env.cgroup), ECHO, seconds)
}

type Held = (Guard, BufReader<std::process::ChildStdout>);

/// A connection to `target` held for `seconds` from `ns` (and `cgroup`),
/// made now; returns once it is connected (to `target`, as the client
/// sees it).
fn hold_in(ns: &proxy_testkit::NetNs, cgroup: Option<&proxy_testkit::TestCgroup>, target: &str, seconds: f32) -> Held {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/hold.py");
    let (host, port) = target.split_once(':').unwrap();
    let mut child = spawn_in(ns, cgroup, "/usr/bin/python3")
        .expect("prepare hold")
        .arg(&script)
        .args(["hold", host, port, &seconds.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start hold");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first.trim(), format!("connected {target}"));
    (Guard(child), out)
}

/// Waits for the held connection's end: every round trip answered.
fn check_held(mut held: Held) -> String {
    let status = held.0.0.wait().unwrap();
    let mut rest = String::new();
    held.1.read_to_string(&mut rest).unwrap();
    assert!(status.success() && rest.starts_with("ok "), "the held connection broke: {rest}");
    rest
}

fn start_agent(env: &mut Env) {
    let mut args = env.agent_args();
    args.push("--take-over-from-kube-proxy".into());
    env.agent = Some(AgentProcess::start_in(&env.ns, Path::new(AGENT), args).expect("start agent"));
}

fn wait_message(agent: &AgentProcess, skip: usize, text: &str) -> serde_json::Value {
    agent
        .wait_for(skip, Duration::from_secs(30), |r| message(r) == Some(text))
        .unwrap_or_else(|e| panic!("waiting for {text:?}: {e}"))
}

#[test]
fn takeover_from_iptables_nft_keeps_connections_and_removes_only_kube_proxys_rules() {
    require_root!();
    let mut env = Env::new(2);
    let _echo = prepare(&env);
    env.write_services(&services(&[1, 2]));
    run_in(&env, "iptables-nft-restore", &[], &iptables_rules(&[1, 2]));
    // Through kube-proxy's rules, before the agent.
    let answers = env.requests("10.96.0.10:80", 6);
    assert!(answers.iter().all(|a| a.starts_with("backend-")), "{answers:?}");
    let held = hold(&env, 8.0);
    let steady = env.steady_client();
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    start_agent(&mut env);
    let removed = wait_message(env.agent(), 0, REMOVED);
    eprintln!("rules removed {:?} after the agent started: {removed}", started.elapsed());
    assert_eq!(field(&removed, "frontends").and_then(serde_json::Value::as_u64), Some(2));
    // Nothing of kube-proxy's is left, the rest is.
    for table in ["nat", "filter"] {
        let saved = run_in(&env, "iptables-nft-save", &["-t", table], "");
        assert!(!saved.contains("KUBE-"), "{saved}");
        assert!(saved.contains("198.51.100.7"), "someone else's rule went: {saved}");
    }
    let keeper = run_in(&env, "nft", &["list", "table", "ip", "ebpf-proxy-conntrack"], "");
    assert!(keeper.contains("ct state established,related counter"), "{keeper}");
    // New connections: ebpf-proxy's, to both backends.
    let mut answers = env.requests("10.96.0.10:80", 20);
    answers.sort();
    answers.dedup();
    assert_eq!(answers, ["backend-1", "backend-2"]);
    std::thread::sleep(Duration::from_secs(1));
    common::check_steady_client(steady, "across the takeover");
    let held = check_held(held);
    eprintln!("held connection: {held}");
}

#[test]
fn takeover_refuses_while_the_rules_differ_and_proceeds_once_they_agree() {
    require_root!();
    let mut env = Env::new(3);
    let _echo = prepare(&env);
    // kube-proxy's rules (iptables-legacy) send web to backends 1 and 3;
    // the table says 1 and 2.
    env.write_services(&services(&[1, 2]));
    run_in(&env, "iptables-legacy-restore", &[], &iptables_rules(&[1, 3]));
    start_agent(&mut env);
    let agent = env.agent();
    let difference = wait_message(agent, 0, REFUSED);
    let text = field(&difference, "difference").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned();
    assert_eq!(
        text,
        "10.96.0.10:80/TCP (test/web:http) has other backends: only kube-proxy's rules 10.244.0.13:8080, only ebpf-proxy 10.244.0.12:8080"
    );
    let summary = agent
        .wait_for(0, Duration::from_secs(5), |r| {
            message(r).is_some_and(|m| m.starts_with("not taking over from kube-proxy"))
        })
        .unwrap();
    assert_eq!(field(&summary, "differences").and_then(serde_json::Value::as_u64), Some(1));
    let metrics = common::agent_address(agent, "metrics");
    let differences = || {
        let (status, text) = common::http_get_in(Some(&env.ns), &metrics, "/metrics");
        assert_eq!(status, 200);
        common::metric(&text, "ebpf_proxy_takeover_differences")
    };
    assert!((differences() - 1.0).abs() < f64::EPSILON);
    // The rules stay, and keep serving what they served; new connections
    // from the agent's cgroup are ebpf-proxy's.
    assert!(run_in(&env, "iptables-legacy-save", &["-t", "nat"], "").contains("KUBE-SVC-WEB"));
    let mut answers = env.requests("10.96.0.10:80", 20);
    answers.sort();
    answers.dedup();
    assert_eq!(answers, ["backend-1", "backend-2"]);
    // The table moves to what the rules say: the next check (at most
    // 10 s after the last) takes over.
    let mark = agent.mark();
    env.write_services(&services(&[1, 3]));
    wait_message(env.agent(), mark, REMOVED);
    assert!(differences().abs() < f64::EPSILON);
    for table in ["nat", "filter"] {
        let saved = run_in(&env, "iptables-legacy-save", &["-t", table], "");
        assert!(!saved.contains("KUBE-") && saved.contains("198.51.100.7"), "{saved}");
    }
}

#[test]
fn takeover_from_nftables_deletes_the_kube_proxy_table_only() {
    require_root!();
    let mut env = Env::new(2);
    let _echo = prepare(&env);
    env.write_services(&services(&[1, 2]));
    run_in(&env, "nft", &["-f", "-"], &nft_rules(&[1, 2]));
    // A keeper from an earlier takeover is kept as it is.
    run_in(&env, "nft", &["-f", "-"], &ebpf_proxy::takeover::keeper("ip"));
    let answers = env.requests("10.96.0.10:80", 4);
    assert!(answers.iter().all(|a| a.starts_with("backend-")), "{answers:?}");
    let held = hold(&env, 6.0);
    start_agent(&mut env);
    let removed = wait_message(env.agent(), 0, REMOVED);
    assert_eq!(field(&removed, "nft_tables").and_then(serde_json::Value::as_str), Some("ip kube-proxy"));
    // Someone else's table stays; the keeper of conntrack is added.
    let tables = run_in(&env, "nft", &["list", "tables"], "");
    let mut tables: Vec<&str> = tables.lines().collect();
    tables.sort_unstable();
    assert_eq!(tables, ["table ip ebpf-proxy-conntrack", "table ip other"]);
    let keeper = run_in(&env, "nft", &["list", "table", "ip", "ebpf-proxy-conntrack"], "");
    assert_eq!(keeper.matches("ct state established,related counter").count(), 1, "{keeper}");
    let mut answers = env.requests("10.96.0.10:80", 20);
    answers.sort();
    answers.dedup();
    assert_eq!(answers, ["backend-1", "backend-2"]);
    check_held(held);
}

/// kube-proxy's rules on a node for NodePort 30090 (ClusterIP 10.96.0.30
/// port 9000) in front of pods (1, 1) and (2, 1) on port 9000, as
/// `iptables-restore` input: KUBE-NODEPORTS, KUBE-EXT (masquerade), the
/// service and endpoint chains.
fn node_port_rules() -> String {
    let (a, b) = (pod_ip(1, 1), pod_ip(2, 1));
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
         :KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
         :KUBE-EXT-NP - [0:0]\n:KUBE-SVC-NP - [0:0]\n:KUBE-SEP-NP1 - [0:0]\n:KUBE-SEP-NP2 - [0:0]\n\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         -A KUBE-SERVICES -d 10.96.0.30/32 -p tcp -m comment --comment \"t/np:echo cluster IP\" -m tcp --dport 9000 -j KUBE-SVC-NP\n\
         -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
         -A KUBE-NODEPORTS -p tcp -m comment --comment \"t/np:echo\" -m tcp --dport 30090 -j KUBE-EXT-NP\n\
         -A KUBE-EXT-NP -m comment --comment \"masquerade traffic for t/np:echo external destinations\" -j KUBE-MARK-MASQ\n\
         -A KUBE-EXT-NP -j KUBE-SVC-NP\n\
         -A KUBE-SVC-NP -m comment --comment \"t/np:echo -> {a}:9000\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-NP1\n\
         -A KUBE-SVC-NP -m comment --comment \"t/np:echo -> {b}:9000\" -j KUBE-SEP-NP2\n\
         -A KUBE-SEP-NP1 -s {a}/32 -j KUBE-MARK-MASQ\n-A KUBE-SEP-NP1 -p tcp -m tcp -j DNAT --to-destination {a}:9000\n\
         -A KUBE-SEP-NP2 -s {b}/32 -j KUBE-MARK-MASQ\n-A KUBE-SEP-NP2 -p tcp -m tcp -j DNAT --to-destination {b}:9000\n\
         COMMIT\n"
    )
}

/// The NodePort service of `node_port_rules` as a services file.
fn node_port_services() -> String {
    let mut s = String::from(
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: np, namespace: t}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.30\n  ports: [{name: echo, port: 9000, nodePort: 30090, protocol: TCP}]\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: np-1, namespace: t, labels: {kubernetes.io/service-name: np}}\naddressType: IPv4\nports: [{name: echo, port: 9000, protocol: TCP}]\nendpoints:\n",
    );
    for n in [1, 2] {
        let _ = writeln!(s, "- {{addresses: [\"{}\"], nodeName: n{n}, conditions: {{ready: true}}}}", pod_ip(n, 1));
    }
    s
}

/// The test of the outside half of a takeover: flows from an external
/// client that kube-proxy's rules on node 1 translated (to pods on both
/// nodes) must keep their backend while the agent attaches its TC programs
/// and after the rules are removed, and new flows from outside must be
/// served. The TC programs leave those flows to conntrack
/// (`takeover::pending`: defer, then handover); without it this
/// fails (seen: a held flow reset about 0.5 s after the agent started, when
/// the TC programs took its packets).
#[test]
fn takeover_keeps_flows_from_outside_that_kube_proxy_translated() {
    require_root!();
    let mut topo = Topology::new(&[1, 1]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/probe.py");
    for n in [1, 2] {
        let pod = topo.pod(n, 1);
        let server = spawn_in(&pod.ns, None, "/usr/bin/python3")
            .unwrap()
            .arg(&script)
            .args(["tcp-echo-server", &pod.ip.to_string(), "9000"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        topo.servers.push(ChildGuard(server));
    }
    std::thread::sleep(Duration::from_millis(300));
    topo.write_services(&node_port_services());
    let node = &topo.node(1).ns;
    let mut child = spawn_in(node, None, "iptables-nft-restore").unwrap().stdin(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), node_port_rules().as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    let target = format!("{}:30090", node_ip(1));
    // Through kube-proxy's rules: several flows, so both backends hold some.
    let held: Vec<Held> = (0..6).map(|_| hold_in(&topo.client, None, &target, 10.0)).collect();
    topo.start_agent_with(1, &["--take-over-from-kube-proxy"]);
    let agent = topo.agents[0].as_ref().unwrap();
    wait_message(agent, 0, REMOVED);
    // New flows from outside: ebpf-proxy's TC programs.
    for _ in 0..10 {
        check_held(hold_in(&topo.client, None, &target, 0.1));
    }
    for h in held {
        check_held(h);
    }
}
