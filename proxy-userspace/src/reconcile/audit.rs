//! The drift audit: something other than the agent may change the maps (a
//! `bpftool map update` by hand, a bug, a second agent by mistake). Every
//! `--audit-interval` and on SIGHUP the pipeline reads the maps, rebuilds
//! its reconciler from them (`Reconciler::recover`), writes the whole
//! desired table through it (so the repair takes the reconciler's safe write
//! order), and reads the maps again: what the repair changed, map by map,
//! is the drift (see docs/design.md).
//!
//! Counting the difference between the maps before and after the repair,
//! not against a copy of what the agent wrote, costs no memory between
//! audits, and an audit of maps nobody touched finds nothing (the
//! reconciler then writes nothing).
use proxy_common::RevNatId;
use std::{collections::BTreeMap, fmt};

use super::{
    Reconciler, Recovery, codec,
    maps::{Dump, MapError, MapName, ServiceMaps},
};

/// The message of the one log record (at warn) of an audit that found the
/// maps changed (fields: `entries`, `maps`): an interface, which tests and
/// operators' alerts match by this constant.
pub const DRIFT_REPAIRED: &str = "datapath drift repaired";

/// Keys named per map in the log line, at most.
const KEYS_SHOWN: usize = 3;

/// How one map differed from the desired table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MapDrift {
    /// Entries the desired table has and the map lacked (deleted behind
    /// the agent's back): the audit wrote them.
    pub(crate) missing: usize,
    /// Entries the map held and the desired table does not: the audit
    /// deleted them.
    pub(crate) extra: usize,
    /// Entries with another value: the audit rewrote them.
    pub(crate) changed: usize,
    /// The first few keys that differed, for the log.
    pub(crate) keys: Vec<String>,
}

impl MapDrift {
    /// Entries that differed.
    #[must_use]
    pub(crate) const fn total(&self) -> usize {
        self.missing + self.extra + self.changed
    }
}

/// How the maps differed from the desired table, by map (maps that did not
/// differ are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Drift {
    pub(crate) maps: BTreeMap<&'static str, MapDrift>,
}

impl Drift {
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Entries that differed, in every map.
    #[must_use]
    pub(crate) fn total(&self) -> usize {
        self.maps.values().map(MapDrift::total).sum()
    }

    fn add(&mut self, map: MapName, drift: MapDrift) {
        if drift.total() > 0 {
            self.maps.insert(map.as_str(), drift);
        }
    }
}

/// `SERVICES 1 changed, 1 extra (10.96.0.20:80/TCP slots 1-4, ...); BACKENDS 1 missing (id 3)`.
impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (map, d)) in self.maps.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            f.write_str(map)?;
            let counts = [(d.missing, "missing"), (d.extra, "extra"), (d.changed, "changed")];
            for (j, (n, what)) in counts.iter().filter(|(n, _)| *n > 0).enumerate() {
                write!(f, "{}{n} {what}", if j == 0 { " " } else { ", " })?;
            }
            let more = if d.total() > d.keys.len() { ", ..." } else { "" };
            write!(f, " ({}{more})", d.keys.join(", "))?;
        }
        Ok(())
    }
}

/// How `before` (the maps as found) differed from `after` (the maps once
/// repaired, equal to the desired table), map by map.
#[must_use]
pub(crate) fn diff(before: &Dump, after: &Dump) -> Drift {
    let mut drift = Drift::default();
    drift.add(MapName::Services, diff_map(&before.services, &after.services, service_key_name));
    drift.add(MapName::Backends, diff_map(&before.backends, &after.backends, |id| format!("id {id}")));
    drift.add(MapName::RevNat, diff_map(&before.rev_nat, &after.rev_nat, |id| format!("id {id}")));
    drift.add(MapName::Maglev, diff_map(&before.maglev, &after.maglev, |id| format!("table {id}")));
    #[expect(clippy::zero_sized_map_values, reason = "a set seen as a map of no values, to be compared as the others")]
    let ranges = |d: &Dump| d.source_ranges.iter().map(|r| (*r, ())).collect::<BTreeMap<_, _>>();
    let range_name = |(id, net): &(RevNatId, ipnet::IpNet)| format!("{net} of id {id}");
    drift.add(MapName::SourceRanges, diff_map(&ranges(before), &ranges(after), range_name));
    drift.add(MapName::Names, diff_map(&before.names, &after.names, |id| format!("id {id}")));
    drift
}

fn diff_map<K: Ord, V: PartialEq>(
    before: &BTreeMap<K, V>,
    after: &BTreeMap<K, V>,
    name: impl Fn(&K) -> String,
) -> MapDrift {
    let mut drift = MapDrift::default();
    let note = |drift: &mut MapDrift, key: &K| {
        if drift.keys.len() < KEYS_SHOWN {
            drift.keys.push(name(key));
        }
    };
    for (key, value) in before {
        match after.get(key) {
            None => {
                drift.extra += 1;
                note(&mut drift, key);
            }
            Some(v) if v != value => {
                drift.changed += 1;
                note(&mut drift, key);
            }
            Some(_) => {}
        }
    }
    for key in after.keys().filter(|k| !before.contains_key(k)) {
        drift.missing += 1;
        note(&mut drift, key);
    }
    drift
}

/// A `SERVICES` key as `10.96.0.10:80/TCP` (slot 0) or
/// `10.96.0.10:80/TCP slots 5-8` (its second slots entry); the raw key
/// when it is not one the agent writes.
fn service_key_name(key: &proxy_common::ServiceKey) -> String {
    match codec::frontend_of(key) {
        Ok((frontend, 0)) => format!("{frontend}"),
        Ok((frontend, entry)) => {
            let last = usize::from(entry) * codec::SLOTS_PER_ENTRY;
            format!("{frontend} slots {}-{last}", last + 1 - codec::SLOTS_PER_ENTRY)
        }
        Err(_) => format!("{key:?}"),
    }
}

/// An audit under way: the maps as it found them.
#[derive(Debug)]
pub(crate) struct Audit {
    before: Dump,
}

impl Audit {
    /// Reads the maps, and a reconciler rebuilt from them (unreachable
    /// entries already removed): the caller writes the whole desired table
    /// through it, then calls `finish`.
    pub(crate) fn start(maps: &mut impl ServiceMaps) -> Result<(Self, Reconciler, Recovery), MapError> {
        let before = maps.dump()?;
        let (reconciler, recovery) = Reconciler::recover(maps)?;
        Ok((Self { before }, reconciler, recovery))
    }

    /// What the repair changed since `start`: the drift.
    pub(crate) fn finish(self, maps: &impl ServiceMaps) -> Result<Drift, MapError> {
        Ok(diff(&self.before, &maps.dump()?))
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use proxy_common::{RevNat, ServiceKey, ServiceValue};

    use super::*;
    use crate::{
        model::{
            Backend, BackendState, Frontend, FrontendKey, FrontendKind, Protocol, Reach, ServicePort, ServiceTable,
        },
        reconcile::fake_maps::FakeMaps,
    };

    fn key(last: u8) -> FrontendKey {
        FrontendKey::new(Ipv4Addr::new(10, 96, 0, last).into(), 80, Protocol::Tcp)
    }

    fn backend(last: u8) -> Backend {
        Backend { addr: Ipv4Addr::new(10, 244, 0, last).into(), port: 8080, state: BackendState::Active, local: false }
    }

    /// A ClusterIP with two backends and a LoadBalancer reached from
    /// outside (a Maglev table) restricted to a source range.
    fn desired() -> ServiceTable {
        let cluster_ip =
            Frontend::new(ServicePort::new("ns", "web", "http"), FrontendKind::ClusterIp, vec![backend(1), backend(2)]);
        let lb = Frontend {
            reach: Reach::Both,
            source_ranges: Some(vec!["192.0.2.0/24".parse().unwrap()]),
            ..Frontend::new(ServicePort::new("ns", "lb", "http"), FrontendKind::LoadBalancer, vec![backend(3)])
        };
        [(key(1), cluster_ip), (key(2), lb)].into_iter().collect()
    }

    /// Maps holding `desired()`, as the agent wrote them.
    fn written() -> (FakeMaps, ServiceTable) {
        let mut maps = FakeMaps::default();
        let table = desired();
        let report = Reconciler::new().apply(&mut maps, &table);
        assert!(report.failures.is_empty(), "{report:?}");
        (maps, table)
    }

    /// What a reader in the kernel sees: every entry with the ids it
    /// follows (backend, Maglev table) replaced by what they lead to.
    fn reader_view(d: &Dump) -> Vec<String> {
        let services = d.services.iter().map(|(k, v)| {
            // A slots entry is four backend ids; slot 0's first word is
            // the affinity timeout, not a backend.
            if k.slot != 0 {
                let backends = v.slot_ids().map(|id| d.backends.get(&id));
                return format!("{k:?} {backends:?}");
            }
            let table = d.maglev.get(&v.maglev).map(|t| t.iter().map(|id| d.backends.get(id)).collect::<Vec<_>>());
            format!("{k:?} {:?} {table:?}", ServiceValue { maglev: 0, ..*v })
        });
        let rest = [format!("{:?}", d.rev_nat), format!("{:?}", d.source_ranges), format!("{:?}", d.names)];
        services.chain(rest).collect()
    }

    /// Runs one audit as the pipeline does; returns the drift and checks
    /// the maps are back to what the agent wrote (to the ids, when no
    /// backend or Maglev table had to move to a new id).
    fn audit(what: &str, maps: &mut FakeMaps, table: &ServiceTable, expected: &Dump) -> Drift {
        let (audit, mut reconciler, _) = Audit::start(maps).unwrap();
        let report = reconciler.apply(maps, table);
        assert!(report.failures.is_empty(), "{report:?}");
        let drift = audit.finish(maps).unwrap();
        assert_eq!(
            reader_view(&maps.state),
            reader_view(expected),
            "{what}: repaired: a reader sees what the agent wrote"
        );
        let renumbered = [MapName::Backends, MapName::Maglev].iter().any(|m| drift.maps.contains_key(m.as_str()));
        if !renumbered {
            assert_eq!(&maps.state, expected, "{what}: {drift}: repaired: the maps are as the agent wrote them");
        }
        drift
    }

    fn counts(drift: &Drift, map: MapName) -> (usize, usize, usize) {
        drift.maps.get(map.as_str()).map_or((0, 0, 0), |d| (d.missing, d.extra, d.changed))
    }

    #[test]
    fn maps_nobody_touched_show_no_drift_and_get_no_writes() {
        let (mut maps, table) = written();
        let expected = maps.state.clone();
        let ops = maps.ops;
        assert!(audit("untouched", &mut maps, &table, &expected).is_empty());
        assert_eq!(maps.ops, ops, "no write");
    }

    /// Each map, changed, added to and deleted from behind the agent's back:
    /// the audit names the map and the kind of difference, and repairs it.
    #[test]
    fn every_map_is_compared_and_repaired() {
        /// (missing, extra, changed)
        type Counts = (usize, usize, usize);
        type Tamper = fn(&mut Dump);
        let cases: &[(&str, MapName, Counts, Tamper)] = &[
            // Both backends of the ClusterIP are in its one slots entry.
            ("a slots entry deleted", MapName::Services, (1, 0, 0), |d| {
                d.services.remove(&codec::slots_key(key(1), 0));
            }),
            ("slot 1 points at the other backend", MapName::Services, (0, 0, 1), |d| {
                let entry = d.services.get_mut(&codec::slots_key(key(1), 0)).unwrap();
                let [_, second, ..] = entry.slot_ids();
                *entry = ServiceValue::slots([second, second, 0, 0]);
            }),
            ("a frontend nobody asked for", MapName::Services, (0, 1, 0), |d| {
                d.services.insert(codec::service_key(key(9), 0), ServiceValue::default());
            }),
            // The same address at another port is another backend: the
            // slots move to a new id and the changed one goes.
            ("a backend's port moved", MapName::Backends, (1, 1, 0), |d| {
                let value = d.backends.values_mut().next().unwrap();
                value.port = value.port.wrapping_add(1u16.to_be());
            }),
            ("a backend state flipped", MapName::Backends, (0, 0, 1), |d| {
                let value = d.backends.values_mut().next().unwrap();
                value.state ^= 1;
            }),
            ("a backend nobody uses", MapName::Backends, (0, 1, 0), |d| {
                let value = *d.backends.values().next().unwrap();
                d.backends.insert(900, value);
            }),
            ("a rev-NAT entry deleted", MapName::RevNat, (1, 0, 0), |d| {
                d.rev_nat.pop_first();
            }),
            ("a rev-NAT entry of nobody", MapName::RevNat, (0, 1, 0), |d| {
                d.rev_nat.insert(700, RevNat::default());
            }),
            // A table that is not what the slots give is not taken back:
            // a new one is written, slot 0 switched to it, the old deleted.
            ("a Maglev entry changed", MapName::Maglev, (1, 1, 0), |d| {
                let table = d.maglev.values_mut().next().unwrap();
                table[0] = *d.backends.keys().find(|id| **id != table[0]).unwrap();
            }),
            ("a source range added", MapName::SourceRanges, (0, 1, 0), |d| {
                let id = d.source_ranges.first().unwrap().0;
                d.source_ranges.insert((id, "0.0.0.0/0".parse().unwrap()));
            }),
            ("a source range deleted", MapName::SourceRanges, (1, 0, 0), |d| {
                d.source_ranges.pop_first();
            }),
            ("a name changed", MapName::Names, (0, 0, 1), |d| {
                let other = d.names.values().last().copied().unwrap();
                *d.names.values_mut().next().unwrap() = other;
            }),
        ];
        for (what, map, expected_counts, tamper) in cases {
            let (mut maps, table) = written();
            let expected = maps.state.clone();
            tamper(&mut maps.state);
            assert_ne!(maps.state, expected, "{what}: tampered");
            let drift = audit(what, &mut maps, &table, &expected);
            assert_eq!(counts(&drift, *map), *expected_counts, "{what}: {drift}");
            assert!(!drift.maps[map.as_str()].keys.is_empty(), "{what}: keys named");
            // A second audit finds nothing.
            let repaired = maps.state.clone();
            assert!(audit(what, &mut maps, &table, &repaired).is_empty(), "{what}: repaired once");
        }
    }

    #[test]
    fn the_log_line_names_counts_and_a_few_keys() {
        let (mut maps, table) = written();
        let expected = maps.state.clone();
        for last in 10..15 {
            let rev_nat = u32::from(last) + 50;
            let slot_zero = ServiceValue { rev_nat, ..ServiceValue::default() };
            maps.state.services.insert(codec::service_key(key(last), 0), slot_zero);
            maps.state.rev_nat.insert(rev_nat, RevNat::default());
        }
        maps.state.services.remove(&codec::slots_key(key(1), 0));
        let drift = audit("strays", &mut maps, &table, &expected);
        assert_eq!(drift.total(), 11);
        assert_eq!(
            drift.to_string(),
            "REVNAT 5 extra (id 60, id 61, id 62, ...); \
             SERVICES 1 missing, 5 extra (10.96.0.10:80/TCP, 10.96.0.11:80/TCP, 10.96.0.12:80/TCP, ...)"
        );
        let raw = ServiceKey { proto: 33, ..codec::service_key(key(1), 0) };
        assert!(service_key_name(&raw).starts_with("ServiceKey"), "a key the agent never writes is shown raw");
    }
}
