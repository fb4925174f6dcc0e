//! The reconciler against fake maps: exact results, minimal writes, safe
//! ordering under injected faults, recovery after a restart.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use proptest::prelude::*;

use super::{
    fake_maps::FakeMaps,
    maps::{Dump, MapError},
    reconcile::{ChangeKind, Reconciler},
};
use crate::model::{Backend, BackendState, Frontend, FrontendKey, FrontendKind, Protocol, ServiceTable};

fn fk(last: u8, port: u16, protocol: Protocol) -> FrontendKey {
    FrontendKey { addr: Ipv4Addr::new(10, 96, 0, last).into(), port, protocol }
}

fn fk6(last: u8, port: u16, protocol: Protocol) -> FrontendKey {
    FrontendKey { addr: Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, u16::from(last)).into(), port, protocol }
}

fn be(last: u8, port: u16) -> Backend {
    Backend { addr: Ipv4Addr::new(10, 244, 0, last).into(), port, state: BackendState::Active }
}

fn be6(last: u8, port: u16) -> Backend {
    Backend {
        addr: Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, u16::from(last)).into(),
        port,
        state: BackendState::Active,
    }
}

fn table(entries: &[(FrontendKey, Vec<Backend>)]) -> ServiceTable {
    entries
        .iter()
        .map(|(k, b)| {
            let service_port = format!("ns/svc-{}:{}", k.addr, k.port);
            (*k, Frontend { service_port, backends: b.clone(), affinity_timeout: None, kind: FrontendKind::ClusterIp })
        })
        .collect()
}

/// What a reader in the kernel sees of one frontend: its affinity timeout
/// (0: none) and its backends in slot order.
type Seen = (u32, Vec<(IpAddr, u16, u8)>);

/// Reads the maps back into a table: what a reader in the kernel sees.
fn decode(dump: &Dump) -> BTreeMap<FrontendKey, Seen> {
    let mut out = BTreeMap::new();
    for (key, master) in dump.services.iter().filter(|(k, _)| k.slot == 0) {
        let k = FrontendKey {
            addr: proxy_common::net::decode(&key.addr),
            port: u16::from_be(key.port),
            protocol: Protocol::from_number(key.proto).unwrap(),
        };
        let backends = (1..=master.count)
            .map(|slot| {
                let id = dump.services[&proxy_common::ServiceKey { slot, ..*key }].backend_id;
                let b = dump.backends[&id];
                (proxy_common::net::decode(&b.addr), u16::from_be(b.port), b.state)
            })
            .collect();
        let affinity = master.flags & proxy_common::service_flags::AFFINITY != 0;
        assert_eq!(affinity, master.affinity_timeout != 0, "affinity flag and timeout disagree");
        out.insert(k, (master.affinity_timeout, backends));
    }
    out
}

/// The table as the maps must show it. A backend has one entry, shared by
/// every frontend using it, whose state is the best any frontend gives it.
fn expected(desired: &ServiceTable) -> BTreeMap<FrontendKey, Seen> {
    let mut best: BTreeMap<(IpAddr, u16, Protocol), BackendState> = BTreeMap::new();
    for (k, f) in desired {
        for b in &f.backends {
            best.entry((b.addr, b.port, k.protocol)).and_modify(|s| *s = (*s).min(b.state)).or_insert(b.state);
        }
    }
    desired
        .iter()
        .map(|(k, f)| {
            let list = f.backends.iter().map(|b| {
                let state = best[&(b.addr, b.port, k.protocol)];
                (b.addr, b.port, u8::from(state == BackendState::Terminating))
            });
            (*k, (f.affinity_timeout.unwrap_or(0), list.collect()))
        })
        .collect()
}

/// The maps hold exactly `desired` and nothing else.
fn assert_exact(maps: &FakeMaps, desired: &ServiceTable) {
    assert_eq!(decode(&maps.state), expected(desired));
    let slots: usize = desired.values().map(|f| 1 + f.backends.len()).sum();
    assert_eq!(maps.state.services.len(), slots, "stray service entries");
    assert_eq!(maps.state.rev_nat.len(), desired.len(), "stray rev-NAT entries");
    let distinct: std::collections::BTreeSet<_> =
        desired.iter().flat_map(|(k, f)| f.backends.iter().map(move |b| (b.addr, b.port, k.protocol))).collect();
    assert_eq!(maps.state.backends.len(), distinct.len(), "stray backends");
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

    // Remove the middle backend: one slot rewritten, slot 0, slot 3 deleted, backend deleted.
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
    let mut maps = FakeMaps { capacity: Some(4), ..FakeMaps::default() };
    let mut r = Reconciler::new();
    let small = fk(1, 80, Protocol::Tcp);
    let big = fk(2, 80, Protocol::Tcp);
    let t = table(&[(small, vec![be(1, 80)]), (big, vec![be(2, 80), be(3, 80), be(4, 80), be(5, 80)])]);
    let report = r.apply(&mut maps, &t);
    assert!(report.failures.iter().any(|f| matches!(f.error, MapError::Full { .. })), "{report:?}");
    let seen = decode(&maps.state);
    assert_eq!(seen.get(&small).map(|s| s.1.len()), Some(1), "the service that fits is programmed");
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
fn recovery_removes_unreachable_entries() {
    let mut maps = FakeMaps::default();
    let t = table(&[(fk(1, 80, Protocol::Tcp), vec![be(1, 80)])]);
    Reconciler::new().apply(&mut maps, &t);
    // A crash left a slot without slot 0, a rev-NAT of nobody and a slot above count.
    let stray = proxy_common::ServiceKey::new(proxy_common::mapped_v4([10, 96, 9, 9]), 80u16.to_be(), 6, 1);
    maps.state.services.insert(stray, proxy_common::ServiceValue { backend_id: 1, ..Default::default() });
    maps.state.rev_nat.insert(77, proxy_common::RevNat::default());
    let above = proxy_common::ServiceKey::new(proxy_common::mapped_v4([10, 96, 0, 1]), 80u16.to_be(), 6, 2);
    maps.state.services.insert(above, proxy_common::ServiceValue { backend_id: 1, ..Default::default() });
    let (mut r, recovery) = Reconciler::recover(&mut maps).unwrap();
    assert_eq!(recovery.stale_entries_removed, 2);
    r.apply(&mut maps, &t);
    assert_exact(&maps, &t);
}

fn arb_table() -> impl Strategy<Value = ServiceTable> {
    // Frontends 0..3 are IPv4, 3..5 IPv6, each with backends of its family.
    let key = (0u8..5, prop_oneof![Just(80u16), Just(443)], prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp)]);
    // One state per address and port, as the model gives.
    let backends =
        prop::collection::btree_map((1u8..8, prop_oneof![Just(8080u16), Just(9090)]), prop::bool::weighted(0.2), 0..6)
            .prop_map(|m| m.into_iter().map(|((l, p), t)| (l, p, t)).collect::<Vec<_>>());
    let affinity = prop::option::of(prop_oneof![Just(10_800u32), Just(60)]);
    prop::collection::btree_map(key, (backends, affinity), 0..6).prop_map(|m| {
        m.into_iter()
            .map(|((a, p, proto), (bs, affinity_timeout))| {
                let mut list: Vec<Backend> = bs
                    .into_iter()
                    .map(|(l, port, term)| Backend {
                        state: if term { BackendState::Terminating } else { BackendState::Active },
                        ..if a < 3 { be(l, port) } else { be6(l, port) }
                    })
                    .collect();
                list.sort();
                let k = if a < 3 { fk(a, p, proto) } else { fk6(a, p, proto) };
                (
                    k,
                    Frontend {
                        service_port: format!("ns/s{a}:{p}"),
                        backends: list,
                        affinity_timeout,
                        kind: FrontendKind::ClusterIp,
                    },
                )
            })
            .collect()
    })
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

    /// A write that fails at any point leaves a safe map (checked after every
    /// write) and the next apply converges to the table.
    #[test]
    fn converges_after_a_failed_write(a in arb_table(), b in arb_table(), fail in 0usize..40) {
        let mut maps = FakeMaps::default();
        let mut r = Reconciler::new();
        r.apply(&mut maps, &a);
        maps.fail_at = Some(maps.ops + fail);
        let _ = r.apply(&mut maps, &b);
        maps.fail_at = None;
        let report = r.apply(&mut maps, &b);
        prop_assert!(report.failures.is_empty());
        assert_exact(&maps, &b);
    }
}
