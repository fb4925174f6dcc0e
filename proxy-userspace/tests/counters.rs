//! The per-frontend connection counters (`CONNECTIONS`, a per-CPU array):
//! zeroing many at once (`ConnCounters::reset_all`, what the first sync of
//! a start does for every frontend) in batches, in the real kernel, leaves
//! every other counter as it was.
mod common;

use std::os::fd::AsFd as _;

use aya::maps::{Map, MapData, PerCpuArray, PerCpuValues};
use ebpf_proxy::datapath::counters::ConnCounters;

#[test]
fn reset_all_zeroes_exactly_the_ids_given() {
    common::require_root!();
    // More ids than one batch carries (4096), and a few.
    for (size, reset) in
        [(10_000u32, (1..9000).filter(|id| id % 3 != 0).collect::<Vec<u32>>()), (64, vec![5, 6, 63]), (64, vec![])]
    {
        let mut counters = filled(size);
        counters.reset_all(&reset).expect("reset in batches");
        check(&counters, size, &reset);
    }
    // An id the map refuses (past its end) in the middle of a batch: the
    // others are zeroed all the same, and the refusal is returned.
    let mut counters = filled(64);
    assert!(counters.reset_all(&[3, 9, 64, 10, 63]).is_err(), "id 64 of a 64-entry map was accepted");
    check(&counters, 64, &[3, 9, 10, 63]);
}

/// A new per-CPU array of `size` counters (BPF_MAP_TYPE_PERCPU_ARRAY,
/// linux/bpf.h, as the agent's CONNECTIONS), each at its `value`.
fn filled(size: u32) -> ConnCounters {
    let obj = aya_obj::Map::new_from_params(6, 4, 8, size, 0);
    let data = MapData::create(obj, "test_counters", None).expect("create a per-CPU array");
    let second = MapData::from_fd(data.fd().as_fd().try_clone_to_owned().unwrap()).unwrap();
    let mut writer: PerCpuArray<MapData, u64> = PerCpuArray::try_from(Map::PerCpuArray(second)).unwrap();
    for id in 0..size {
        writer.set(id, PerCpuValues::try_from(value(id)).unwrap(), 0).unwrap();
    }
    ConnCounters::from_map(Map::PerCpuArray(data)).unwrap()
}

/// The value test counter `id` starts with, per CPU.
fn value(id: u32) -> Vec<u64> {
    (0..aya::util::nr_cpus().unwrap()).map(|cpu| u64::from(id) + 1 + cpu as u64).collect()
}

/// Every counter below `size` is zero if in `reset`, its starting value
/// otherwise.
fn check(counters: &ConnCounters, size: u32, reset: &[u32]) {
    for id in 0..size {
        let want = if reset.contains(&id) { 0 } else { value(id).iter().sum() };
        assert_eq!(counters.read(id).unwrap(), want, "id {id} of {size}");
    }
}
