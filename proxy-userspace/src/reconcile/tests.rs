//! The reconciler against fake maps: exact results, minimal writes, safe
//! ordering under injected faults, recovery after a restart.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use super::{
    BackendAddr, ChangeKind, Reconciler,
    codec::{self, FrontendFlags},
    fake_maps::{FakeMaps, TwoLists},
    maglev_tables::identity,
    maps::{Dump, MapError},
};
use crate::model::{
    Backend, BackendState, Frontend, FrontendKey, FrontendKind, Protocol, Reach, Scope, ServicePort, ServiceTable,
};
use ipnet::IpNet;
use proptest::prelude::*;

fn fk(last: u8, port: u16, protocol: Protocol) -> FrontendKey {
    FrontendKey::new(Ipv4Addr::new(10, 96, 0, last).into(), port, protocol)
}

fn fk6(last: u8, port: u16, protocol: Protocol) -> FrontendKey {
    FrontendKey::new(Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, u16::from(last)).into(), port, protocol)
}

fn be(last: u8, port: u16) -> Backend {
    Backend { addr: Ipv4Addr::new(10, 244, 0, last).into(), port, state: BackendState::Active, local: false }
}

fn be6(last: u8, port: u16) -> Backend {
    Backend {
        addr: Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, u16::from(last)).into(),
        port,
        state: BackendState::Active,
        local: false,
    }
}

fn table(entries: &[(FrontendKey, Vec<Backend>)]) -> ServiceTable {
    entries
        .iter()
        .map(|(k, b)| {
            (
                *k,
                Frontend::new(
                    ServicePort::new("ns", format!("svc-{}", k.addr), k.port.to_string()),
                    FrontendKind::ClusterIp,
                    b.clone(),
                ),
            )
        })
        .collect()
}

/// A NodePort frontend that traffic from outside reaches (`reach`), with
/// `backends` and optional source ranges.
fn external(backends: Vec<Backend>, reach: Reach, ranges: Option<Vec<IpNet>>) -> Frontend {
    Frontend {
        reach,
        source_ranges: ranges,
        ..Frontend::new(ServicePort::new("ns", "np", "http"), FrontendKind::NodePort, backends)
    }
}

/// What a reader in the kernel sees of one frontend.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// Affinity timeout (0: none).
    affinity: u32,
    /// Backends in slot order: address, port, terminating, local.
    backends: Vec<(IpAddr, u16, bool, bool)>,
    /// The Maglev table as backend addresses (traffic from outside).
    maglev: Option<Vec<(IpAddr, u16)>>,
    /// Source ranges, when restricted.
    ranges: Option<BTreeSet<IpNet>>,
    /// EXTERNAL_ONLY and TWO_SCOPES.
    outside_only: bool,
    two_scopes: bool,
}

/// Reads the maps back into a table: what a reader in the kernel sees.
fn decode(dump: &Dump) -> BTreeMap<FrontendKey, Seen> {
    let mut out = BTreeMap::new();
    for (key, slot_zero) in dump.services.iter().filter(|(k, _)| k.slot == 0) {
        let (k, _) = codec::frontend_of(key).expect("the agent writes known keys");
        let flags = FrontendFlags::decode(slot_zero.flags).expect("the agent writes known flags");
        let backend = |id: &u32| codec::backend_entry(&dump.backends[id]).expect("the agent writes known backends");
        let addr_of = |id: &u32| {
            let b = backend(id).addr;
            (b.addr, b.port)
        };
        let backends = (0..slot_zero.count)
            .map(|index| {
                let id = dump.services[&key.slots_of(index)].slot_id(index);
                let b = backend(&id);
                (b.addr.addr, b.addr.port, b.state == BackendState::Terminating, b.local)
            })
            .collect();
        assert_eq!(flags.affinity, slot_zero.affinity_timeout() != 0, "affinity flag and timeout disagree");
        let ranges = flags.source_ranges.then(|| {
            dump.source_ranges.iter().filter(|(id, _)| *id == slot_zero.rev_nat).map(|(_, net)| *net).collect()
        });
        out.insert(
            k,
            Seen {
                affinity: slot_zero.affinity_timeout(),
                backends,
                maglev: (slot_zero.maglev != 0).then(|| dump.maglev[&slot_zero.maglev].iter().map(addr_of).collect()),
                ranges,
                outside_only: flags.outside_only,
                two_scopes: flags.two_scopes,
            },
        );
    }
    out
}

/// The Maglev table of `backends`, as backend addresses.
fn maglev_of(backends: &[Backend], protocol: Protocol, size: usize) -> Vec<(IpAddr, u16)> {
    let ids: Vec<Vec<u8>> =
        backends.iter().map(|b| identity(&BackendAddr { addr: b.addr, port: b.port, protocol })).collect();
    crate::reconcile::maglev::table(&ids, size)
        .into_iter()
        .map(|i| (backends[i as usize].addr, backends[i as usize].port))
        .collect()
}

/// The table as the maps must show it. A backend has one entry, shared by
/// every frontend using it, whose state is the best any frontend gives it.
fn expected(desired: &ServiceTable, maglev_size: usize) -> BTreeMap<FrontendKey, Seen> {
    let mut best: BTreeMap<(IpAddr, u16, Protocol), (BackendState, bool)> = BTreeMap::new();
    for (k, f) in desired {
        for b in &f.backends {
            best.entry((b.addr, b.port, k.protocol))
                .and_modify(|(s, l)| {
                    *s = (*s).min(b.state);
                    *l |= b.local;
                })
                .or_insert((b.state, b.local));
        }
    }
    desired
        .iter()
        .map(|(k, f)| {
            let list = f.backends.iter().map(|b| {
                let (state, local) = best[&(b.addr, b.port, k.protocol)];
                (b.addr, b.port, state == BackendState::Terminating, local)
            });
            let seen = Seen {
                affinity: f.affinity_timeout.unwrap_or(0),
                backends: list.collect(),
                maglev: (f.reach.from_outside() && !f.backends.is_empty())
                    .then(|| maglev_of(&f.backends, k.protocol, maglev_size)),
                ranges: f.source_ranges.as_ref().map(|r| r.iter().copied().collect()),
                outside_only: k.scope == Scope::All && f.reach == Reach::Outside,
                two_scopes: k.scope == Scope::All && desired.contains_key(&k.with_scope(Scope::External)),
            };
            (*k, seen)
        })
        .collect()
}

/// The maps hold exactly `desired` and nothing else.
fn assert_exact(maps: &FakeMaps, desired: &ServiceTable) {
    use super::maps::ServiceMaps as _;
    assert_eq!(decode(&maps.state), expected(desired, maps.maglev_size()));
    let entries: usize = desired.values().map(|f| 1 + codec::slot_entries(f.backends.len())).sum();
    assert_eq!(maps.state.services.len(), entries, "stray service entries");
    // A slots entry's words past the frontend's last slot are 0.
    for (key, slot_zero) in maps.state.services.iter().filter(|(k, _)| k.slot == 0) {
        if let Some(last) = slot_zero.count.checked_sub(1) {
            let ids = maps.state.services[&key.slots_of(last)].slot_ids();
            let used = usize::from(last % proxy_common::SLOTS_PER_ENTRY) + 1;
            assert_eq!(ids[used..], [0; 4][used..], "{key:?}: words past slot {}", slot_zero.count);
        }
    }
    assert_eq!(maps.state.rev_nat.len(), desired.len(), "stray rev-NAT entries");
    let distinct: BTreeSet<_> =
        desired.iter().flat_map(|(k, f)| f.backends.iter().map(move |b| (b.addr, b.port, k.protocol))).collect();
    assert_eq!(maps.state.backends.len(), distinct.len(), "stray backends");
    // One Maglev table per distinct backend list (a backend is its address,
    // port and protocol), shared by the frontends that have it.
    let lists: BTreeSet<(Protocol, Vec<(IpAddr, u16)>)> = desired
        .iter()
        .filter(|(_, f)| f.reach.from_outside() && !f.backends.is_empty())
        .map(|(k, f)| (k.protocol, f.backends.iter().map(|b| (b.addr, b.port)).collect()))
        .collect();
    assert_eq!(maps.state.maglev.len(), lists.len(), "Maglev tables: one per distinct backend list");
    let ranges: usize = desired.values().map(|f| f.source_ranges.as_ref().map_or(0, Vec::len)).sum();
    assert_eq!(maps.state.source_ranges.len(), ranges, "stray source ranges");
    // Each frontend's service port, under its rev-NAT id, and no other.
    let names: BTreeMap<FrontendKey, ServicePort> = maps
        .state
        .services
        .iter()
        .filter(|(k, _)| k.slot == 0)
        .map(|(k, slot_zero)| {
            let (key, _) = codec::frontend_of(k).expect("the agent writes known keys");
            (key, codec::service_port_of(&maps.state.names[&slot_zero.rev_nat]))
        })
        .collect();
    let wanted: BTreeMap<FrontendKey, ServicePort> =
        desired.iter().map(|(k, f)| (*k, f.service_port.clone())).collect();
    assert_eq!(names, wanted, "service names");
    assert_eq!(maps.state.names.len(), desired.len(), "stray service names");
}

#[test]
fn add_update_remove() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    let web = fk(10, 80, Protocol::Tcp);
    let t1 = table(&[(web, vec![be(1, 8080), be(2, 8080), be(3, 8080)])]);
    let report = r.apply(&mut maps, &t1);
    assert!(report.failures.is_empty());
    assert_eq!(report.changes.len(), 1);
    assert_eq!(report.changes[0].kind, ChangeKind::Added);
    assert_exact(&maps, &t1);

    // Remove the middle backend: the slots entry rewritten (slot 3 kept
    // while slot 0 counts it), slot 0, the entry with slot 3 cleared, the
    // backend deleted.
    let t2 = table(&[(web, vec![be(1, 8080), be(3, 8080)])]);
    let report = r.apply(&mut maps, &t2);
    assert_exact(&maps, &t2);
    assert_eq!(report.writes, 4, "{report:?}");
    assert_eq!(report.changes[0].kind, ChangeKind::Updated);
    assert_eq!(report.changes[0].removed.len(), 1);
    assert_eq!(report.backends_removed, 1);

    let report = r.apply(&mut maps, &t2);
    assert_eq!(report.writes, 0, "a second apply of the same table writes nothing");
    assert!(report.changes.is_empty());

    let report = r.apply(&mut maps, &ServiceTable::new());
    assert_exact(&maps, &ServiceTable::new());
    assert_eq!(report.changes[0].kind, ChangeKind::Removed);
    assert!(maps.state.backends.is_empty());
}

/// A new frontend's change lists its backends in a sync that adds few; in
/// one that adds more than `LIST_NEW_FRONTENDS_UP_TO` frontends (a start)
/// the new ones are reported by key only, and a changed frontend's change
/// still lists what it gained; a whole table compared again with one
/// frontend new lists it.
#[test]
fn a_large_sync_reports_new_frontends_by_key() {
    use super::LIST_NEW_FRONTENDS_UP_TO;
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    let small = table(&[(fk(1, 80, Protocol::Tcp), vec![be(1, 8080), be(2, 8080)])]);
    let report = r.apply(&mut maps, &small);
    assert!(report.new_listed);
    assert!(report.added_unlisted.is_empty());
    assert_eq!((report.changes[0].backends, report.changes[0].added.len()), (2, 2));

    let entries: Vec<(FrontendKey, Vec<Backend>)> = (1..=u8::try_from(LIST_NEW_FRONTENDS_UP_TO + 2).unwrap())
        .map(|n| (fk(n, 80, Protocol::Tcp), vec![be(n, 8080), be(n.wrapping_add(1), 8080), be(3, 8080)]))
        .collect();
    let large = table(&entries);
    let report = r.apply(&mut maps, &large);
    assert_exact(&maps, &large);
    assert!(!report.new_listed);
    let new: Vec<FrontendKey> = entries[1..].iter().map(|(k, _)| *k).collect();
    assert_eq!(report.added_unlisted, new, "the new frontends, in the order written");
    assert_eq!((report.count(ChangeKind::Added), report.changed()), (new.len(), new.len() + 1));
    // Frontend 1 had backends 1 and 2; it gained 3.
    let [c] = &report.changes[..] else { panic!("{report:?}") };
    let three = BackendAddr { addr: be(3, 8080).addr, port: 8080, protocol: Protocol::Tcp };
    assert_eq!((c.kind, c.backends, &c.added), (ChangeKind::Updated, 3, &vec![three]), "{c:?}");
    // What the pipeline logs of each at debug level.
    assert_eq!(r.describe(&new[0]).map(|(port, n)| (port.clone(), n)), Some((large[&new[0]].service_port.clone(), 3)));

    // The whole table again (a relist), with one frontend more.
    let mut entries = entries;
    entries.push((fk(200, 80, Protocol::Tcp), vec![be(200, 8080)]));
    let report = r.apply(&mut maps, &table(&entries));
    assert!(report.new_listed);
    assert!(report.added_unlisted.is_empty());
    assert_eq!(report.changes.len(), 1, "{report:?}");
    assert_eq!((report.changes[0].kind, report.changes[0].added.len()), (ChangeKind::Added, 1));
}

/// A sync of a few changed services that adds more than
/// `LIST_NEW_FRONTENDS_UP_TO` frontends reports them by key as a start
/// does, and the frontends it did not touch stay as they were.
#[test]
fn a_change_that_adds_many_frontends_reports_them_by_key() {
    use super::LIST_NEW_FRONTENDS_UP_TO;
    let entries: Vec<(FrontendKey, Vec<Backend>)> =
        (1..=10).map(|n| (fk(n, 80, Protocol::Tcp), vec![be(n, 8080)])).collect();
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    assert!(r.apply(&mut maps, &table(&entries)).failures.is_empty());
    let more: Vec<(FrontendKey, Vec<Backend>)> = (0..=u16::try_from(LIST_NEW_FRONTENDS_UP_TO).unwrap())
        .map(|n| (fk(100, 1000 + n, Protocol::Tcp), vec![be(1, 9000), be(2, 9000)]))
        .collect();
    let all = table(&entries.iter().chain(&more).cloned().collect::<Vec<_>>());
    let changed: BTreeSet<FrontendKey> = more.iter().map(|(k, _)| *k).collect();
    let report = r.apply_changes(&mut maps, &all, &changed);
    assert!(report.failures.is_empty(), "{report:?}");
    assert_exact(&maps, &all);
    assert!(!report.new_listed);
    assert!(report.changes.is_empty(), "{:?}", report.changes);
    assert_eq!(report.added_unlisted, changed.iter().copied().collect::<Vec<_>>());
    assert_eq!(report.count(ChangeKind::Added), LIST_NEW_FRONTENDS_UP_TO + 1);
    for key in &changed {
        assert_eq!(r.describe(key).map(|(port, n)| (port.clone(), n)), Some((all[key].service_port.clone(), 2)));
    }
}

/// A start's table: more new frontends than a few bulk chunks
/// (`reconcile::new_frontends`), ClusterIPs of 0 to 2 backends; every 23rd
/// a NodePort entry with its external twin, every 31st a LoadBalancer with
/// source ranges: written one at a time, between and inside chunks.
fn start_table(frontends: u16) -> ServiceTable {
    let range: IpNet = "192.0.2.0/24".parse().unwrap();
    (0..frontends)
        .flat_map(|n| {
            let [hi, lo] = n.to_be_bytes();
            let key = FrontendKey::new(Ipv4Addr::new(10, 96, hi, lo).into(), 80, Protocol::Tcp);
            let backends: Vec<Backend> = (0..n % 3).map(|b| be(u8::try_from((n + b) % 200).unwrap(), 8080)).collect();
            let port = ServicePort::new("ns", format!("s{n}"), "http");
            if n % 23 == 0 {
                let entry = Frontend { service_port: port.clone(), ..external(backends.clone(), Reach::Both, None) };
                let twin = Frontend { service_port: port, ..external(backends, Reach::Outside, None) };
                return vec![(key, entry), (key.with_scope(Scope::External), twin)];
            }
            if n % 31 == 0 {
                return vec![(
                    key,
                    Frontend { service_port: port, ..external(backends, Reach::Both, Some(vec![range])) },
                )];
            }
            vec![(key, Frontend::new(port, FrontendKind::ClusterIp, backends))]
        })
        .collect()
}

/// The frontends a report names, and whether it names each as added
/// (those of a start: by key, `Report::added_unlisted`).
fn reported(report: &super::Report) -> (BTreeSet<FrontendKey>, bool) {
    let named = report.changes.iter().map(|c| c.frontend).chain(report.added_unlisted.iter().copied());
    (named.collect(), report.changes.is_empty())
}

#[test]
fn a_start_is_written_in_bulk_whole_in_key_order() {
    // Enough chunks (of 100 in tests) that the frontends' tree is packed
    // in the middle of the sync as well (`apply_updates`).
    let t = start_table(450);
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    let report = r.apply(&mut maps, &t);
    assert!(report.failures.is_empty(), "{report:?}");
    assert_exact(&maps, &t);
    assert_eq!(report.changed(), t.len(), "each frontend reported once");
    assert_eq!(reported(&report), (t.keys().copied().collect(), true));
    // The ClusterIPs (neither reached from outside nor with source
    // ranges) went in bulk: their rev-NAT entries and names through the
    // batch writes, the others' one at a time.
    let bulk = t.values().filter(|f| f.kind == FrontendKind::ClusterIp).count();
    assert!(bulk > 200, "the bulk spans chunks (of 100 in tests)");
    assert_eq!(maps.batched, 2 * bulk, "rev-NAT entries and names written in bulk");
    // Each frontend: its rev-NAT entry, slots entries, slot 0 and name;
    // each backend once; a source range each; a Maglev table per backend
    // list of traffic from outside.
    let slots: usize = t.values().map(|f| codec::slot_entries(f.backends.len())).sum();
    let ranges: usize = t.values().map(|f| f.source_ranges.as_ref().map_or(0, Vec::len)).sum();
    let tables = maps.state.maglev.len();
    assert_eq!(report.writes, maps.state.backends.len() + 3 * t.len() + slots + ranges + tables);
    // Ids in the order frontends are written: external twins first.
    let mut order: Vec<FrontendKey> = t.keys().copied().collect();
    order.sort_by_key(|k| (k.scope != Scope::External, *k));
    let by_id: BTreeMap<_, _> = r.frontend_ids().map(|(id, key, _)| (id, key)).collect();
    assert_eq!(by_id.into_values().collect::<Vec<_>>(), order, "rev-NAT ids in write order");
}

#[test]
fn a_whole_table_sync_writes_new_frontends_among_known_ones() {
    // A relist after frontends were added: two in three are known (their
    // backend ids are not kept for the bulk write), the new ones lie
    // between them and are written in bulk with the ids `want` reserved.
    let all = start_table(250);
    let known = |k: &FrontendKey| match k.addr {
        IpAddr::V4(a) => a.octets()[3] % 3 != 0,
        IpAddr::V6(_) => true,
    };
    let before: ServiceTable = all.iter().filter(|(k, _)| known(k)).map(|(k, f)| (*k, f.clone())).collect();
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    assert!(r.apply(&mut maps, &before).failures.is_empty());
    maps.batched = 0;
    let report = r.apply(&mut maps, &all);
    assert!(report.failures.is_empty(), "{report:?}");
    assert_exact(&maps, &all);
    assert!(report.changes.is_empty(), "{:?}", report.changes);
    let added: BTreeSet<FrontendKey> = report.added_unlisted.iter().copied().collect();
    let new: BTreeSet<FrontendKey> = all.keys().filter(|k| !known(k)).copied().collect();
    assert!(!new.is_empty());
    assert_eq!(added, new, "exactly the new frontends are added");
    let new_cluster_ips = all.iter().filter(|(k, f)| !known(k) && f.kind == FrontendKind::ClusterIp).count();
    assert_eq!(maps.batched, 2 * new_cluster_ips, "the new ClusterIPs written in bulk");
}

#[test]
fn a_start_whose_write_fails_in_a_bulk_chunk_reports_what_is_served_and_converges() {
    let t = start_table(250);
    // Writes of the whole start, to place the failure across them (every
    // 53rd, ~25 places; each apply checks the reader's view after each of
    // its ~1,300 writes): in each map's batch of a chunk, between chunks,
    // inside one, in the last.
    let total = {
        let mut maps = FakeMaps::default();
        Reconciler::new().apply(&mut maps, &t);
        maps.ops
    };
    for fail in (0..total).step_by(53) {
        let mut maps = FakeMaps { fail_at: Some(fail), ..FakeMaps::default() };
        let mut r = Reconciler::new();
        // Every write is checked for what a reader sees (no slot 0 before
        // its slots, rev-NAT entry and backends).
        let report = r.apply(&mut maps, &t);
        let served: BTreeSet<FrontendKey> = decode(&maps.state).into_keys().collect();
        let (listed, added) = reported(&report);
        assert_eq!(listed, served, "failing write {fail}: the report lists what is served");
        assert_eq!(report.changed(), listed.len(), "failing write {fail}: each reported once");
        assert!(added, "failing write {fail}: each listed as added");
        // A failed batch is tried again one frontend at a time, which
        // succeeds: a failure is reported only when that one fails.
        assert!(report.failures.len() <= 1, "failing write {fail}: {:?}", report.failures);
        maps.fail_at = None;
        let retry = r.apply(&mut maps, &t);
        assert!(retry.failures.is_empty(), "failing write {fail}: {retry:?}");
        assert_exact(&maps, &t);
        let (listed, _) = reported(&retry);
        let rest: BTreeSet<FrontendKey> = t.keys().copied().filter(|k| !served.contains(k)).collect();
        assert!(listed.is_superset(&rest), "failing write {fail}: the retry writes the rest");
    }
}

#[test]
fn a_full_map_in_a_bulk_chunk_leaves_room_for_the_frontends_that_fit() {
    // Room for 350 entries: the second chunk's slots fit, but only half
    // its slots 0 beside them. Its other slots are removed again and its
    // frontends written one at a time: every frontend that fits is served
    // (as `full_map_fails_only_what_does_not_fit`), and the ones reported
    // failed are the ones not served.
    //
    // Also frontends of 9 backends (a slot 0 and 3 slots entries each) in
    // room for 250: the first chunk's slots entries (300) fill the map
    // while both lanes write them, each lane may be the one to find it
    // full, and which frontends got the room depends on the order.
    for (backends, capacity) in [(1, 350), (9, 250)] {
        let t = table(
            &(0..250u16)
                .map(|n| {
                    let [hi, lo] = n.to_be_bytes();
                    let key = FrontendKey::new(Ipv4Addr::new(10, 96, hi, lo).into(), 80, Protocol::Tcp);
                    let list = (0..backends).map(|j| be(u8::try_from((n * 9 + j) % 100).unwrap(), 8080)).collect();
                    (key, list)
                })
                .collect::<Vec<_>>(),
        );
        let entries = 1 + codec::slot_entries(usize::from(backends));
        // A chunk's rev-NAT and slots entries, then its slots 0 and names,
        // are written in two lanes at once (`ServiceMaps::write_lanes`).
        for two_lists in TwoLists::ALL {
            let what = format!("{backends} backends, {two_lists:?}");
            let mut maps = FakeMaps { capacity: Some(capacity), two_lists, ..FakeMaps::default() };
            let mut r = Reconciler::new();
            let report = r.apply(&mut maps, &t);
            assert!(report.failures.iter().all(|f| matches!(f.error, MapError::Full { .. })), "{what}: {report:?}");
            let served: BTreeSet<FrontendKey> = decode(&maps.state).into_keys().collect();
            // Each served frontend takes `entries`; at most one frontend's
            // slots entries wait for room for their slot 0.
            let fit = capacity / entries;
            assert!((fit - 1..=fit).contains(&served.len()), "{what}: {} served", served.len());
            if backends == 1 {
                assert_eq!(served.len(), 175, "{what}: each served frontend takes two entries");
            }
            assert_eq!(reported(&report).0, served, "{what}");
            let failed: BTreeSet<String> = report.failures.iter().map(|f| f.subject.clone()).collect();
            let unserved: BTreeSet<String> = t
                .iter()
                .filter(|(k, _)| !served.contains(*k))
                .map(|(k, f)| format!("{} {k}", f.service_port))
                .collect();
            assert_eq!(failed, unserved, "{what}: the failures name the frontends not served");
            // Room made: the retry serves them all.
            maps.capacity = None;
            assert!(r.apply(&mut maps, &t).failures.is_empty(), "{what}");
            assert_exact(&maps, &t);
        }
    }
}

#[test]
fn shared_backend_outlives_one_service() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    let a = fk(1, 80, Protocol::Tcp);
    let b = fk(2, 80, Protocol::Tcp);
    r.apply(&mut maps, &table(&[(a, vec![be(1, 80)]), (b, vec![be(1, 80)])]));
    assert_eq!(maps.state.backends.len(), 1, "one backend entry for both services");
    let t = table(&[(b, vec![be(1, 80)])]);
    r.apply(&mut maps, &t);
    assert_exact(&maps, &t);
}

/// Four backend slots to a `SERVICES` entry: a change rewrites only the
/// entries whose slots change, a shrink deletes the entries past the new
/// count after slot 0 and clears the last one's slots past it, and a
/// reader never follows the count to a missing id (checked after every
/// write by `FakeMaps`).
#[test]
fn slots_entries_are_rewritten_only_where_slots_change() {
    let key = fk(1, 80, Protocol::Tcp);
    let backends = |lasts: &[u8]| table(&[(key, lasts.iter().map(|l| be(*l, 80)).collect())]);
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    // (table, writes of the frontend's entries, BACKENDS writes)
    let steps: &[(&[u8], usize, usize, &str)] = &[
        (&[1, 2, 3, 4, 5, 6, 7, 8, 9], 6, 9, "rev-NAT entry, three entries, slot 0, name"),
        // Slot 0's count first, then entry 2 deleted and the last two
        // slots of entry 1 cleared.
        (&[1, 2, 3, 4, 5, 6], 3, 3, "shrunk within an entry and past one"),
        (&[1, 2, 3, 4, 5, 6, 7], 2, 1, "grown into the last entry: it and slot 0"),
        (&[1, 2, 3, 4, 5, 6, 8], 1, 2, "one slot's backend replaced: its entry only"),
        (&[1, 2, 3, 4, 5], 2, 2, "slot 0, then the last entry cleared past slot 5"),
        (&[1, 2, 3, 4], 2, 1, "slot 0, then the entry past it deleted"),
        (&[], 2, 4, "slot 0, then the only entry deleted"),
        (&[1, 2], 2, 2, "one entry, then slot 0"),
        (&[3, 1], 1, 2, "both slots change: one entry"),
    ];
    for (lasts, entries, backend_writes, what) in steps {
        let t = backends(lasts);
        let report = r.apply(&mut maps, &t);
        assert!(report.failures.is_empty(), "{what}: {report:?}");
        assert_exact(&maps, &t);
        assert_eq!(report.writes, entries + backend_writes, "{what}");
    }
}

#[test]
fn empty_frontend_is_programmed_with_count_zero() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    let t = table(&[(fk(1, 80, Protocol::Tcp), vec![])]);
    r.apply(&mut maps, &t);
    assert_exact(&maps, &t);
    assert_eq!(maps.state.services.values().next().unwrap().count, 0);
}

#[test]
fn full_map_fails_only_what_does_not_fit() {
    // Five backends fit (the backends array of 6 holds ids 1 to 5); the
    // services map's 4 × 2 entries (slot 0 and one slots entry each) do
    // not. (With room for only four backends, which one is left out
    // followed hash map order: the test passed or failed by chance.)
    let mut maps = FakeMaps { capacity: Some(6), ..FakeMaps::default() };
    let mut r = Reconciler::new();
    let four = vec![be(2, 80), be(3, 80), be(4, 80), be(5, 80)];
    let mut entries = vec![(fk(1, 80, Protocol::Tcp), vec![be(1, 80)])];
    entries.extend((2..5).map(|n| (fk(n, 80, Protocol::Tcp), four.clone())));
    let t = table(&entries);
    let report = r.apply(&mut maps, &t);
    assert!(report.failures.iter().all(|f| f.error.to_string().contains("SERVICES is full")), "{report:?}");
    assert!(!report.failures.is_empty(), "{report:?}");
    // Which three got the room depends on the two writers; each is whole.
    let seen = decode(&maps.state);
    assert_eq!(seen.len(), 3, "the frontends that fit are programmed: {seen:?}");
    for (key, s) in &seen {
        assert_eq!(s.backends.len(), t[key].backends.len(), "{key} whole");
    }
}

#[test]
fn recovery_after_restart_writes_nothing_when_in_sync() {
    let mut maps = FakeMaps::default();
    let t = table(&[
        (fk(1, 80, Protocol::Tcp), vec![be(1, 80), be(2, 80)]),
        (fk(1, 53, Protocol::Udp), vec![be(1, 53)]),
        (fk(2, 80, Protocol::Tcp), vec![]),
    ]);
    Reconciler::new().apply(&mut maps, &t);
    let (mut r, recovery) = Reconciler::recover(&mut maps).unwrap();
    assert_eq!(recovery.frontends, 3);
    assert_eq!(recovery.stale_entries_removed, 0);
    let report = r.apply(&mut maps, &t);
    assert_eq!(report.writes, 0, "{report:?}");
    assert_exact(&maps, &t);
}

#[test]
fn a_backend_read_back_at_two_ids_ends_at_the_lower_one() {
    // A crash left backend 10.244.0.2 in BACKENDS at a second id, 3, which
    // the second frontend's slot names. The first sync takes the lower id
    // (the index's) for both frontends, not the id a slot held, and
    // deletes the other.
    let mut maps = FakeMaps::default();
    let (a, b) = (fk(1, 80, Protocol::Tcp), fk(2, 80, Protocol::Tcp));
    let t = table(&[(a, vec![be(1, 80), be(2, 80)]), (b, vec![be(2, 80)])]);
    Reconciler::new().apply(&mut maps, &t);
    assert_eq!(maps.state.backends.keys().copied().collect::<Vec<_>>(), [1, 2]);
    maps.state.backends.insert(3, maps.state.backends[&2]);
    maps.state.services.insert(codec::slots_key(b, 0), codec::slots_value(&[3], 0));
    let (mut r, _) = Reconciler::recover(&mut maps).unwrap();
    r.apply(&mut maps, &t);
    assert_exact(&maps, &t);
    assert_eq!(maps.state.services[&codec::slots_key(b, 0)].slot_ids()[0], 2);
    assert!(!maps.state.backends.contains_key(&3));
}

#[test]
fn recovery_removes_entries_the_agent_never_writes() {
    let mut maps = FakeMaps::default();
    let t = table(&[(fk(1, 80, Protocol::Tcp), vec![be(1, 80)])]);
    Reconciler::new().apply(&mut maps, &t);
    let slot_zero = codec::service_key(fk(1, 80, Protocol::Tcp), 0);
    let value = proxy_common::ServiceValue { count: 0, ..maps.state.services[&slot_zero] };
    // DCCP (33) and a scope that does not exist: no reader of ours finds them.
    let dccp = proxy_common::ServiceKey { proto: 33, ..slot_zero };
    let scope = proxy_common::ServiceKey { scope: 7, ..slot_zero };
    maps.state.services.insert(dccp, value);
    maps.state.services.insert(scope, value);
    let backend = maps.state.backends.values().next().copied().unwrap();
    maps.state.backends.insert(900, proxy_common::Backend { proto: 33, ..backend });
    let (mut r, recovery) = Reconciler::recover(&mut maps).unwrap();
    assert_eq!(recovery.stale_entries_removed, 3);
    assert!(!maps.state.services.contains_key(&dccp) && !maps.state.services.contains_key(&scope));
    assert!(!maps.state.backends.contains_key(&900));
    assert_eq!(r.apply(&mut maps, &t).writes, 0, "the rest is as it was");
    assert_exact(&maps, &t);
}

#[test]
fn recovery_removes_unreachable_entries() {
    let mut maps = FakeMaps::default();
    let t = table(&[(fk(1, 80, Protocol::Tcp), vec![be(1, 80)])]);
    Reconciler::new().apply(&mut maps, &t);
    // A crash left a slot without slot 0, a rev-NAT of nobody and a slot above count.
    let stray = codec::service_key(fk(9, 80, Protocol::Tcp), 1);
    maps.state.services.insert(stray, proxy_common::ServiceValue { backend_id: 1, ..Default::default() });
    maps.state.rev_nat.insert(77, proxy_common::RevNat::default());
    let above = codec::service_key(fk(1, 80, Protocol::Tcp), 2);
    maps.state.services.insert(above, proxy_common::ServiceValue { backend_id: 1, ..Default::default() });
    let (mut r, recovery) = Reconciler::recover(&mut maps).unwrap();
    assert_eq!(recovery.stale_entries_removed, 2);
    r.apply(&mut maps, &t);
    assert_exact(&maps, &t);
}

#[test]
fn names_follow_the_frontends_through_a_restart() {
    let mut maps = FakeMaps::default();
    let mut t = table(&[(fk(1, 80, Protocol::Tcp), vec![be(1, 80)]), (fk(2, 53, Protocol::Udp), vec![])]);
    Reconciler::new().apply(&mut maps, &t);
    assert_exact(&maps, &t);
    // A name of nobody (a crash between removing a frontend and its name).
    maps.state.names.insert(77, proxy_common::ServiceName::default());
    let (mut r, recovery) = Reconciler::recover(&mut maps).unwrap();
    assert_eq!(recovery.stale_entries_removed, 1);
    // The recovered reconciler knows the names: in sync, nothing to write.
    assert_eq!(r.apply(&mut maps, &t).writes, 0);
    let ids: Vec<_> = r.frontend_ids().collect();
    assert_eq!(ids[0].2, t[&fk(1, 80, Protocol::Tcp)].service_port);
    // The names read back are equal to the table's; after the apply the
    // reconciler holds the table's very strings, not a copy of them.
    assert!(ids.iter().all(|(_, key, port)| port.shares(&t[key].service_port)), "{ids:?}");
    // Another service takes the address: only its name is written.
    t.get_mut(&fk(1, 80, Protocol::Tcp)).unwrap().service_port = ServicePort::new("other", "web", "http");
    let report = r.apply(&mut maps, &t);
    assert_eq!(report.writes, 1, "{report:?}");
    assert_eq!(report.changes[0].service_port, ServicePort::new("other", "web", "http"));
    assert_exact(&maps, &t);
    t.remove(&fk(1, 80, Protocol::Tcp));
    r.apply(&mut maps, &t);
    assert_exact(&maps, &t);
}

fn arb_reach() -> impl Strategy<Value = Reach> {
    prop_oneof![Just(Reach::LocalClients), Just(Reach::Both), Just(Reach::Outside)]
}

fn arb_ranges() -> impl Strategy<Value = Option<Vec<IpNet>>> {
    let net = prop_oneof![
        Just("203.0.113.0/24".parse::<IpNet>().unwrap()),
        Just("198.51.100.7/32".parse().unwrap()),
        Just("fd00:1::/64".parse().unwrap()),
    ];
    prop::option::weighted(0.3, prop::collection::btree_set(net, 0..3).prop_map(|s| s.into_iter().collect()))
}

fn arb_table() -> impl Strategy<Value = ServiceTable> {
    // Frontends 0..3 are IPv4, 3..5 IPv6, each with backends of its family,
    // in either scope.
    let key = (
        0u8..5,
        prop_oneof![Just(80u16), Just(443)],
        prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp)],
        prop::bool::weighted(0.3),
    );
    // One state per address and port, as the model gives; odd addresses
    // are on this node.
    let backends =
        prop::collection::btree_map((1u8..8, prop_oneof![Just(8080u16), Just(9090)]), prop::bool::weighted(0.2), 0..10)
            .prop_map(|m| m.into_iter().map(|((l, p), t)| (l, p, t)).collect::<Vec<_>>());
    let affinity = prop::option::of(prop_oneof![Just(10_800u32), Just(60)]);
    // A frontend may change hands (another service's name at its address).
    let namespace = prop_oneof![Just("ns"), Just("other")];
    prop::collection::btree_map(key, (backends, affinity, arb_reach(), arb_ranges(), namespace), 0..6).prop_map(|m| {
        m.into_iter()
            .map(|((a, p, proto, twin), (bs, affinity_timeout, reach, ranges, namespace))| {
                let mut list: Vec<Backend> = bs
                    .into_iter()
                    .map(|(l, port, term)| Backend {
                        state: if term { BackendState::Terminating } else { BackendState::Active },
                        local: l % 2 == 1,
                        ..if a < 3 { be(l, port) } else { be6(l, port) }
                    })
                    .collect();
                list.sort();
                let mut k = if a < 3 { fk(a, p, proto) } else { fk6(a, p, proto) };
                let (kind, reach) = if twin {
                    k.scope = Scope::External;
                    (FrontendKind::NodePort, Reach::Outside)
                } else if reach == Reach::LocalClients {
                    (FrontendKind::ClusterIp, reach)
                } else {
                    (FrontendKind::LoadBalancer, reach)
                };
                let source_ranges = ranges.filter(|_| reach.from_outside());
                let frontend = Frontend {
                    affinity_timeout,
                    reach,
                    source_ranges,
                    ..Frontend::new(ServicePort::new(namespace, format!("s{a}"), p.to_string()), kind, list)
                };
                (k, frontend)
            })
            .collect()
    })
}

/// Maps with `a` written, then `b` written until write `fail` failed (the
/// agent stopped there).
fn after_a_failed_write(a: &ServiceTable, b: &ServiceTable, fail: usize) -> FakeMaps {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    r.apply(&mut maps, a);
    maps.fail_at = Some(maps.ops + fail);
    let _ = r.apply(&mut maps, b);
    maps.fail_at = None;
    maps
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any sequence of tables: after each apply the maps hold exactly the
    /// table, a reader never sees a dangling slot (checked after every
    /// write), a repeated apply writes nothing, and recovery is a no-op.
    #[test]
    fn converges_exactly_and_safely(tables in prop::collection::vec(arb_table(), 1..6)) {
        let mut maps = FakeMaps::default();
        let mut r = Reconciler::new();
        for t in &tables {
            let report = r.apply(&mut maps, t);
            prop_assert!(report.failures.is_empty());
            assert_exact(&maps, t);
            prop_assert_eq!(r.apply(&mut maps, t).writes, 0);
            let (mut recovered, _) = Reconciler::recover(&mut maps).unwrap();
            prop_assert_eq!(recovered.apply(&mut maps, t).writes, 0);
        }
    }

    /// The same sequences applied with only the keys that differ from the
    /// previous table: the maps hold exactly each table (a reader's view is
    /// checked after every write), and a full apply afterwards writes
    /// nothing: the incremental path leaves what the full one would.
    #[test]
    fn applying_only_the_changed_keys_converges_exactly(tables in prop::collection::vec(arb_table(), 1..6)) {
        let mut maps = FakeMaps::default();
        let mut r = Reconciler::new();
        let mut previous = ServiceTable::new();
        for t in &tables {
            let changed: BTreeSet<FrontendKey> =
                previous.keys().chain(t.keys()).filter(|k| previous.get(k) != t.get(k)).copied().collect();
            let report = r.apply_changes(&mut maps, t, &changed);
            prop_assert!(report.failures.is_empty());
            assert_exact(&maps, t);
            prop_assert_eq!(r.apply(&mut maps, t).writes, 0, "a full apply found more to do");
            previous = t.clone();
        }
    }

    /// A write that fails at any point of an incremental apply leaves a safe
    /// map, and the retry (a full apply, as the agent retries) converges.
    #[test]
    fn a_failed_incremental_apply_converges_on_retry(a in arb_table(), b in arb_table(), fail in 0usize..40, two_lists in prop::sample::select(TwoLists::ALL.to_vec())) {
        let mut maps = FakeMaps { two_lists, ..FakeMaps::default() };
        let mut r = Reconciler::new();
        r.apply(&mut maps, &a);
        let changed: BTreeSet<FrontendKey> = a.keys().chain(b.keys()).filter(|k| a.get(k) != b.get(k)).copied().collect();
        maps.fail_at = Some(maps.ops + fail);
        let _ = r.apply_changes(&mut maps, &b, &changed);
        maps.fail_at = None;
        let report = r.apply(&mut maps, &b);
        prop_assert!(report.failures.is_empty());
        assert_exact(&maps, &b);
    }

    /// A write that fails at any point leaves a safe map (checked after every
    /// write) and the next apply converges to the table.
    #[test]
    fn converges_after_a_failed_write(a in arb_table(), b in arb_table(), fail in 0usize..40, two_lists in prop::sample::select(TwoLists::ALL.to_vec())) {
        let mut maps = FakeMaps { two_lists, ..FakeMaps::default() };
        let mut r = Reconciler::new();
        r.apply(&mut maps, &a);
        maps.fail_at = Some(maps.ops + fail);
        let _ = r.apply(&mut maps, &b);
        maps.fail_at = None;
        let report = r.apply(&mut maps, &b);
        prop_assert!(report.failures.is_empty());
        assert_exact(&maps, &b);
    }

    /// The same, with the agent stopped right after the failed write: a
    /// new one reads what the failure left (slots entries still holding
    /// ids past a count, entries of a frontend without its slot 0) back
    /// and converges.
    #[test]
    fn a_restart_after_a_failed_write_converges(a in arb_table(), b in arb_table(), fail in 0usize..40) {
        let mut maps = after_a_failed_write(&a, &b, fail);
        let (mut recovered, _) = Reconciler::recover(&mut maps).unwrap();
        let report = recovered.apply(&mut maps, &b);
        prop_assert!(report.failures.is_empty());
        assert_exact(&maps, &b);
        prop_assert_eq!(recovered.apply(&mut maps, &b).writes, 0);
    }
}

/// Maps whose read-back hands each map's entries over in the reverse of
/// the fake maps' order (the kernel's hash maps give theirs in no order),
/// and can fail the `n`th read of the names.
struct Reversed {
    maps: FakeMaps,
    fail_names_read: Option<usize>,
    names_reads: std::cell::Cell<usize>,
}

impl Reversed {
    fn of(maps: &FakeMaps) -> Self {
        let maps = FakeMaps { state: maps.state.clone(), ..FakeMaps::default() };
        Self { maps, fail_names_read: None, names_reads: std::cell::Cell::new(0) }
    }
}

impl super::ServiceMaps for Reversed {
    fn set_backend(&mut self, id: u32, value: &proxy_common::Backend) -> Result<(), MapError> {
        self.maps.set_backend(id, value)
    }
    fn remove_backend(&mut self, id: u32, held: &proxy_common::Backend) -> Result<(), MapError> {
        self.maps.remove_backend(id, held)
    }
    fn set_service(
        &mut self,
        key: &proxy_common::ServiceKey,
        value: &proxy_common::ServiceValue,
    ) -> Result<(), MapError> {
        self.maps.set_service(key, value)
    }
    fn remove_service(&mut self, key: &proxy_common::ServiceKey) -> Result<(), MapError> {
        self.maps.remove_service(key)
    }
    fn set_rev_nat(&mut self, id: proxy_common::RevNatId, value: &proxy_common::RevNat) -> Result<(), MapError> {
        self.maps.set_rev_nat(id, value)
    }
    fn remove_rev_nat(&mut self, id: proxy_common::RevNatId) -> Result<(), MapError> {
        self.maps.remove_rev_nat(id)
    }
    fn maglev_size(&self) -> usize {
        self.maps.maglev_size()
    }
    fn set_maglev(&mut self, id: u16, table: &[u32]) -> Result<(), MapError> {
        self.maps.set_maglev(id, table)
    }
    fn remove_maglev(&mut self, id: u16) -> Result<(), MapError> {
        self.maps.remove_maglev(id)
    }
    fn set_source_range(&mut self, rev_nat: proxy_common::RevNatId, net: IpNet) -> Result<(), MapError> {
        self.maps.set_source_range(rev_nat, net)
    }
    fn remove_source_range(&mut self, rev_nat: proxy_common::RevNatId, net: IpNet) -> Result<(), MapError> {
        self.maps.remove_source_range(rev_nat, net)
    }
    fn set_name(&mut self, rev_nat: proxy_common::RevNatId, name: &proxy_common::ServiceName) -> Result<(), MapError> {
        self.maps.set_name(rev_nat, name)
    }
    fn remove_name(&mut self, rev_nat: proxy_common::RevNatId) -> Result<(), MapError> {
        self.maps.remove_name(rev_nat)
    }
    fn read(&self, map: super::MapName, each: &mut dyn FnMut(super::Entry<'_>)) -> Result<(), MapError> {
        if map == super::MapName::Names {
            let n = self.names_reads.get() + 1;
            self.names_reads.set(n);
            if self.fail_names_read == Some(n) {
                let source = std::io::Error::other("injected read fault");
                return Err(MapError::Syscall { map, op: "injected", source });
            }
        }
        self.maps.state.read_in(map, true, each);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The maps read back one entry at a time in any order (here: the
    /// reverse of the sorted one), also maps a failed write left (slots
    /// past a count, a frontend without its slot 0): the same recovery,
    /// the same stale entries deleted, and the same writes after it.
    #[test]
    fn recovery_takes_the_entries_in_any_order(a in arb_table(), b in arb_table(), fail in 0usize..40) {
        let mut maps = after_a_failed_write(&a, &b, fail);
        let mut reversed = Reversed::of(&maps);
        let (mut in_order, recovery) = Reconciler::recover(&mut maps).unwrap();
        let (mut out_of_order, reversed_recovery) = Reconciler::recover(&mut reversed).unwrap();
        prop_assert_eq!(recovery, reversed_recovery);
        prop_assert_eq!(&maps.state, &reversed.maps.state, "the same stale entries deleted");
        let report = in_order.apply(&mut maps, &b);
        let reversed_report = out_of_order.apply(&mut reversed, &b);
        prop_assert!(report.failures.is_empty() && reversed_report.failures.is_empty());
        prop_assert_eq!(report.writes, reversed_report.writes);
        assert_exact(&reversed.maps, &b);
        let ids = |r: &Reconciler| r.frontend_ids().collect::<Vec<_>>();
        prop_assert_eq!(ids(&in_order), ids(&out_of_order));
    }
}

#[test]
fn a_restart_reads_the_names_with_the_table() {
    let mut maps = FakeMaps::default();
    let (web, dns, gone) = (fk(1, 80, Protocol::Tcp), fk(2, 53, Protocol::Udp), fk(3, 80, Protocol::Tcp));
    let t = table(&[(web, vec![be(1, 80)]), (dns, vec![be(2, 53)]), (gone, vec![be(3, 80)])]);
    Reconciler::new().apply(&mut maps, &t);
    let (mut r, _) = Reconciler::recover(&mut maps).unwrap();
    // Another service at web's address, and one gone.
    let mut next = t.clone();
    next.get_mut(&web).unwrap().service_port = ServicePort::new("other", "web", "http");
    next.remove(&gone);
    let report = r.apply(&mut maps, &next);
    assert!(report.failures.is_empty(), "{report:?}");
    assert_exact(&maps, &next);
    let change = |key| report.changes.iter().find(|c| c.frontend == key).expect("a change");
    assert_eq!(change(web).service_port, ServicePort::new("other", "web", "http"), "its name written anew");
    let removed = change(gone);
    assert_eq!((removed.kind, &removed.service_port), (ChangeKind::Removed, &t[&gone].service_port), "as read back");
    assert!(report.changes.iter().all(|c| c.frontend != dns), "dns is as it was");
    let ids: Vec<_> = r.frontend_ids().collect();
    assert!(ids.iter().all(|(_, key, port)| port.shares(&next[key].service_port)), "{ids:?}");
}

#[test]
fn names_that_cannot_be_read_back_are_written_again() {
    let mut maps = FakeMaps::default();
    let (web, gone) = (fk(1, 80, Protocol::Tcp), fk(3, 80, Protocol::Tcp));
    let t = table(&[(web, vec![be(1, 80)]), (gone, vec![be(3, 80)])]);
    Reconciler::new().apply(&mut maps, &t);
    let mut maps = Reversed { fail_names_read: Some(2), ..Reversed::of(&maps) };
    let (mut r, recovery) = Reconciler::recover(&mut maps).unwrap();
    assert_eq!(recovery.stale_entries_removed, 0);
    let mut next = t.clone();
    next.remove(&gone);
    let report = r.apply(&mut maps, &next);
    assert_eq!(report.failures.len(), 1, "the read: {report:?}");
    assert_exact(&maps.maps, &next);
    assert!(!maps.maps.state.names.values().any(|n| *n == codec::service_name(&t[&gone].service_port)), "deleted");
    // The retry (a whole apply) finds the maps as the table wants them.
    let report = r.apply(&mut maps, &next);
    assert_eq!((report.failures.len(), report.writes), (0, 0), "{report:?}");
}

#[test]
fn external_frontends_share_one_maglev_table_per_backend_list() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    let node_ip = |last| FrontendKey::new(Ipv4Addr::new(172, 30, 0, last).into(), 30080, Protocol::Tcp);
    let backends = vec![be(1, 8080), be(2, 8080), be(3, 8080)];
    let mut t = ServiceTable::new();
    t.insert(
        fk(10, 80, Protocol::Tcp),
        Frontend::new(ServicePort::new("ns", "web", "http"), FrontendKind::ClusterIp, backends.clone()),
    );
    t.insert(node_ip(11), external(backends.clone(), Reach::Both, None));
    t.insert(node_ip(12), external(backends.clone(), Reach::Both, None));
    let report = r.apply(&mut maps, &t);
    assert!(report.failures.is_empty(), "{report:?}");
    assert_exact(&maps, &t);
    assert_eq!(maps.state.maglev.len(), 1, "the two node addresses share a table; the ClusterIP has none");

    // A backend more: a new table replaces the old, which is deleted.
    let more = vec![be(1, 8080), be(2, 8080), be(3, 8080), be(4, 8080)];
    t.insert(node_ip(11), external(more.clone(), Reach::Both, None));
    t.insert(node_ip(12), external(more, Reach::Both, None));
    r.apply(&mut maps, &t);
    assert_exact(&maps, &t);
    assert_eq!(maps.state.maglev.len(), 1);
}

#[test]
fn maglev_tables_disturb_little_when_a_backend_is_added() {
    use super::maps::ServiceMaps as _;
    let mut maps = FakeMaps { maglev_size: 16_381, ..FakeMaps::default() };
    let mut r = Reconciler::new();
    let key = FrontendKey::new(Ipv4Addr::new(172, 30, 0, 11).into(), 30080, Protocol::Tcp);
    let before: Vec<Backend> = (1..=4).map(|i| be(i, 8080)).collect();
    let after: Vec<Backend> = (1..=5).map(|i| be(i, 8080)).collect();
    r.apply(&mut maps, &[(key, external(before, Reach::Both, None))].into_iter().collect());
    let old = decode(&maps.state)[&key].maglev.clone().unwrap();
    r.apply(&mut maps, &[(key, external(after.clone(), Reach::Both, None))].into_iter().collect());
    let new = decode(&maps.state)[&key].maglev.clone().unwrap();
    let added = (after[4].addr, after[4].port);
    let moved_elsewhere = old.iter().zip(&new).filter(|(o, n)| o != n && **n != added).count();
    let to_new = new.iter().filter(|n| **n == added).count();
    assert!(to_new.abs_diff(maps.maglev_size() / 5) < maps.maglev_size() / 50, "the new backend takes ~1/5: {to_new}");
    assert!(moved_elsewhere < maps.maglev_size() / 50, "{moved_elsewhere} entries moved between old backends");
}

#[test]
fn two_scopes_and_source_ranges_follow_the_table() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    let all = FrontendKey::new(Ipv4Addr::new(203, 0, 113, 50).into(), 443, Protocol::Tcp);
    let ext = all.with_scope(Scope::External);
    let local = Backend { local: true, ..be(1, 8443) };
    let ranges: Vec<IpNet> = vec!["203.0.113.0/24".parse().unwrap()];
    // externalTrafficPolicy: Local: every endpoint for local clients, this
    // node's for traffic from outside, which only the ranges may send.
    let mut t = ServiceTable::new();
    t.insert(all, external(vec![local, be(2, 8443)], Reach::LocalClients, None));
    t.insert(ext, external(vec![local], Reach::Outside, Some(ranges.clone())));
    r.apply(&mut maps, &t);
    assert_exact(&maps, &t);
    let seen = decode(&maps.state);
    assert!(seen[&all].two_scopes && seen[&all].maglev.is_none() && seen[&all].ranges.is_none());
    assert_eq!(seen[&ext].ranges, Some(ranges.iter().copied().collect()));
    assert!(seen[&ext].backends[0].3, "the local endpoint is marked local");

    // Back to Cluster, ranges gone: one entry, no twin, nothing left over.
    let t2: ServiceTable = [(all, external(vec![local, be(2, 8443)], Reach::Both, None))].into_iter().collect();
    r.apply(&mut maps, &t2);
    assert_exact(&maps, &t2);
    assert!(maps.state.source_ranges.is_empty());

    // Ranges that are all invalid: the flag with no range admits nobody.
    let t3: ServiceTable = [(all, external(vec![be(2, 8443)], Reach::Both, Some(Vec::new())))].into_iter().collect();
    r.apply(&mut maps, &t3);
    assert_exact(&maps, &t3);
    assert_eq!(decode(&maps.state)[&all].ranges, Some(BTreeSet::new()));
}

#[test]
fn ranges_listed_twice_are_one_range() {
    // A frontend's ranges as a set: [a, a] after {a, b} removes b (and a
    // frontend the maps hold as it is is not one whose ranges differ).
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    let key = FrontendKey::new(Ipv4Addr::new(203, 0, 113, 50).into(), 443, Protocol::Tcp);
    let (a, b): (IpNet, IpNet) = ("198.51.100.0/24".parse().unwrap(), "192.0.2.0/24".parse().unwrap());
    let t: ServiceTable = [(key, external(vec![], Reach::Outside, Some(vec![a, b])))].into_iter().collect();
    r.apply(&mut maps, &t);
    assert_eq!(maps.state.source_ranges.len(), 2);
    let t: ServiceTable = [(key, external(vec![], Reach::Outside, Some(vec![a, a])))].into_iter().collect();
    r.apply(&mut maps, &t);
    assert_eq!(decode(&maps.state)[&key].ranges, Some(BTreeSet::from([a])));
    assert_eq!(maps.state.source_ranges.len(), 1);
}

#[test]
fn recovery_reuses_maglev_tables_and_ranges() {
    let mut maps = FakeMaps::default();
    let key = FrontendKey::new(Ipv4Addr::new(172, 30, 0, 11).into(), 30080, Protocol::Tcp);
    let t: ServiceTable =
        [(key, external(vec![be(1, 8080), be(2, 8080)], Reach::Both, Some(vec!["203.0.113.0/24".parse().unwrap()])))]
            .into_iter()
            .collect();
    Reconciler::new().apply(&mut maps, &t);
    // A crash left a table nobody names and a range of nobody.
    maps.state.maglev.insert(77, maps.state.maglev.values().next().unwrap().clone());
    maps.state.source_ranges.insert((99, "10.0.0.0/8".parse().unwrap()));
    let (mut r, recovery) = Reconciler::recover(&mut maps).unwrap();
    assert_eq!(recovery.stale_entries_removed, 1, "the stray range");
    let report = r.apply(&mut maps, &t);
    assert_eq!(report.writes, 1, "only the unused table is deleted: {report:?}");
    assert_exact(&maps, &t);
}

#[test]
fn liveness_answers_what_the_slots_hold() {
    use std::collections::HashSet;

    use super::Liveness;

    let mut maps = FakeMaps::default();
    let mut r = Reconciler::new();
    let (web, dns) = (fk(10, 80, Protocol::Tcp), fk(53, 53, Protocol::Udp));
    r.apply(&mut maps, &table(&[(web, vec![be(1, 8080), be(2, 8080)]), (dns, vec![be(3, 53)])]));
    let id_of = |maps: &FakeMaps, last: u8| {
        let addr = IpAddr::from(Ipv4Addr::new(10, 244, 0, last));
        maps.state
            .backends
            .iter()
            .find(|(_, b)| codec::backend_addr(b).is_ok_and(|b| b.addr == addr))
            .map(|(id, _)| *id)
            .expect("backend written")
    };
    let (one, two, three) = (id_of(&maps, 1), id_of(&maps, 2), id_of(&maps, 3));
    let (web_id, dns_id) = (r.frontend_id(&web).expect("web"), r.frontend_id(&dns).expect("dns"));
    assert!(r.serves(&web, one) && r.serves(&web, two) && r.serves(&dns, three));
    assert!(!r.serves(&web, three), "a backend of another service");
    assert!(!r.serves(&fk(99, 80, Protocol::Tcp), one), "an unknown frontend");
    let asked: HashSet<proxy_common::RevNatId> = [web_id, 999].into();
    let live = r.by_rev_nat(&asked);
    assert_eq!(live.get(&web_id), Some(&HashSet::from([one, two])));
    assert!(!live.contains_key(&dns_id), "only the ids asked for");
    assert!(!live.contains_key(&999), "an id nobody has");

    r.apply(&mut maps, &table(&[(web, vec![be(1, 8080)]), (dns, vec![be(3, 53)])]));
    assert!(!r.serves(&web, two), "a removed backend serves no more");
    assert_eq!(r.by_rev_nat(&asked).get(&web_id), Some(&HashSet::from([one])));
}

/// The sizes docs/design.md ("What the agent holds") counts per frontend
/// and per backend.
#[test]
fn the_records_are_the_sizes_the_design_counts() {
    use std::mem::size_of;
    assert_eq!(size_of::<FrontendKey>(), 22, "the frontends' key");
    assert_eq!(size_of::<super::AppliedFrontend>(), 120, "a frontend's record, 100,000 at 100,000 services");
    assert_eq!(size_of::<Frontend>(), 88, "the table's frontend");
    assert_eq!(size_of::<Backend>(), 22, "a backend in a frontend's list");
    assert_eq!(size_of::<crate::model::SliceSpec>(), 56, "a slice as the store holds it");
}
