//! Maps that grow with the cluster, and health that tells the truth when a
//! bound stops them: the real agent, a steady curl client in a test
//! namespace, real maps.
mod common;

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use common::{Env, backend_ip, service, slice, web};
use ebpf_proxy::{agent::resize::RESIZING, pipeline::MAP_WRITES_FAILED};
use proxy_testkit::{AgentProcess, field, message};

/// `web` and `n` more one-port services (10.97.x.y) with backend 1 each:
/// `SERVICES` holds 2 + 2n entries of it (a slot 0 and a slots entry each).
fn services(n: u16) -> String {
    let mut yaml = web(&[1, 2]);
    for i in 0..n {
        let byte = |n: u16| u8::try_from(n).expect("fewer than 62,500 services");
        let ip = Ipv4Addr::new(10, 97, byte(i / 250), byte(i % 250 + 1));
        let name = format!("svc-{i}");
        yaml += &service(&name, &ip.to_string(), &[("http", 80)]);
        yaml += &slice(&format!("{name}-1"), &name, &[("http", 8080)], &[backend_ip(1)]);
    }
    yaml
}

fn u64_field(record: &serde_json::Value, name: &str) -> u64 {
    field(record, name).and_then(serde_json::Value::as_u64).unwrap_or_else(|| panic!("{name} in {record}"))
}

/// The maps directories pinned (`maps-v...`).
fn maps_dirs(env: &Env) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(env.pin_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("maps-v"))
        .collect();
    dirs.sort();
    dirs
}

/// The kernel's ids of the session maps pinned in set `dir`.
fn session_map_ids(env: &Env, dir: &str) -> Vec<u32> {
    use proxy_common::map_names::{AFFINITY, CT, SOCK_BACKEND, SOCK_REVNAT};
    [AFFINITY, SOCK_BACKEND, SOCK_REVNAT, CT]
        .iter()
        .map(|name| {
            let map = aya::maps::MapData::from_pin(env.pin_dir().join(dir).join(name)).expect(name);
            map.info().expect("map info").id()
        })
        .collect()
}

/// `ebpf-proxy status -o json`'s maps.
fn status_maps(env: &Env) -> serde_json::Value {
    let out = std::process::Command::new(common::AGENT)
        .args(["status", "-o", "json", "--bpffs-dir"])
        .arg(env.pin_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["maps"].clone()
}

#[test]
fn maps_grow_past_their_first_size_under_a_steady_client() {
    common::require_root!();
    let mut env = Env::new(2);
    env.write_services(&web(&[1, 2]));
    env.start_agent();
    // A small table: the maps start at their smallest (sizing::MIN_SIZE).
    assert_eq!(status_maps(&env)["services_map_size"], 4096);
    let client = env.steady_client();
    std::thread::sleep(Duration::from_millis(300));
    let first = maps_dirs(&env);
    let sessions = session_map_ids(&env, &first[0]);

    // 2,100 more services: 4,202 entries, past the 4,096 the map holds.
    let agent = env.agent();
    let mark = agent.mark();
    env.write_services(&services(2100));
    let resized = agent
        .wait_for(mark, Duration::from_mins(1), |r| message(r) == Some(RESIZING))
        .expect("the agent moves to bigger maps");
    assert_eq!(u64_field(&resized, "was_services"), 4096);
    assert_eq!(u64_field(&resized, "services_map_size"), 16_384, "twice the need, rounded up");
    let applied = agent
        .wait_for(mark, Duration::from_mins(1), |r| {
            message(r) == Some(ebpf_proxy::agent::APPLIED) && u64_field(r, "frontends") == 2101
        })
        .expect("every service applied");
    assert_eq!(u64_field(&applied, "failures"), 0, "{applied}");
    std::thread::sleep(Duration::from_millis(300));
    common::check_steady_client(client, "while the maps grew");

    // One set pinned, the new one; it serves the new services too.
    let dirs = maps_dirs(&env);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].ends_with("-s16384-b4096-f4096"), "{dirs:?}");
    // A connected UDP socket's service address (SOCK_REVNAT, no id in
    // it) came along: the same map, now pinned in the new set. AFFINITY,
    // SOCK_BACKEND and CT hold the old set's frontend and backend ids,
    // which the new set hands out anew: they are new maps.
    let moved = session_map_ids(&env, &dirs[0]);
    assert_eq!(moved[2], sessions[2], "SOCK_REVNAT made again by the move");
    for i in [0, 1, 3] {
        assert_ne!(moved[i], sessions[i], "a session map naming ids carried into a set of other ids");
    }
    let maps = status_maps(&env);
    assert_eq!(maps["services_map_size"], 16_384, "{maps}");
    assert_eq!(maps["frontends"], 2101, "{maps}");
    assert_eq!(env.requests("10.97.8.100", 2), vec!["backend-1"; 2]);
    assert_eq!(env.requests("10.96.0.10", 4).len(), 4);
}

#[test]
fn a_bound_too_small_turns_health_503_and_a_larger_bound_serves_all_without_a_gap() {
    common::require_root!();
    let mut env = Env::new(2);
    // web (2 entries) and 40 services (80 entries) in a map bounded at 64.
    env.write_services(&services(40));
    let mut args = env.agent_args();
    args.extend(["--services-map-size", "64", "--health-timeout", "2"].map(str::to_owned));
    let agent = AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
    let applied = agent.wait_applied(0);
    assert!(u64_field(&applied, "failures") > 0, "{applied}");
    let health = common::agent_address(&agent, "health");
    let metrics = common::agent_address(&agent, "metrics");
    env.agent = Some(agent);
    // Served: what fits (written in order, never half a service).
    let client = env.steady_client();

    // kube-proxy (pkg/proxy/healthcheck/proxy_health.go) turns /healthz
    // 503 once an update waits unapplied longer than the health timeout;
    // a sync that failed writes applied nothing as far as it is concerned.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, body) = loop {
        let (status, body) = common::http_get(&health, "/healthz");
        // (503 also until the TC programs serve traffic from outside,
        // with the proxy itself healthy: not what is waited for.)
        if (status == 503 && body.contains("\"healthy\":false")) || Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"healthy\":false"), "{body}");

    // The metric, and what is in the maps rather than what is wanted.
    let (_, text) = common::http_get(&metrics, "/metrics");
    assert!(common::metric(&text, "ebpf_proxy_map_full_total{map=\"SERVICES\"}") > 0.0, "{text}");
    assert!((common::metric(&text, "ebpf_proxy_map_size{map=\"SERVICES\"}") - 64.0).abs() < f64::EPSILON);
    let in_maps = status_maps(&env)["frontends"].as_u64().unwrap();
    assert!((1..41).contains(&in_maps), "{in_maps} of 41 frontends fit");
    let frontends = common::metric(&text, "ebpf_proxy_frontends");
    assert!((frontends - f64::from(u32::try_from(in_maps).unwrap())).abs() < f64::EPSILON, "{frontends} {in_maps}");

    // One summarised line per sync that failed writes, not one per service.
    let records = env.agent().records();
    let failed_syncs = records
        .iter()
        .filter(|r| message(r) == Some(ebpf_proxy::agent::APPLIED) && u64_field(r, "failures") > 0)
        .count();
    let lines: Vec<&serde_json::Value> = records.iter().filter(|r| message(r) == Some(MAP_WRITES_FAILED)).collect();
    assert!(failed_syncs >= 1);
    // (A sync may be logging its line while the records are read.)
    assert!((failed_syncs..=failed_syncs + 1).contains(&lines.len()), "{failed_syncs} syncs, {} lines", lines.len());
    let line = lines[0];
    assert!(u64_field(line, "failures") > 1, "{line}");
    assert!(field(line, "per_map").unwrap().as_str().unwrap().contains("SERVICES"), "{line}");
    assert!(!records.iter().any(|r| r["level"] == "ERROR"), "no error line per failed write");

    // A larger bound on the next start: the pinned 64-entry set is left
    // for a bigger one without a gap, and everything is served.
    env.agent.take();
    std::thread::sleep(Duration::from_millis(300));
    let agent = AgentProcess::start(std::path::Path::new(common::AGENT), env.agent_args()).unwrap();
    agent
        .wait_for(0, Duration::from_secs(30), |r| message(r) == Some(RESIZING))
        .expect("the agent moves to maps of the larger bound");
    let applied = agent
        .wait_for(0, Duration::from_secs(30), |r| {
            message(r) == Some(ebpf_proxy::agent::APPLIED) && u64_field(r, "failures") == 0
        })
        .expect("every service applied");
    assert_eq!(u64_field(&applied, "frontends"), 41);
    let health = common::agent_address(&agent, "health");
    env.agent = Some(agent);
    std::thread::sleep(Duration::from_millis(300));
    common::check_steady_client(client, "across the restart with a larger bound");
    let (status, body) = common::http_get(&health, "/healthz");
    assert_eq!(status, 200, "{body}");
    assert_eq!(status_maps(&env)["services_map_size"], 4096);
    assert_eq!(maps_dirs(&env).len(), 1, "the 64-entry set is unpinned");
    assert_eq!(env.requests("10.97.0.40", 2), vec!["backend-1"; 2]);
}

/// A start writes a chunk of new frontends' rev-NAT and slots entries,
/// then their slots 0 beside their names, each step in two lanes on two
/// threads (`ServiceMaps::write_lanes`); here the map fills while the
/// slots 0 are written. Every frontend in the map is whole (a slot 0 and
/// all its slots), the chunk's slots whose slot 0 did not fit are
/// removed, and what is in the map is what the agent reports and serves.
#[test]
fn a_map_filling_in_a_two_thread_write_leaves_only_whole_frontends() {
    common::require_root!();
    let mut env = Env::new(2);
    // web (2 entries) and 1,400 services (2,800 entries) in a map of
    // 2,000: the first chunk of 1,024 frontends takes 1,024 slots
    // entries, then its slots 0 (one lane, beside the names) find the map
    // full.
    let n = 1400;
    env.write_services(&services(n));
    let mut args = env.agent_args();
    args.extend(["--services-map-size", "2000"].map(str::to_owned));
    let agent = AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
    let applied = agent.wait_applied(0);
    env.agent = Some(agent);
    assert!(u64_field(&applied, "failures") > 0, "{applied}");

    let dirs = maps_dirs(&env);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let maps = ebpf_proxy::datapath::KernelMaps::open_pinned(&env.pin_dir().join(&dirs[0])).unwrap();
    let dump = ebpf_proxy::reconcile::ServiceMaps::dump(&maps).unwrap();
    let slot_zeros: Vec<_> = dump.services.iter().filter(|(k, _)| k.slot == 0).collect();
    for (key, slot_zero) in &slot_zeros {
        for index in 0..slot_zero.count {
            let id = dump.services.get(&key.slots_of(index)).map(|v| v.slot_id(index));
            assert!(id.is_some_and(|id| id != 0), "{key:?}: slot {} missing", index + 1);
        }
    }
    // Slots entries without their slot 0 (no reader reaches them): at most
    // that of the one frontend written one at a time when the map filled,
    // whose slot 0 the retry writes (`update_frontend`); the bulk write
    // removes its own (`remove_slots_without_slot_zero`).
    let entries: usize = slot_zeros.iter().map(|(_, m)| usize::from(m.count).div_ceil(4)).sum();
    let waiting = dump.services.len() - slot_zeros.len() - entries;
    assert!(waiting <= 1, "{waiting} slots entries without their slot 0");
    assert!(dump.services.len() > 1990, "the map is used up to its bound: {}", dump.services.len());
    let served = slot_zeros.len();
    assert!((600..usize::from(n)).contains(&served), "{served} frontends fit");
    assert_eq!(status_maps(&env)["frontends"].as_u64(), Some(u64::try_from(served).unwrap()));
    // The first served frontend answers (the services sort by address).
    assert_eq!(env.requests("10.97.0.1", 2), vec!["backend-1"; 2]);
}

#[test]
fn a_start_with_a_big_table_sizes_its_maps_before_the_first_write() {
    common::require_root!();
    let mut env = Env::new(2);
    // web (2 entries) and 2,500 services (5,000 entries): more than the
    // 4,096 a fresh start's maps hold (sizing::MIN_SIZE).
    env.write_services(&services(2500));
    env.start_agent();
    let agent = env.agent();
    let applied = agent.wait_applied(0);
    assert_eq!(u64_field(&applied, "frontends"), 2501, "{applied}");
    assert_eq!(u64_field(&applied, "failures"), 0, "{applied}");
    let records = agent.records();
    // Sized from the translated table, before anything was written: no
    // write refused, no move after the first write.
    assert!(!records.iter().any(|r| message(r) == Some(MAP_WRITES_FAILED)), "a write was refused");
    let resized: Vec<_> = records.iter().filter(|r| message(r) == Some(RESIZING)).collect();
    assert_eq!(resized.len(), 1, "{resized:?}");
    assert_eq!(field(resized[0], "first_write"), Some(&serde_json::Value::Bool(true)), "{}", resized[0]);
    assert_eq!(u64_field(resized[0], "services_needed"), 5002);
    // The sized set took over the session maps of the set made at the
    // start, unused (nothing attached yet), instead of making them again.
    let loads: Vec<_> = records.iter().filter(|r| message(r) == Some("datapath loaded")).collect();
    assert_eq!(loads.len(), 2, "{loads:?}");
    assert_eq!(field(loads[0], "sessions_carried").and_then(|v| v.as_str()), Some("[]"), "{}", loads[0]);
    assert_eq!(
        field(loads[1], "sessions_carried").and_then(|v| v.as_str()),
        Some(r#"["AFFINITY", "SOCK_BACKEND", "SOCK_REVNAT", "CT"]"#),
        "{}",
        loads[1]
    );
    // One set pinned, of the right size: twice the need, rounded up.
    let dirs = maps_dirs(&env);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].ends_with("-s16384-b4096-f4096"), "{dirs:?}");
    assert_eq!(status_maps(&env)["services_map_size"], 16_384);
    assert_eq!(env.requests("10.97.9.250", 2), vec!["backend-1"; 2]);
    assert_eq!(env.requests("10.96.0.10", 2).len(), 2);
}

/// The handover mode of a takeover from kube-proxy (`--outside-handover`)
/// moves with the agent to a bigger set of maps, its end included, and
/// the flows conntrack holds are marked again in the new maps' empty `CT`:
/// the new programs must not re-balance kube-proxy's flows the old ones
/// left to the kernel.
#[test]
fn a_move_to_bigger_maps_keeps_the_outside_handover() {
    use ebpf_proxy::datapath::handover::{HandoverMap, OutsideHandover};
    common::require_root!();
    let mut env = Env::new(2);
    env.write_services(&web(&[1, 2]));
    let mut args = env.agent_args();
    args.extend(["--outside-handover", "handover", "--outside-handover-seconds", "3600"].map(str::to_owned));
    let agent = AgentProcess::start(std::path::Path::new(common::AGENT), args).unwrap();
    let _ = agent.wait_applied(0);
    env.agent = Some(agent);
    let handover_of = |dir: &str| {
        let path = env.pin_dir().join(dir).join(proxy_common::map_names::OUTSIDE_HANDOVER);
        HandoverMap::open_pinned(&path).unwrap()
    };
    let first = maps_dirs(&env);
    let before = handover_of(&first[0]);
    let Some(OutsideHandover::Handover { ends_after: Some(left) }) = before.get().unwrap() else {
        panic!("{:?}", before.get())
    };
    assert!(left <= Duration::from_hours(1) && left > Duration::from_secs(3500), "{left:?}");
    let raw = before.raw().unwrap();

    let agent = env.agent();
    let mark = agent.mark();
    env.write_services(&services(2100));
    agent.wait_for(mark, Duration::from_mins(1), |r| message(r) == Some(RESIZING)).expect("the agent moves");
    agent
        .wait_for(mark, Duration::from_mins(1), |r| {
            message(r) == Some(ebpf_proxy::agent::APPLIED) && u64_field(r, "frontends") == 2101
        })
        .expect("every service applied");
    let moved = maps_dirs(&env);
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_ne!(moved, first);
    assert_eq!(handover_of(&moved[0]).raw().unwrap(), raw, "the same mode and end");
    agent
        .wait_for(mark, Duration::from_secs(5), |r| message(r) == Some("netfilter's flows marked for the handover"))
        .expect("netfilter's flows marked again in the new maps");
}
