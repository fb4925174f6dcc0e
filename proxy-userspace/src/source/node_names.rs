//! One shared copy of each node name across the endpoints that name it.
//! Every endpoint of a slice names its node, and a cluster has few nodes:
//! at 10,000 services × 10 endpoints the converted slices held 100,000
//! copies of a handful of names. The conversion (`super::convert`) asks
//! here for each endpoint's node name and gets the copy already shared.
use std::{
    collections::BTreeSet,
    sync::{Mutex, PoisonError},
};

use crate::model::NodeName;

/// The names handed out, pruned of those no endpoint holds any more.
#[derive(Debug)]
pub struct NodeNames {
    names: BTreeSet<NodeName>,
    /// Prune when this many names are held: twice what was in use at the
    /// last pruning, so nodes that come and go never grow it without
    /// bound and pruning costs O(1) per name handed out.
    prune_at: usize,
}

/// Fewest names held before pruning.
const MIN_PRUNE_AT: usize = 64;

/// The interner the conversion uses (conversions run on every watch task).
static SHARED: Mutex<NodeNames> = Mutex::new(NodeNames::new());

/// `name`, shared with every endpoint that names the same node.
#[must_use]
pub fn shared(name: &str) -> NodeName {
    SHARED.lock().unwrap_or_else(PoisonError::into_inner).get(name)
}

impl NodeNames {
    #[must_use]
    pub const fn new() -> Self {
        Self { names: BTreeSet::new(), prune_at: MIN_PRUNE_AT }
    }

    /// The shared copy of `name`, made if there is none.
    pub fn get(&mut self, name: &str) -> NodeName {
        if let Some(held) = self.names.get(name) {
            return held.clone();
        }
        if self.names.len() >= self.prune_at {
            // Held only here: no endpoint names that node any more.
            self.names.retain(|n| NodeName::holders(n) > 1);
            self.prune_at = (self.names.len() * 2).max(MIN_PRUNE_AT);
        }
        let made = NodeName::from(name);
        self.names.insert(made.clone());
        made
    }

    /// Names held (some perhaps unused until the next pruning).
    #[must_use]
    pub fn len(&self) -> usize {
        self.names.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

impl Default for NodeNames {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_name_is_one_copy() {
        let mut names = NodeNames::new();
        let (a, b) = (names.get("node-1"), names.get("node-1"));
        assert!(NodeName::ptr_eq(&a, &b));
        assert_eq!(&*names.get("node-2"), "node-2");
        assert_eq!(names.len(), 2);
    }

    #[test]
    fn names_no_endpoint_holds_are_pruned_and_the_set_stays_bounded() {
        let mut names = NodeNames::new();
        let kept: Vec<NodeName> = (0..10).map(|i| names.get(&format!("kept-{i}"))).collect();
        // Nodes that come and go: each name handed out once and dropped.
        for i in 0..10_000 {
            drop(names.get(&format!("gone-{i}")));
            assert!(names.len() <= 2 * MIN_PRUNE_AT, "{} names held after {i}", names.len());
        }
        for k in &kept {
            assert!(NodeName::ptr_eq(k, &names.get(k)), "a name in use survives pruning");
        }
    }
}
