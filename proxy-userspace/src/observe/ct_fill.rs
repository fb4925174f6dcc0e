//! How full the connection-tracking map (`CT`) is, and when to say so. `CT`
//! is an LRU hash: a new flow's entry evicts the least recently used one,
//! which may be a live flow's (its next packet then finds no entry and,
//! from outside, may be balanced elsewhere). The kernel's LRU evicts
//! before the map is full: each CPU keeps up to `LOCAL_FREE_TARGET` free
//! entries aside (kernel/bpf/bpf_lru_list.c), and a CPU that finds the
//! shared free list empty evicts rather than take another CPU's (measured
//! here: a map of 1,024 on 2 CPUs started evicting at 832 entries). The
//! agent counts the entries at each sweep (`datapath::active::SWEEP_INTERVAL`),
//! exports them (`ebpf_proxy_ct_entries`, `ebpf_proxy_ct_capacity`) and
//! warns once when they pass the mark (`CtFill::mark`), again only after
//! they have come back well below it, so a map that hovers at the mark
//! does not repeat the warning at every sweep.

/// The most the mark is, in percent of the capacity.
pub(crate) const WARN_PERCENT: u64 = 90;
/// The least: where the entries set aside per CPU are most of a small map.
pub(crate) const WARN_PERCENT_MIN: u64 = 50;
/// How far below the mark (percent of the capacity) a warning is over.
pub(crate) const CLEAR_BELOW_PERCENT: u64 = 10;
/// Free entries each CPU's LRU list may hold (`LOCAL_FREE_TARGET`).
pub(crate) const PER_CPU_FREE: u64 = 128;

/// What changed at one count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// The entries passed the mark (`mark` entries).
    NearlyFull { percent: u64, mark: u64 },
    /// They came back well below it.
    Relieved { percent: u64 },
}

/// Whether the warning is in force, for a machine of `cpus` CPUs.
#[derive(Debug)]
pub(crate) struct CtFill {
    cpus: u64,
    warned: bool,
}

impl CtFill {
    #[must_use]
    pub(crate) const fn new(cpus: u64) -> Self {
        Self { cpus, warned: false }
    }

    /// Where a map of `capacity` entries may start evicting: below what
    /// the CPUs can set aside, within `WARN_PERCENT_MIN`..=`WARN_PERCENT`.
    #[must_use]
    pub(crate) fn mark(&self, capacity: u64) -> u64 {
        let percent = |p: u64| u64::try_from(u128::from(capacity) * u128::from(p) / 100).unwrap_or(u64::MAX);
        capacity
            .saturating_sub(self.cpus.saturating_mul(PER_CPU_FREE))
            .clamp(percent(WARN_PERCENT_MIN), percent(WARN_PERCENT))
    }

    /// Takes a count of `entries` in a map of `capacity`; what to log.
    pub(crate) fn observe(&mut self, entries: u64, capacity: u64) -> Option<Change> {
        if capacity == 0 {
            return None;
        }
        let percent = u64::try_from(u128::from(entries) * 100 / u128::from(capacity)).unwrap_or(u64::MAX);
        let mark = self.mark(capacity);
        if !self.warned && entries >= mark {
            self.warned = true;
            return Some(Change::NearlyFull { percent, mark });
        }
        let clear = mark.saturating_sub(capacity / 100 * CLEAR_BELOW_PERCENT);
        if self.warned && entries < clear {
            self.warned = false;
            return Some(Change::Relieved { percent });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (CPUs, capacity) -> the mark.
    #[test]
    fn the_mark_leaves_room_for_what_the_cpus_set_aside() {
        let cases = [
            (2, 262_144, 235_929),   // 90%: the CPUs' share is small
            (128, 262_144, 235_929), // 262,144 - 128 * 128 is 93.75%: 90%
            (512, 262_144, 196_608), // 75%
            (2, 1024, 768),          // as measured: eviction from 832
            (16, 1024, 512),         // at least half
            (0, 1000, 900),
        ];
        for (cpus, capacity, want) in cases {
            assert_eq!(CtFill::new(cpus).mark(capacity), want, "{cpus} CPUs, {capacity} entries");
        }
    }

    /// A map filling up, hovering at the mark, draining and filling again:
    /// one warning per time it fills up.
    #[test]
    fn warns_once_per_filling() {
        let mut fill = CtFill::new(0);
        let mark = 900;
        let counts = [
            (100, None),
            (899, None),
            (900, Some(Change::NearlyFull { percent: 90, mark })),
            (950, None),
            (880, None),
            (910, None),
        ];
        for (entries, want) in counts {
            assert_eq!(fill.observe(entries, 1000), want, "at {entries}");
        }
        assert_eq!(fill.observe(799, 1000), Some(Change::Relieved { percent: 79 }));
        assert_eq!(fill.observe(850, 1000), None);
        assert_eq!(fill.observe(1000, 1000), Some(Change::NearlyFull { percent: 100, mark }));
    }

    #[test]
    fn an_unknown_capacity_says_nothing() {
        assert_eq!(CtFill::new(2).observe(5, 0), None);
    }

    /// No overflow, however large the counts.
    #[test]
    fn large_counts() {
        let mut fill = CtFill::new(u64::MAX);
        assert!(matches!(fill.observe(u64::MAX, u64::MAX), Some(Change::NearlyFull { percent: 100, .. })));
        assert_eq!(fill.observe(1, u64::MAX), Some(Change::Relieved { percent: 0 }));
    }
}
