//! Reading a hash map back in batches (`BPF_MAP_LOOKUP_BATCH`, what an
//! agent restart does with the services and backends maps) gives exactly
//! the entries one-at-a-time iteration gives: in the real kernel, over
//! many buckets, with batches smaller than a bucket's entries too (the
//! kernel then answers ENOSPC and the reader asks for more).
mod common;

use std::{
    collections::BTreeMap,
    os::fd::{AsFd as _, OwnedFd},
};

use aya::maps::{HashMap, Map, MapData};

/// A new, unpinned hash map of `u32 -> [u64; 3]` of `size` entries, and a
/// second descriptor of it (aya keeps its own to itself).
fn hash_map(size: u32) -> (HashMap<MapData, u32, [u64; 3]>, OwnedFd) {
    // BPF_MAP_TYPE_HASH, BPF_F_NO_PREALLOC (linux/bpf.h), as the agent's maps.
    let obj = aya_obj::Map::new_from_params(1, 4, 24, size, 1);
    let map = MapData::create(obj, "test_reads", None).expect("create a hash map");
    let fd = map.fd().as_fd().try_clone_to_owned().unwrap();
    (HashMap::try_from(Map::HashMap(map)).unwrap(), fd)
}

#[test]
fn batch_reads_give_every_entry_as_iteration_does() {
    common::require_root!();
    for (entries, chunk) in [(0u32, 16), (1, 16), (5000, 4096), (5000, 1), (20_000, 64)] {
        let (mut map, fd) = hash_map(entries.max(1) * 2);
        for k in 0..entries {
            let v = u64::from(k);
            map.insert(k.wrapping_mul(2_654_435_761), [v, v * 3, !v], 0).unwrap();
        }
        let iterated: BTreeMap<u32, [u64; 3]> = map.iter().map(Result::unwrap).collect();
        let read = ebpf_proxy::datapath::read_hash_map::<u32, [u64; 3]>(fd.as_fd(), chunk)
            .expect("batch read")
            .expect("this kernel has batch reads");
        assert_eq!(read.len(), entries as usize, "{entries} entries in chunks of {chunk}: none twice");
        let read: BTreeMap<u32, [u64; 3]> = read.into_iter().collect();
        assert_eq!(read, iterated, "{entries} entries in chunks of {chunk}");
        // Types of other sizes than the map's are refused, not read.
        let err = ebpf_proxy::datapath::read_hash_map::<u64, [u64; 3]>(fd.as_fd(), chunk).unwrap_err();
        assert!(err.to_string().contains("4 and 24 bytes"), "{err}");
    }
}
