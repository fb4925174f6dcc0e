//! How big the services and backends maps (and the maps indexed by
//! frontend id: `REVNAT`, `SERVICE_NAMES`, `CONNECTIONS`) are: sized from
//! what the agent must hold, with headroom, and capped by the operator's
//! bounds (`--services-map-size`, `--backends-map-size`; frontends by the
//! services bound, since each frontend takes a `SERVICES` entry). Pure decisions; the
//! agent acts on them by moving to a new map set (see `loader`).
use super::codec::{self, BackendAddr};
use crate::model::ServiceTable;

/// Entries the agent must hold in each sized map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    /// `SERVICES` entries: slot 0 of each frontend plus its slots entries
    /// (four backend slots to an entry).
    pub(crate) services: usize,
    /// `BACKENDS` entries: one per distinct backend (address, port, protocol).
    pub backends: usize,
    /// Frontends: one rev-NAT id each (`REVNAT`, `SERVICE_NAMES` entries,
    /// and `CONNECTIONS` indexes below the highest id).
    pub(crate) frontends: usize,
}

/// Sizes (`max_entries`) of the sized maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// `SERVICES` entries.
    pub services: u32,
    /// `BACKENDS` entries.
    pub backends: u32,
    /// `REVNAT`, `SERVICE_NAMES` and `CONNECTIONS` (ids lowest first, so
    /// the ids in use stay below it).
    pub frontends: u32,
}

/// Which maps refused a write because they were full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Full {
    pub(crate) services: bool,
    pub(crate) backends: bool,
    /// `REVNAT` or `SERVICE_NAMES`.
    pub(crate) frontends: bool,
}

/// The bounds when no flag sets them: room for 1,000,000 backends, also
/// each behind a frontend of its own (2,000,000 `SERVICES` entries), with
/// the headroom.
/// Only what the table needs is made; the hash maps' entries are
/// allocated as used, the `BACKENDS` and `CONNECTIONS` arrays up front
/// (24 and 8 × CPUs bytes an entry).
/// Frontends are bounded by the services bound (each takes an entry there).
pub const DEFAULT_BOUNDS: Sizes = Sizes { services: 1 << 22, backends: 1 << 21, frontends: 1 << 22 };

/// No map is made smaller than this (a handful of services need no
/// resizing as they come and go).
pub const MIN_SIZE: u32 = 4096;

/// What `table` needs in the maps.
#[must_use]
pub(crate) fn demand(table: &ServiceTable) -> Demand {
    use std::hash::BuildHasher as _;
    // Distinct backends counted in a sorted list of one 64-bit hash each
    // rather than of their addresses (8 bytes a slot, not 20: 8 MB at
    // 1,000,000 backends, made between a start's or restart's translation
    // and its first write, when the agent is at its largest), and not in
    // a hash set (about twice that while it grows). Two backends of one
    // hash would count once: at a million backends, one chance in tens
    // of millions, in a size planned with twice the room.
    let hasher = foldhash::fast::FixedState::default();
    let services = table.values().map(|f| 1 + codec::slot_entries(f.backends.len())).sum();
    let slots = table.values().map(|f| f.backends.len()).sum();
    let mut backends: Vec<u64> = Vec::with_capacity(slots);
    for (key, frontend) in table {
        backends.extend(
            frontend
                .backends
                .iter()
                .map(|b| hasher.hash_one(BackendAddr { addr: b.addr, port: b.port, protocol: key.protocol })),
        );
    }
    backends.sort_unstable();
    backends.dedup();
    Demand { services, backends: backends.len(), frontends: table.len() }
}

/// Entries of the `BACKENDS` array `demand` needs: ids start at 1, so
/// one more than there are backends.
const fn backend_slots(demand: Demand) -> usize {
    demand.backends.saturating_add(1)
}

/// The size for `needed` entries: twice that, rounded up to a power of two
/// (the kernel rounds a hash map's buckets so anyway), at least `MIN_SIZE`,
/// at most `bound`.
#[must_use]
pub(crate) fn size_for(needed: usize, bound: u32) -> u32 {
    let doubled = u32::try_from(needed.saturating_mul(2)).unwrap_or(u32::MAX);
    doubled.max(MIN_SIZE).checked_next_power_of_two().unwrap_or(u32::MAX).min(bound)
}

/// The sizes of a new map set for `demand` under `bounds`.
#[must_use]
pub(crate) fn wanted(demand: Demand, bounds: Sizes) -> Sizes {
    Sizes {
        services: size_for(demand.services, bounds.services),
        backends: size_for(backend_slots(demand), bounds.backends),
        frontends: size_for(demand.frontends, bounds.frontends),
    }
}

/// Whether to move from the maps of size `current` to another set, and
/// to which sizes: a map above its bound (the flag was lowered) shrinks to
/// it; a map that cannot hold the demand, or refused a write as full,
/// grows (to at least twice its size) up to its bound. `None`: stay
/// (also when the bound stops a map from growing: the writes that do not
/// fit are reported).
#[must_use]
pub(crate) fn plan(current: Sizes, demand: Demand, full: Full, bounds: Sizes) -> Option<Sizes> {
    let one = |current: u32, needed: usize, full: bool, bound: u32| {
        if current > bound {
            return size_for(needed, bound);
        }
        let short = full || usize::try_from(current).is_ok_and(|c| needed > c);
        if !short {
            return current;
        }
        let grown = size_for(needed, bound);
        if full { grown.max(current.saturating_mul(2).min(bound)) } else { grown }
    };
    let next = Sizes {
        services: one(current.services, demand.services, full.services, bounds.services),
        backends: one(current.backends, backend_slots(demand), full.backends, bounds.backends),
        frontends: one(current.frontends, demand.frontends, full.frontends, bounds.frontends),
    };
    (next != current).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Sizes = DEFAULT_BOUNDS;

    /// Sizes with the frontend maps at their smallest.
    fn sizes(services: u32, backends: u32) -> Sizes {
        Sizes { services, backends, frontends: MIN_SIZE }
    }

    /// A demand of a few frontends.
    fn demand(services: usize, backends: usize) -> Demand {
        Demand { services, backends, frontends: 10 }
    }

    #[test]
    fn size_for_doubles_rounds_and_caps() {
        let cases = [
            (0, u32::MAX, MIN_SIZE),
            (100, u32::MAX, MIN_SIZE),
            (2048, u32::MAX, 4096),
            (2049, u32::MAX, 8192),
            // 1,100,000 entries (550,000 frontends of up to 4 backends).
            (1_100_000, u32::MAX, 1 << 22),
            (1_100_000, 1_000_000, 1_000_000),
            (usize::MAX, u32::MAX, u32::MAX),
            (10, 100, 100),
        ];
        for (needed, bound, size) in cases {
            assert_eq!(size_for(needed, bound), size, "needed {needed} bound {bound}");
        }
    }

    #[test]
    fn plan_decides_when_to_move() {
        let none = Full::default();
        let services_full = Full { services: true, ..Full::default() };
        let cases = [
            // Room enough: stay.
            (sizes(4096, 4096), demand(1000, 500), none, BOUNDS, None),
            // Exactly full is still room (`BACKENDS`, an array of ids
            // from 1, holds one backend fewer than its size)...
            (sizes(4096, 4096), demand(4096, 4095), none, BOUNDS, None),
            // ...and one more backend needs a larger array.
            (sizes(4096, 4096), demand(4096, 4096), none, BOUNDS, Some(sizes(4096, 16_384))),
            // More wanted than fits: grow that map, with headroom.
            (sizes(4096, 4096), demand(10_000, 500), none, BOUNDS, Some(sizes(32_768, 4096))),
            (sizes(4096, 4096), demand(100, 5000), none, BOUNDS, Some(sizes(4096, 16_384))),
            // A write refused as full (the demand underestimated it): at least double.
            (sizes(4096, 4096), demand(1000, 500), services_full, BOUNDS, Some(sizes(8192, 4096))),
            // The bound stops the growth: stay, the failures are reported.
            (sizes(4096, 4096), demand(10_000, 500), none, sizes(4096, 4096), None),
            (sizes(4096, 4096), demand(10_000, 500), services_full, sizes(4096, 4096), None),
            // Up to the bound, not past it.
            (sizes(4096, 4096), demand(10_000, 500), none, sizes(6000, 4096), Some(sizes(6000, 4096))),
            // A lowered flag: shrink to fit under it.
            (sizes(1 << 20, 4096), demand(100, 100), none, sizes(65_536, 4096), Some(sizes(4096, 4096))),
            (sizes(1 << 20, 4096), demand(50_000, 100), none, sizes(65_536, 4096), Some(sizes(65_536, 4096))),
            // Bigger than needed but within bounds: no churn.
            (sizes(1 << 20, 1 << 20), demand(100, 100), none, BOUNDS, None),
        ];
        for (current, demand, full, bounds, next) in cases {
            assert_eq!(plan(current, demand, full, bounds), next, "{current:?} {demand:?} {full:?} {bounds:?}");
        }
    }

    #[test]
    fn frontend_maps_are_sized_by_the_frontends() {
        // 100,000 services of one port and 10 endpoints: past what 16-bit
        // ids could name; the id maps grow with them, the others as before.
        // (A slot 0 and 3 slots entries each: 400,000 SERVICES entries.)
        let big = Demand { services: 400_000, backends: 1_000_000, frontends: 100_000 };
        let next = plan(sizes(4096, 4096), big, Full::default(), BOUNDS);
        assert_eq!(next, Some(Sizes { services: 1 << 20, backends: 1 << 21, frontends: 1 << 18 }));
        // Only the frontends outgrew their maps.
        let many_empty = Demand { services: 5000, backends: 0, frontends: 5000 };
        assert_eq!(
            plan(sizes(16_384, 4096), many_empty, Full::default(), BOUNDS),
            Some(Sizes { frontends: 16_384, ..sizes(16_384, 4096) })
        );
        // A REVNAT or SERVICE_NAMES write refused as full: at least double.
        let full = Full { frontends: true, ..Full::default() };
        assert_eq!(
            plan(sizes(4096, 4096), demand(100, 100), full, BOUNDS),
            Some(Sizes { frontends: 8192, ..sizes(4096, 4096) })
        );
        // Up to the bound, not past it.
        let bounds = Sizes { services: 1 << 22, backends: 1 << 21, frontends: 65_536 };
        assert_eq!(wanted(big, bounds).frontends, 65_536);
    }

    #[test]
    fn demand_counts_slots_and_distinct_backends() {
        use std::net::{IpAddr, Ipv4Addr};

        use crate::model::{Backend, BackendState, Frontend, FrontendKey, FrontendKind, Protocol, ServicePort};

        let backend = |last: u8| Backend {
            addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
            port: 80,
            state: BackendState::Active,
            local: false,
        };
        let port = ServicePort::new("ns", "web", "http");
        let key = |last: u8, protocol| FrontendKey::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, last)), 80, protocol);
        let mut table = ServiceTable::new();
        table.insert(
            key(1, Protocol::Tcp),
            Frontend::new(port.clone(), FrontendKind::ClusterIp, vec![backend(1), backend(2)]),
        );
        // The same backends behind a second frontend: no new backend entries.
        table.insert(
            key(2, Protocol::Tcp),
            Frontend::new(port.clone(), FrontendKind::ClusterIp, vec![backend(1), backend(2)]),
        );
        // Five backends take two slots entries (four to an entry).
        table.insert(
            key(4, Protocol::Tcp),
            Frontend::new(port.clone(), FrontendKind::ClusterIp, (1..=5).map(backend).collect()),
        );
        // Another protocol is another backend entry.
        table.insert(key(3, Protocol::Udp), Frontend::new(port, FrontendKind::ClusterIp, vec![backend(1)]));
        assert_eq!(super::demand(&table), Demand { services: 4 + 5, backends: 6, frontends: 4 });
    }
}
