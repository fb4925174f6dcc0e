//! Packing a `BTreeMap`'s nodes full without a second copy of it.
//!
//! Entries inserted one by one in key order (a start's), or in no order
//! (a read-back of a hash map), leave the tree's nodes half or two-thirds
//! full. Rebuilding it from a list (`into_iter().collect()`) packs it, but
//! holds the list beside the new tree: at 100,000 frontends, the size of
//! the tree once more at the agent's largest moment. `BTreeMap::append` of
//! two non-empty trees builds a new one from both in order, each node
//! full, freeing the old nodes as it passes them: the tree is rebuilt in
//! no more room than it took.
use std::collections::BTreeMap;

/// Rebuilds `map` with every node full (see the module's doc).
pub(crate) fn pack<K: Ord + Clone, V>(map: &mut BTreeMap<K, V>) {
    let Some(second) = map.keys().nth(1).cloned() else { return };
    let mut rest = map.split_off(&second);
    map.append(&mut rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_tree_holds_the_same_entries_in_order() {
        for n in [0_u32, 1, 2, 3, 11, 12, 100, 1_000] {
            // In an order that leaves nodes partly filled.
            let mut map: BTreeMap<u32, String> = (0..n).rev().map(|k| (k * 7 % n.max(1), k.to_string())).collect();
            map.extend((0..n).map(|k| (k, k.to_string())));
            let before: Vec<(u32, String)> = map.clone().into_iter().collect();
            pack(&mut map);
            assert_eq!(map.len(), before.len());
            assert_eq!(map.into_iter().collect::<Vec<_>>(), before, "{n} entries");
        }
    }
}
