//! How big the services and backends maps are: sized from what the agent
//! must hold, with headroom, and capped by the operator's bounds
//! (`--services-map-size`, `--backends-map-size`). Pure decisions; the
//! agent acts on them by moving to a new map set (see `loader`).
use super::codec::BackendAddr;
use crate::model::ServiceTable;

/// Entries the agent must hold in each sized map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    /// `SERVICES` entries: slot 0 of each frontend plus one per backend slot.
    pub services: usize,
    /// `BACKENDS` entries: one per distinct backend (address, port, protocol).
    pub backends: usize,
}

/// Sizes (`max_entries`) of the two sized maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub services: u32,
    pub backends: u32,
}

/// Which maps refused a write because they were full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Full {
    pub services: bool,
    pub backends: bool,
}

/// The bounds when no flag sets them: room for 1,000,000 backends, and
/// 100,000 services of 10 endpoints (1,100,000 slots), with the headroom.
/// Only what the table needs is made, and entries are allocated as used.
pub const DEFAULT_BOUNDS: Sizes = Sizes { services: 1 << 22, backends: 1 << 21 };

/// No map is made smaller than this (a handful of services need no
/// resizing as they come and go).
pub const MIN_SIZE: u32 = 4096;

/// What `table` needs in the maps.
#[must_use]
pub fn demand(table: &ServiceTable) -> Demand {
    // A sorted list rather than a hash set: one exact allocation (~2 MB
    // at 100,000 backends against a set's ~4 MB while it grows), made
    // right after the first sync, when the agent is at its largest.
    let services = table.values().map(|f| 1 + f.backends.len()).sum();
    let mut backends: Vec<BackendAddr> = Vec::with_capacity(services - table.len());
    for (key, frontend) in table {
        backends.extend(frontend.backends.iter().map(|b| BackendAddr {
            addr: b.addr,
            port: b.port,
            protocol: key.protocol,
        }));
    }
    backends.sort_unstable();
    backends.dedup();
    Demand { services, backends: backends.len() }
}

/// The size for `needed` entries: twice that, rounded up to a power of two
/// (the kernel rounds a hash map's buckets so anyway), at least `MIN_SIZE`,
/// at most `bound`.
#[must_use]
pub fn size_for(needed: usize, bound: u32) -> u32 {
    let doubled = u32::try_from(needed.saturating_mul(2)).unwrap_or(u32::MAX);
    doubled.max(MIN_SIZE).checked_next_power_of_two().unwrap_or(u32::MAX).min(bound)
}

/// The sizes of a new map set for `demand` under `bounds`.
#[must_use]
pub fn wanted(demand: Demand, bounds: Sizes) -> Sizes {
    Sizes { services: size_for(demand.services, bounds.services), backends: size_for(demand.backends, bounds.backends) }
}

/// Whether to move from the maps of size `current` to another set, and
/// to which sizes: a map above its bound (the flag was lowered) shrinks to
/// it; a map that cannot hold the demand, or refused a write as full,
/// grows (to at least twice its size) up to its bound. `None`: stay
/// (also when the bound stops a map from growing: the writes that do not
/// fit are reported).
#[must_use]
pub fn plan(current: Sizes, demand: Demand, full: Full, bounds: Sizes) -> Option<Sizes> {
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
        backends: one(current.backends, demand.backends, full.backends, bounds.backends),
    };
    (next != current).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Sizes = Sizes { services: 1 << 22, backends: 1 << 21 };

    fn sizes(services: u32, backends: u32) -> Sizes {
        Sizes { services, backends }
    }

    fn demand(services: usize, backends: usize) -> Demand {
        Demand { services, backends }
    }

    #[test]
    fn size_for_doubles_rounds_and_caps() {
        let cases = [
            (0, u32::MAX, MIN_SIZE),
            (100, u32::MAX, MIN_SIZE),
            (2048, u32::MAX, 4096),
            (2049, u32::MAX, 8192),
            // 100,000 services x 10 endpoints: 1,100,000 slots.
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
        let services_full = Full { services: true, backends: false };
        let cases = [
            // Room enough: stay.
            (sizes(4096, 4096), demand(1000, 500), none, BOUNDS, None),
            // Exactly full is still room.
            (sizes(4096, 4096), demand(4096, 4096), none, BOUNDS, None),
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
        // Another protocol is another backend entry.
        table.insert(key(3, Protocol::Udp), Frontend::new(port, FrontendKind::ClusterIp, vec![backend(1)]));
        assert_eq!(super::demand(&table), Demand { services: 3 + 5, backends: 3 });
    }
}
