//! The drift audit in the kernel: entries changed, added and deleted behind
//! the agent's back with `bpftool` (in the test's own bpffs) are found and
//! repaired on SIGHUP and on the `--audit-interval` timer, logged in one
//! line, counted by map, and a steady client of another service sees no
//! failed connection meanwhile.
mod common;

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use common::{Env, backend_ip, service, slice, web};
use ebpf_proxy::{
    datapath::KernelMaps,
    model::{FrontendKey, Protocol},
    reconcile::{ServiceMaps as _, audit::DRIFT_REPAIRED, codec},
};
use proxy_common::{Backend, ServiceKey, ServiceValue, map_names};
use proxy_testkit::{AgentProcess, field, message};

/// `web` (the steady client's) and `other` (the one tampered with).
fn services() -> String {
    // Five backends: two slots entries (four slots to an entry). None is
    // reached (the steady client goes to `web`).
    let ips: Vec<Ipv4Addr> = (1..=5).map(backend_ip).collect();
    web(&[1, 2])
        + &service("other", "10.96.0.20", &[("http", 80)])
        + &slice("other-1", "other", &[("http", 8080)], &ips)
}

/// Slot 0 of `other` (0), or its slots entry `slot` (1: slots 1-4, 2: slot 5).
fn other(slot: u16) -> ServiceKey {
    codec::service_key(FrontendKey::new(Ipv4Addr::new(10, 96, 0, 20).into(), 80, Protocol::Tcp), slot)
}

/// The bytes of a map key or value as the kernel holds them (the types are
/// `repr(C)` without padding; their fields are in host order but for the
/// port, which is stored in network order already).
fn service_key_bytes(k: &ServiceKey) -> Vec<u8> {
    let mut b = k.addr.0.to_vec();
    b.extend(k.port.to_ne_bytes());
    b.extend(k.slot.to_ne_bytes());
    b.extend([k.proto, k.scope]);
    b.extend(k.pad);
    b
}

fn service_value_bytes(v: &ServiceValue) -> Vec<u8> {
    let mut b = v.backend_id.to_ne_bytes().to_vec();
    b.extend(v.rev_nat.to_ne_bytes());
    for n in [v.count, v.flags, v.maglev, v.pad] {
        b.extend(n.to_ne_bytes());
    }
    b
}

fn backend_bytes(v: &Backend) -> Vec<u8> {
    let mut b = v.addr.0.to_vec();
    b.extend(v.port.to_ne_bytes());
    b.extend([v.proto, v.state, v.flags]);
    b.extend(v.pad);
    b
}

fn hex(bytes: &[u8]) -> Vec<String> {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `bpftool map ARGS...` on the map pinned at `path`; fails the test on error.
fn bpftool(op: &str, path: &Path, args: &[String]) -> String {
    let out =
        Command::new("bpftool").args(["-j", "map", op, "pinned"]).arg(path).args(args).output().expect("run bpftool");
    assert!(out.status.success(), "bpftool map {op} {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Byte of a `BACKENDS` value that holds the protocol (0: the entry is
/// empty, whatever its address).
const BACKEND_PROTO_BYTE: usize = std::mem::offset_of!(proxy_common::Backend, proto);

/// Every entry of the maps the reconciler writes, as bpftool dumps them
/// (sorted: a hash map's order is its own business), without the empty
/// entries of the `BACKENDS` array.
fn dump_all(maps: &Path) -> Vec<(String, Vec<String>)> {
    let mut all = Vec::new();
    for name in [map_names::SERVICES, map_names::BACKENDS, map_names::REVNAT, map_names::SERVICE_NAMES] {
        let v: serde_json::Value = serde_json::from_str(&bpftool("dump", &maps.join(name), &[])).expect("bpftool JSON");
        let empty = |e: &serde_json::Value| name == map_names::BACKENDS && e["value"][BACKEND_PROTO_BYTE] == "0x00";
        let mut entries: Vec<String> =
            v.as_array().expect("entries").iter().filter(|e| !empty(e)).map(ToString::to_string).collect();
        entries.sort();
        all.push((name.to_owned(), entries));
    }
    all
}

/// `bpftool map update pinned PATH key hex K value hex V`.
fn update(path: &Path, key: &[u8], value: &[u8]) {
    let mut args = vec!["key".to_owned(), "hex".to_owned()];
    args.extend(hex(key));
    args.extend(["value".to_owned(), "hex".to_owned()]);
    args.extend(hex(value));
    bpftool("update", path, &args);
}

/// `bpftool map delete pinned PATH key hex K`.
fn delete(path: &Path, key: &[u8]) {
    let mut args = vec!["key".to_owned(), "hex".to_owned()];
    args.extend(hex(key));
    bpftool("delete", path, &args);
}

/// Starts the agent on `services()` with `--audit-interval interval`;
/// returns its maps directory.
fn start(env: &mut Env, interval: &str) -> PathBuf {
    env.write_services(&services());
    let mut args = env.agent_args();
    args.extend(["--audit-interval".to_owned(), interval.to_owned()]);
    let agent = AgentProcess::start(Path::new(common::AGENT), args).expect("start agent");
    let _ = agent.wait_applied(0);
    env.agent = Some(agent);
    ebpf_proxy::paths::current_maps_dir(&env.pin_dir()).expect("the agent's maps directory")
}

fn sighup(agent: &AgentProcess) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(agent.pid()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP the agent we started");
}

/// Waits for the drift line after `mark`; returns (entries, maps).
fn drift_line(agent: &AgentProcess, mark: usize) -> (u64, String) {
    let record = agent
        .wait_for(mark, Duration::from_secs(10), |r| message(r) == Some(DRIFT_REPAIRED))
        .expect("the audit logs the drift it repaired");
    let entries = field(&record, "entries").and_then(serde_json::Value::as_u64).expect("entries");
    let maps = field(&record, "maps").and_then(serde_json::Value::as_str).expect("maps").to_owned();
    (entries, maps)
}

/// `ebpf_proxy_datapath_drift_total{map}` (0 while the series is absent).
fn drift_metric(agent: &AgentProcess, map: &str) -> u64 {
    let (status, text) = common::http_get(&common::agent_address(agent, "metrics"), "/metrics");
    assert_eq!(status, 200);
    let name = format!("ebpf_proxy_datapath_drift_total{{map=\"{map}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&name)).map_or(0, |n| n.parse().expect("a count"))
}

#[test]
fn sighup_audits_and_repairs_what_bpftool_changed_added_and_deleted() {
    common::require_root!();
    let mut env = Env::new(3);
    // Only SIGHUP audits here.
    let dir = start(&mut env, "0");
    let before = dump_all(&dir);
    let dump = KernelMaps::open_pinned(&dir).unwrap().dump().unwrap();
    let client = env.steady_client();
    std::thread::sleep(Duration::from_millis(300));

    // Changed: slot 1 of `other` names slot 2's backend.
    let services = dir.join(map_names::SERVICES);
    let [_, second, third, fourth] = dump.services[&other(1)].slot_ids();
    update(
        &services,
        &service_key_bytes(&other(1)),
        &service_value_bytes(&ServiceValue::slots([second, second, third, fourth])),
    );
    // Added: a frontend nobody asked for, and a backend nobody uses.
    let stray = codec::service_key(FrontendKey::new(Ipv4Addr::new(10, 96, 0, 99).into(), 80, Protocol::Tcp), 0);
    update(&services, &service_key_bytes(&stray), &service_value_bytes(&ServiceValue::default()));
    let backend = dump.backends.values().next().copied().unwrap();
    update(&dir.join(map_names::BACKENDS), &4000u32.to_ne_bytes(), &backend_bytes(&backend));
    // Deleted: the entry of slot 5 of `other`, and its rev-NAT entry.
    delete(&services, &service_key_bytes(&other(2)));
    delete(&dir.join(map_names::REVNAT), &dump.services[&other(0)].rev_nat.to_ne_bytes());
    assert_ne!(dump_all(&dir), before, "tampered");

    let agent = env.agent();
    let mark = agent.mark();
    sighup(agent);
    let (entries, maps) = drift_line(agent, mark);
    assert_eq!(entries, 5, "{maps}");
    assert!(maps.contains("SERVICES 1 missing, 1 extra, 1 changed ("), "{maps}");
    assert!(maps.contains("10.96.0.20:80/TCP slots 5-8") && maps.contains("10.96.0.99:80/TCP"), "{maps}");
    assert!(maps.contains("BACKENDS 1 extra (id 4000)") && maps.contains("REVNAT 1 missing"), "{maps}");
    let _ = agent.wait_applied(mark);
    assert_eq!(dump_all(&dir), before, "repaired: the maps are as the agent wrote them");
    assert_eq!(
        [map_names::SERVICES, map_names::BACKENDS, map_names::REVNAT].map(|m| drift_metric(agent, m)),
        [3, 1, 1]
    );

    // A second audit finds nothing: no line, the counters stay.
    let mark = agent.mark();
    sighup(agent);
    let applied = agent.wait_applied(mark);
    assert_eq!(common::writes(&applied), 0);
    assert!(
        agent.records()[mark..].iter().all(|r| message(r) != Some(DRIFT_REPAIRED)),
        "no drift line when nothing differs"
    );
    assert_eq!(drift_metric(agent, map_names::SERVICES), 3);
    std::thread::sleep(Duration::from_millis(300));
    common::check_steady_client(client, "during the audits");
}

#[test]
fn the_audit_interval_repairs_without_a_signal() {
    common::require_root!();
    let mut env = Env::new(3);
    let dir = start(&mut env, "1s");
    let before = dump_all(&dir);
    let mark = env.agent().mark();
    delete(&dir.join(map_names::SERVICES), &service_key_bytes(&other(2)));
    let (entries, maps) = drift_line(env.agent(), mark);
    assert_eq!((entries, maps.as_str()), (1, "SERVICES 1 missing (10.96.0.20:80/TCP slots 5-8)"));
    assert_eq!(dump_all(&dir), before, "repaired within one interval");
    assert_eq!(drift_metric(env.agent(), map_names::SERVICES), 1);
}
