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
    let cpus = aya::util::nr_cpus().unwrap();
    // More ids than one batch carries (4096), and a few.
    for (size, reset) in
        [(10_000u32, (1..9000).filter(|id| id % 3 != 0).collect::<Vec<u32>>()), (64, vec![5, 6, 63]), (64, vec![])]
    {
        // BPF_MAP_TYPE_PERCPU_ARRAY (linux/bpf.h), as the agent's CONNECTIONS.
        let obj = aya_obj::Map::new_from_params(6, 4, 8, size, 0);
        let data = MapData::create(obj, "test_counters", None).expect("create a per-CPU array");
        let second = MapData::from_fd(data.fd().as_fd().try_clone_to_owned().unwrap()).unwrap();
        let mut writer: PerCpuArray<MapData, u64> = PerCpuArray::try_from(Map::PerCpuArray(second)).unwrap();
        for id in 0..size {
            let values: Vec<u64> = (0..cpus).map(|cpu| u64::from(id) + 1 + cpu as u64).collect();
            writer.set(id, PerCpuValues::try_from(values).unwrap(), 0).unwrap();
        }
        let mut counters = ConnCounters::from_map(Map::PerCpuArray(data)).unwrap();
        counters.reset_all(&reset).expect("reset in batches");
        for id in 0..size {
            let want = if reset.contains(&id) { 0 } else { (0..cpus).map(|cpu| u64::from(id) + 1 + cpu as u64).sum() };
            assert_eq!(counters.read(id).unwrap(), want, "id {id} of {size}");
        }
    }
}
