//! Taking over traffic from outside from a running kube-proxy: how the
//! programs on the node's devices (TC, and XDP in front) share it with
//! netfilter (`OUTSIDE_HANDOVER`, one entry; docs/design.md, "Taking over
//! from kube-proxy"). `Defer` leaves every packet to a frontend to the
//! kernel (kube-proxy still serves them) and marks each flow seen as
//! netfilter's; `Handover` makes new flows the programs' while netfilter's
//! flows (those marked, and TCP connections the programs never saw a SYN
//! of) go on through the kernel; `Off` is the normal service.
use std::{path::Path, time::Duration};

use aya::maps::{Array, Map, MapData};
use proxy_common::{OutsideHandover as Raw, handover_mode};

use super::maps::MapError;

/// How traffic from outside is shared with netfilter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutsideHandover {
    /// Every flow is the programs' (flows marked as netfilter's while
    /// deferring still go to the kernel until they end).
    #[default]
    Off,
    /// Every packet to a frontend goes to the kernel untouched, its flow
    /// marked as netfilter's.
    Defer,
    /// New flows are the programs'; netfilter's flows stay netfilter's.
    Handover {
        /// Then it counts as `Off` (the programs keep no time limit with
        /// `None`).
        ends_after: Option<Duration>,
    },
}

impl OutsideHandover {
    /// The map's value, with a handover's end counted from `now_ns`
    /// (CLOCK_MONOTONIC, the programs' `bpf_ktime_get_ns`).
    #[must_use]
    pub(crate) fn encode(self, now_ns: u64) -> Raw {
        let (mode, handover_until_ns) = match self {
            Self::Off => (handover_mode::OFF, 0),
            Self::Defer => (handover_mode::DEFER, 0),
            Self::Handover { ends_after: None } => (handover_mode::HANDOVER, 0),
            Self::Handover { ends_after: Some(after) } => {
                let after = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
                // Never 0, which means "no end".
                (handover_mode::HANDOVER, now_ns.saturating_add(after).max(1))
            }
        };
        Raw { mode, pad: 0, handover_until_ns }
    }

    /// What the programs do now with the map's value `raw`, at `now_ns`:
    /// a handover past its end reads as `Off`; an unknown mode is `None`.
    #[must_use]
    pub(crate) fn decode(raw: &Raw, now_ns: u64) -> Option<Self> {
        match raw.mode {
            handover_mode::OFF => Some(Self::Off),
            handover_mode::DEFER => Some(Self::Defer),
            handover_mode::HANDOVER if raw.handover_until_ns == 0 => Some(Self::Handover { ends_after: None }),
            handover_mode::HANDOVER if raw.handover_until_ns <= now_ns => Some(Self::Off),
            handover_mode::HANDOVER => {
                Some(Self::Handover { ends_after: Some(Duration::from_nanos(raw.handover_until_ns - now_ns)) })
            }
            _ => None,
        }
    }
}

/// `off`, `defer`, `handover` or `handover, ends in N s` (`ebpf-proxy status`).
impl std::fmt::Display for OutsideHandover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Defer => f.write_str("defer"),
            Self::Handover { ends_after: None } => f.write_str("handover"),
            Self::Handover { ends_after: Some(after) } => write!(f, "handover, ends in {} s", after.as_secs()),
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
#[must_use]
pub(crate) fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is always there");
    let ns = i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec());
    u64::try_from(ns).unwrap_or(0)
}

/// The `OUTSIDE_HANDOVER` map.
pub struct HandoverMap {
    map: Array<MapData, Raw>,
}

impl std::fmt::Debug for HandoverMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandoverMap")
    }
}

const MAP: &str = proxy_common::map_names::OUTSIDE_HANDOVER;

impl HandoverMap {
    pub(crate) fn from_map(map: Map) -> Result<Self, MapError> {
        let map = Array::try_from(map).map_err(|source| MapError::Session { map: MAP, source })?;
        Ok(Self { map })
    }

    /// Opens the map pinned at `path` (the agent's maps directory), to read
    /// or set the mode of a running agent's programs.
    pub fn open_pinned(path: &Path) -> Result<Self, MapError> {
        let data =
            MapData::from_pin(path).map_err(|source| MapError::Open { path: path.display().to_string(), source })?;
        Self::from_map(Map::Array(data))
    }

    /// The map's value as it is.
    pub fn raw(&self) -> Result<Raw, MapError> {
        self.map.get(&0, 0).map_err(|source| MapError::Session { map: MAP, source })
    }

    /// Writes the map's value as it is (moving to a new set of maps keeps
    /// a handover's end).
    pub(crate) fn set_raw(&mut self, raw: Raw) -> Result<(), MapError> {
        self.map.set(0, raw, 0).map_err(|source| MapError::Session { map: MAP, source })
    }

    /// Sets the mode; the programs follow from their next packet.
    pub fn set(&mut self, mode: OutsideHandover) -> Result<(), MapError> {
        self.set_raw(mode.encode(monotonic_ns()))
    }

    /// The mode the programs follow now (`None`: a value this build does
    /// not know).
    pub fn get(&self) -> Result<Option<OutsideHandover>, MapError> {
        Ok(OutsideHandover::decode(&self.raw()?, monotonic_ns()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_and_a_handover_ends() {
        let now = 5_000_000_000;
        for mode in [OutsideHandover::Off, OutsideHandover::Defer, OutsideHandover::Handover { ends_after: None }] {
            assert_eq!(OutsideHandover::decode(&mode.encode(now), now), Some(mode));
        }
        let ten = OutsideHandover::Handover { ends_after: Some(Duration::from_secs(10)) };
        let raw = ten.encode(now);
        assert_eq!(raw.handover_until_ns, now + 10_000_000_000);
        assert_eq!(
            OutsideHandover::decode(&raw, now + 4_000_000_000),
            Some(OutsideHandover::Handover { ends_after: Some(Duration::from_secs(6)) })
        );
        assert_eq!(OutsideHandover::decode(&raw, now + 10_000_000_000), Some(OutsideHandover::Off));
        // An end at 0 would mean none: a zero duration at time 0 still ends.
        let zero = OutsideHandover::Handover { ends_after: Some(Duration::ZERO) }.encode(0);
        assert_eq!(OutsideHandover::decode(&zero, 1), Some(OutsideHandover::Off));
        assert_eq!(OutsideHandover::decode(&Raw { mode: 7, ..Raw::default() }, now), None);
        assert_eq!(OutsideHandover::decode(&raw, now + 4_000_000_000).unwrap().to_string(), "handover, ends in 6 s");
    }
}
