//! Active connections per backend, counted in the kernel, and the
//! least-connections choice that reads them (docs/design.md, "Balancing by
//! load"): counts rise with open sockets (TCP, connected and unconnected
//! UDP) and return to zero when they close or their process is killed,
//! survive an agent restart, go with a removed backend; and a service with
//! `ebpf-proxy.io/lb-algorithm: least-connections` sends new connections
//! away from a backend that holds many. Real agent, real kernel, python3
//! sockets inside the test namespace and cgroup.
mod common;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    process::{Child, Stdio},
};

use common::{Env, backend_ip, service, slice, web};
use ebpf_proxy::{
    datapath::{KernelMaps, active::ActiveConns},
    reconcile::{ServiceMaps as _, inspect},
};

/// Active connections per backend (`ADDR:PORT`) of the frontend at
/// `frontend` (`ADDR:PORT/PROTO`), as `ebpf-proxy service` reads them.
fn active(env: &Env, frontend: &str) -> BTreeMap<String, u64> {
    let dir = ebpf_proxy::paths::current_maps_dir(&env.pin_dir()).expect("maps pinned");
    let maps = KernelMaps::open_pinned(&dir).expect("open maps");
    let mut all = inspect::frontends(&maps.dump().expect("dump"));
    let counts = ActiveConns::open_pinned(&dir.join(proxy_common::map_names::ACTIVE_CONNS)).expect("ACTIVE_CONNS");
    inspect::with_active(&mut all, |id| counts.get(id));
    let view = all
        .into_iter()
        .find(|f| f.key().is_some_and(|k| k.to_string() == frontend))
        .unwrap_or_else(|| panic!("no frontend {frontend}"));
    view.backends
        .iter()
        .map(|b| (format!("{}:{}", b.address.expect("present"), b.port), b.active_connections.expect("read")))
        .collect()
}

fn total(counts: &BTreeMap<String, u64>) -> u64 {
    counts.values().sum()
}

/// `n` sockets of `kind` (`tcp`, `udp-connect`, `udp-sendto`) to
/// `host:port`, open in a client inside the cgroup until it ends.
struct Holder(Child);

impl Holder {
    fn open(env: &Env, kind: &str, host: &str, port: u16, n: usize) -> Self {
        let mut child = env
            .probe_command(&["open-many", kind, host, &port.to_string(), &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start probe");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("stdout")).read_line(&mut line).expect("read probe");
        assert_eq!(line.trim(), format!("open {n}"), "the probe could not open its sockets");
        Self(child)
    }

    /// Closes the sockets (the client's end of input) and waits for it.
    fn close(mut self) {
        drop(self.0.stdin.take());
        assert!(self.0.wait().expect("wait probe").success());
    }

    /// SIGKILL, and waits for it: the kernel closes its sockets.
    fn kill(mut self) {
        self.0.kill().expect("kill probe");
        self.0.wait().expect("wait probe");
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Service `dns` on 10.96.0.53:53/UDP in front of backends 1..=n on :5353.
fn dns(n: u8) -> String {
    let mut s = String::from(
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: dns, namespace: test}\nspec:\n  clusterIP: 10.96.0.53\n  ports:\n  - {name: dns, port: 53, protocol: UDP}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: dns-1\n  namespace: test\n  labels: {kubernetes.io/service-name: dns}\naddressType: IPv4\nports:\n- {name: dns, port: 5353, protocol: UDP}\nendpoints:\n",
    );
    for i in 1..=n {
        let _ = writeln!(s, "- addresses: [\"{}\"]\n  conditions: {{ready: true}}", backend_ip(i));
    }
    s
}

/// Service `web` with `ebpf-proxy.io/lb-algorithm: ALGORITHM` in front of
/// backends `which`.
fn web_balanced(algorithm: &str, which: &[u8]) -> String {
    let ips: Vec<_> = which.iter().map(|i| backend_ip(*i)).collect();
    let svc = service("web", "10.96.0.10", &[("http", 80)]).replace(
        "  namespace: test\nspec:",
        &format!("  namespace: test\n  annotations: {{ebpf-proxy.io/lb-algorithm: {algorithm}}}\nspec:"),
    );
    svc + &slice("web-1", "web", &[("http", 8080)], &ips)
}

/// The backends' accepted connections once they add up to `sum` (each
/// backend's accept loop polls, so it may trail the client's connect).
fn accepted_by_then(env: &Env, sum: usize) -> Vec<usize> {
    for _ in 0..500 {
        let accepted = env.accepted();
        if accepted.iter().sum::<usize>() >= sum {
            return accepted;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the backends accepted {:?}, not {sum} connections", env.accepted());
}

/// Opens `n` sockets of `kind`, checks that each counts once where the
/// backends saw them (TCP) and that closing (or killing) them brings every
/// count back to zero.
fn counted_while_open(env: &Env, kind: &str, host: &str, port: u16, frontend: &str, kill: bool) {
    assert_eq!(total(&active(env, frontend)), 0, "counts before any client");
    let accepted = env.accepted();
    let holder = Holder::open(env, kind, host, port, 12);
    let counts = active(env, frontend);
    assert_eq!(total(&counts), 12, "one count per open socket: {counts:?}");
    if kind == "tcp" {
        // Each backend counts exactly the connections it accepted.
        let now = accepted_by_then(env, accepted.iter().sum::<usize>() + 12);
        for (i, b) in env.backends.iter().enumerate() {
            let key = format!("{}:8080", b.addr().ip());
            assert_eq!(counts[&key], (now[i] - accepted[i]) as u64, "{key}: {counts:?}");
        }
    }
    if kill {
        holder.kill();
    } else {
        holder.close();
    }
    let counts = active(env, frontend);
    assert_eq!(total(&counts), 0, "counts after the sockets were released: {counts:?}");
}

#[test]
fn tcp_connections_count_while_open() {
    common::require_root!();
    let mut env = Env::new(3);
    env.write_services(&web(&[1, 2, 3]));
    env.start_agent();
    counted_while_open(&env, "tcp", "10.96.0.10", 80, "10.96.0.10:80/TCP", false);
    counted_while_open(&env, "tcp", "10.96.0.10", 80, "10.96.0.10:80/TCP", true);
}

#[test]
fn the_metrics_show_each_backends_active_connections() {
    common::require_root!();
    let mut env = Env::new(3);
    env.write_services(&web(&[1, 2, 3]));
    env.start_agent();
    let holder = Holder::open(&env, "tcp", "10.96.0.10", 80, 7);
    let counts = active(&env, "10.96.0.10:80/TCP");
    let metrics = common::agent_address(env.agent(), "metrics");
    let (status, text) = common::http_get(&metrics, "/metrics");
    assert_eq!(status, 200);
    for (backend, n) in &counts {
        let series = format!("ebpf_proxy_backend_active_connections{{backend=\"{backend}/TCP\"}}");
        #[expect(clippy::cast_precision_loss, reason = "a handful of connections")]
        let expected = *n as f64;
        assert!((common::metric(&text, &series) - expected).abs() < f64::EPSILON, "{series}: {n} in the maps");
    }
    assert!(common::metric(&text, "ebpf_proxy_backend_series_omitted").abs() < f64::EPSILON);
    holder.close();
}

#[test]
fn connected_and_unconnected_udp_sockets_count_while_open() {
    common::require_root!();
    let mut env = Env::new(3);
    env.start_udp(3, 5353);
    env.write_services(&dns(3));
    env.start_agent();
    for kind in ["udp-connect", "udp-sendto"] {
        counted_while_open(&env, kind, "10.96.0.53", 53, "10.96.0.53:53/UDP", false);
        counted_while_open(&env, kind, "10.96.0.53", 53, "10.96.0.53:53/UDP", true);
    }
}

#[test]
fn counts_survive_an_agent_restart() {
    common::require_root!();
    let mut env = Env::new(3);
    env.write_services(&web(&[1, 2, 3]));
    env.start_agent();
    let holder = Holder::open(&env, "tcp", "10.96.0.10", 80, 9);
    let before = active(&env, "10.96.0.10:80/TCP");
    assert_eq!(total(&before), 9);
    env.agent.take(); // stopped: maps and links stay pinned
    env.start_agent();
    assert_eq!(active(&env, "10.96.0.10:80/TCP"), before, "the restart changed the counts");
    holder.kill();
    assert_eq!(total(&active(&env, "10.96.0.10:80/TCP")), 0);
}

#[test]
fn a_removed_backends_count_goes_with_it() {
    common::require_root!();
    let mut env = Env::new(3);
    env.write_services(&web(&[1, 2, 3]));
    env.start_agent();
    // At random, backend 1 gets none of 30 once in ~190,000 runs.
    let holder = Holder::open(&env, "tcp", "10.96.0.10", 80, 30);
    let before = active(&env, "10.96.0.10:80/TCP");
    let gone = format!("{}:8080", backend_ip(1));
    assert!(before[&gone] > 0, "no connection reached backend 1: {before:?}");
    env.apply(&web(&[2, 3]));
    let after = active(&env, "10.96.0.10:80/TCP");
    let mut expected = before.clone();
    expected.remove(&gone);
    assert_eq!(after, expected, "the others' counts changed");
    // Backend 1 comes back (at its old id, the lowest free): its count
    // starts at zero, though its old connections are still open.
    env.apply(&web(&[1, 2, 3]));
    assert_eq!(active(&env, "10.96.0.10:80/TCP")[&gone], 0, "a new backend inherited a count");
    // Closing the old connections takes back only what the live backends
    // counted: nothing goes below zero, nothing stays.
    holder.close();
    let counts = active(&env, "10.96.0.10:80/TCP");
    assert_eq!(total(&counts), 0, "{counts:?}");
}

#[test]
fn least_connections_sends_new_connections_away_from_a_loaded_backend() {
    common::require_root!();
    let mut env = Env::new(3);
    // Backend 1 alone first: it takes 10 connections that stay open.
    env.write_services(&web_balanced("least-connections", &[1]));
    env.start_agent();
    let holder = Holder::open(&env, "tcp", "10.96.0.10", 80, 10);
    env.apply(&web_balanced("least-connections", &[1, 2, 3]));
    let loaded = accepted_by_then(&env, 10);
    assert_eq!(loaded[0], 10);
    // Every new connection compares two backends; backend 1 (10 open)
    // loses against either other one (at most one open at a time).
    let answers = env.requests("10.96.0.10", 60);
    let after = env.accepted();
    assert_eq!(after[0], loaded[0], "backend 1 got new connections: {answers:?}");
    assert!(after[1] > loaded[1] && after[2] > loaded[2], "one of the others got none: {after:?}");
    holder.close();
}

#[test]
fn random_keeps_sending_to_a_loaded_backend() {
    // The control of the test above: with the default algorithm, the
    // loaded backend keeps its share.
    common::require_root!();
    let mut env = Env::new(3);
    env.write_services(&web_balanced("random", &[1]));
    env.start_agent();
    let holder = Holder::open(&env, "tcp", "10.96.0.10", 80, 10);
    env.apply(&web_balanced("random", &[1, 2, 3]));
    let loaded = accepted_by_then(&env, 10);
    env.requests("10.96.0.10", 60);
    assert!(env.accepted()[0] > loaded[0], "backend 1 got none of 60 connections at random");
    holder.close();
}
