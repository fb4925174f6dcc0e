//! The per-frontend connection counters (`CONNECTIONS`, an array with a
//! region per CPU): zeroing many at once (`ConnCounters::reset_all`, what
//! the first sync of a start does for every frontend) in batches, in the
//! real kernel, zeroes each id's counter on every CPU as the kernel holds
//! it and leaves every other counter as it was; reading many at once
//! (`read_all`, a scrape) gives what one at a time gives; and which
//! counters the telemetry zeroes as frontends take ids (those passing to
//! another frontend, none of a map the load just made).
mod common;

use std::os::fd::AsFd as _;

use aya::maps::{Array, Map, MapData};
use ebpf_proxy::{
    datapath::counters::ConnCounters,
    model::{FrontendKey, Protocol, ServicePort},
    observe::telemetry::Telemetry,
};

#[test]
fn reset_all_zeroes_exactly_the_ids_given() {
    common::require_root!();
    // More counters than one batch carries (4096), and a few.
    for (size, reset) in
        [(10_000u32, (1..9000).filter(|id| id % 3 != 0).collect::<Vec<u32>>()), (64, vec![5, 6, 63]), (64, vec![])]
    {
        let (mut counters, kernel) = filled_as(size, false);
        counters.reset_all(&reset).expect("reset");
        check(&counters, size, &reset);
        // What the batches wrote is what the kernel (and so the programs)
        // hold: every CPU's counter of each id.
        for id in [5, 6, 63, 64, 8999].into_iter().filter(|id| *id < size) {
            let want = if reset.contains(&id) { 0 } else { value(id).iter().sum() };
            let held: u64 = (0..cpus()).map(|cpu| kernel.get(&(cpu * size + id), 0).unwrap()).sum();
            assert_eq!(held, want, "id {id} of {size}, read with the syscall");
        }
    }
    // An id past the end among others: the others are zeroed all the
    // same, and the refusal is returned.
    let mut counters = filled(64);
    assert!(counters.reset_all(&[3, 9, 64, 10, 63]).is_err(), "id 64 of a 64-entry map was accepted");
    check(&counters, 64, &[3, 9, 10, 63]);
}

#[test]
fn reading_many_counts_gives_what_reading_each_gives() {
    common::require_root!();
    // Ranges longer than a batch (4096), at the start, at the end and past
    // it, and ids out of order.
    let size = 10_000u32;
    let (counters, _) = filled_as(size, false);
    for ids in [
        (0..size).collect::<Vec<u32>>(),
        (1..9000).step_by(7).collect(),
        vec![5],
        vec![9_999],
        vec![3, 64, 4100, 8191, 9_999, 10_000, 12_345],
        vec![9_000, 12, 4_500, 10_001, 7],
        vec![10_000],
        vec![],
    ] {
        let each: Vec<Option<u64>> = ids.iter().map(|id| counters.read(*id).ok()).collect();
        assert_eq!(counters.read_all(&ids), each, "{} ids from {:?}", ids.len(), ids.first());
        assert!(each.iter().zip(&ids).all(|(n, id)| n.is_some() == (*id < size)), "ids past the end read as none");
    }
}

#[test]
fn an_id_passing_to_another_frontend_starts_from_zero() {
    common::require_root!();
    let frontend = |last: u8| FrontendKey::new(std::net::IpAddr::from([10, 96, 0, last]), 80, Protocol::Tcp);
    let web = ServicePort::new("default", "web", "http");
    let mut t = Telemetry::new(64, 64);
    t.counters = Some(filled(64));
    // A first sync after a restart on pinned counters: ids may carry a
    // removed frontend's counts, so every id handed out is zeroed.
    t.set_frontends([(3, frontend(3), web.clone()), (9, frontend(9), web.clone())]);
    check(t.counters.as_ref().unwrap(), 64, &[3, 9]);
    // The same labels again (a relist) zero nothing.
    t.counters = Some(filled(64));
    t.set_frontends([(3, frontend(3), web.clone()), (9, frontend(9), web.clone())]);
    check(t.counters.as_ref().unwrap(), 64, &[]);
    // One change: id 9's frontend goes, then id 9 is another's.
    t.set_frontend(frontend(9), 9, None);
    check(t.counters.as_ref().unwrap(), 64, &[]);
    t.set_frontend(frontend(10), 9, Some(&web));
    check(t.counters.as_ref().unwrap(), 64, &[9]);
    t.set_frontend(frontend(3), 3, Some(&web));
    check(t.counters.as_ref().unwrap(), 64, &[9]);

    // Counters the load made (no pin found) are all zero: the first sync
    // writes none of them (the programs may count already), later ones do.
    let mut t = Telemetry::new(64, 64);
    t.counters = Some(filled_as(64, true).0);
    t.set_frontends([(3, frontend(3), web.clone())]);
    check(t.counters.as_ref().unwrap(), 64, &[]);
    t.set_frontend(frontend(4), 3, Some(&web));
    check(t.counters.as_ref().unwrap(), 64, &[3]);
}

/// A new array of `size` counters per CPU, a region per CPU
/// (BPF_MAP_TYPE_ARRAY, linux/bpf.h, as the agent's CONNECTIONS), each at
/// its `value`.
fn filled(size: u32) -> ConnCounters {
    filled_as(size, false).0
}

/// The regions of the counters (the highest possible CPU plus one).
fn cpus() -> u32 {
    ebpf_proxy::datapath::counters::possible_cpus().unwrap()
}

/// As `filled`, handed over as a map the load made (`zeroed`) or not
/// (what the counters do with the flag shows as values that stay), with a
/// second handle that reads the map through the kernel
/// (`bpf_map_lookup_elem`).
fn filled_as(size: u32, zeroed: bool) -> (ConnCounters, Array<MapData, u64>) {
    let cpus = cpus();
    let obj = aya_obj::Map::new_from_params(2, 4, 8, size * cpus, 0);
    let data = MapData::create(obj, "test_counters", None).expect("create an array");
    let second = MapData::from_fd(data.fd().as_fd().try_clone_to_owned().unwrap()).unwrap();
    let mut writer: Array<MapData, u64> = Array::try_from(Map::Array(second)).unwrap();
    for id in 0..size {
        for (cpu, v) in (0..).zip(value(id)) {
            writer.set(cpu * size + id, v, 0).unwrap();
        }
    }
    (ConnCounters::from_map(Map::Array(data), zeroed).unwrap(), writer)
}

/// The value test counter `id` starts with, per CPU.
fn value(id: u32) -> Vec<u64> {
    (0..cpus()).map(|cpu| u64::from(id) + 1 + u64::from(cpu)).collect()
}

/// Every counter below `size` is zero if in `reset`, its starting value
/// otherwise.
fn check(counters: &ConnCounters, size: u32, reset: &[u32]) {
    for id in 0..size {
        let want = if reset.contains(&id) { 0 } else { value(id).iter().sum() };
        assert_eq!(counters.read(id).unwrap(), want, "id {id} of {size}");
    }
}
