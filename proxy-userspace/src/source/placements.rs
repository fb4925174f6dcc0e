//! One shared copy of each endpoint placement (node name, hints, an
//! address written otherwise) across the endpoints placed alike. Every
//! endpoint of a slice names its node, and a cluster has few nodes (and
//! its hints name the node's zone): at 10,000 services × 10 endpoints the
//! converted slices held 100,000 copies of a handful of names. The
//! conversion (`super::convert`) asks here for each endpoint's placement
//! and gets the copy already shared.
use std::{
    collections::BTreeSet,
    sync::{Mutex, PoisonError},
};

use crate::model::{Placement, PlacementData};

/// The placements handed out, pruned of those no endpoint holds any more.
#[derive(Debug)]
pub(crate) struct Placements {
    held: BTreeSet<Placement>,
    /// Prune when this many are held: twice what was in use at the last
    /// pruning, so nodes that come and go (and endpoints with addresses
    /// written otherwise, each a placement of its own) never grow it
    /// without bound, and pruning costs O(1) per placement handed out.
    prune_at: usize,
}

/// Fewest placements held before pruning.
const MIN_PRUNE_AT: usize = 64;

/// The interner the conversion uses (conversions run on every watch task).
static SHARED: Mutex<Placements> = Mutex::new(Placements::new());

/// `data`, shared with every endpoint placed the same.
#[must_use]
pub(crate) fn shared(data: PlacementData) -> Placement {
    SHARED.lock().unwrap_or_else(PoisonError::into_inner).get(data)
}

impl Placements {
    #[must_use]
    pub(crate) const fn new() -> Self {
        Self { held: BTreeSet::new(), prune_at: MIN_PRUNE_AT }
    }

    /// The shared copy of `data`, made if there is none.
    pub(crate) fn get(&mut self, data: PlacementData) -> Placement {
        if let Some(held) = self.held.get(&data) {
            return held.clone();
        }
        if self.held.len() >= self.prune_at {
            // Held only here: no endpoint is placed so any more.
            self.held.retain(|p| Placement::holders(p) > 1);
            self.prune_at = (self.held.len() * 2).max(MIN_PRUNE_AT);
        }
        let made = Placement::new(data);
        self.held.insert(made.clone());
        made
    }

    /// Placements held (some perhaps unused until the next pruning).
    #[cfg(test)]
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

impl Default for Placements {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(node: &str) -> PlacementData {
        PlacementData { node_name: Some(node.into()), ..PlacementData::default() }
    }

    #[test]
    fn the_same_placement_is_one_copy() {
        let mut held = Placements::new();
        let (a, b) = (held.get(on("node-1")), held.get(on("node-1")));
        assert!(Placement::ptr_eq(&a, &b));
        assert_eq!(held.get(on("node-2")).node_name.as_deref(), Some("node-2"));
        // Other hints on the same node: another placement.
        let mut hinted = on("node-1");
        hinted.hints.zones = vec!["zone-a".into()].into();
        assert!(!Placement::ptr_eq(&a, &held.get(hinted)));
        assert_eq!(held.len(), 3);
    }

    #[test]
    fn placements_no_endpoint_holds_are_pruned_and_the_set_stays_bounded() {
        let mut held = Placements::new();
        let kept: Vec<Placement> = (0..10).map(|i| held.get(on(&format!("kept-{i}")))).collect();
        // Nodes that come and go: each placement handed out once and dropped.
        for i in 0..10_000 {
            drop(held.get(on(&format!("gone-{i}"))));
            assert!(held.len() <= 2 * MIN_PRUNE_AT, "{} held after {i}", held.len());
        }
        for k in &kept {
            assert!(Placement::ptr_eq(k, &held.get((**k).clone())), "a placement in use survives pruning");
        }
    }
}
