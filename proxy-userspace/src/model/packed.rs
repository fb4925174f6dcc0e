//! `BTreeMap`s with their nodes full.
//!
//! Entries inserted one by one in key order (a start's), or in no order
//! (a read-back of a hash map), leave the tree's nodes half or two-thirds
//! full. A tree built from a sorted list (`collect`) has every node full,
//! but holds the list beside the tree: at 100,000 frontends, the size of
//! the tree once more.
use std::collections::BTreeMap;

/// Rebuilds `map` with every node full, from a list of its entries: the
/// old nodes are all freed into the list before the new ones are made, so
/// the new ones take whole pages. (`BTreeMap::append` rebuilds a tree
/// without a list, but makes the new nodes among the old ones it frees,
/// fewer than them: the pages of the old ones stay partly used, and
/// resident.) Where the list would be held at the agent's largest
/// moment, the tree is not packed there.
pub(crate) fn pack<K: Ord, V>(map: &mut BTreeMap<K, V>) {
    *map = std::mem::take(map).into_iter().collect();
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
