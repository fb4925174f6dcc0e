//! One sync's failed writes, summarised: a count per map and the first few
//! subjects, so a full map gives one log line per sync rather than one per
//! service per retry.
use std::collections::BTreeMap;

use super::{Failure, maps::MapError};

/// Subjects named in the summary, at most.
pub(crate) const FIRST: usize = 5;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Failed writes per map name.
    pub(crate) per_map: BTreeMap<&'static str, usize>,
    /// Of those, the writes a full map refused, per map name.
    pub(crate) full: BTreeMap<&'static str, usize>,
    /// The first `FIRST` subjects (services, backends).
    pub(crate) first: Vec<String>,
}

/// Summarises `failures`.
#[must_use]
pub(crate) fn summarise(failures: &[Failure]) -> Summary {
    let mut summary = Summary::default();
    for f in failures {
        let map = f.error.map_name();
        *summary.per_map.entry(map).or_default() += 1;
        if matches!(f.error, MapError::Full { .. }) {
            *summary.full.entry(map).or_default() += 1;
        }
        if summary.first.len() < FIRST {
            summary.first.push(f.subject.clone());
        }
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::maps::MapName;

    #[test]
    fn counts_per_map_and_names_the_first_few() {
        let full = |map| MapError::Full { map };
        let mut failures: Vec<Failure> =
            (0..8).map(|i| Failure { subject: format!("ns/svc-{i}:http"), error: full(MapName::Services) }).collect();
        failures.push(Failure { subject: "backend 10.0.0.1:80/TCP".into(), error: full(MapName::Backends) });
        failures.push(Failure {
            subject: "ns/svc-9:http name".into(),
            error: MapError::Syscall { map: MapName::Names, op: "update", source: std::io::Error::other("boom") },
        });
        let summary = summarise(&failures);
        assert_eq!(summary.per_map, BTreeMap::from([("BACKENDS", 1), ("SERVICES", 8), ("SERVICE_NAMES", 1)]));
        assert_eq!(summary.full, BTreeMap::from([("BACKENDS", 1), ("SERVICES", 8)]));
        assert_eq!(summary.first, (0..FIRST).map(|i| format!("ns/svc-{i}:http")).collect::<Vec<_>>());
        assert_eq!(summarise(&[]), Summary::default());
    }
}
