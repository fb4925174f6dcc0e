//! `BTreeMap`s with their nodes full.
//!
//! Entries inserted one by one in key order (a start's), or in no order
//! (a read-back of a hash map), leave the tree's nodes half or two-thirds
//! full. A tree built from a sorted list (`collect`) has every node full,
//! but holds the list beside the tree: at 100,000 frontends, the size of
//! the tree once more.
use std::collections::BTreeMap;

/// Rebuilds `map` with every node full, from a list of its entries: the
/// old nodes are all freed into the list before the new ones are made.
/// (Rebuilt through `append`, which frees the old nodes as it makes the
/// new ones, it took no list, but the new nodes were made among the old
/// ones being freed, fewer than them: their pages stayed partly used,
/// ~5 MiB more resident at 100,000 frontends.) Where the list would be
/// held at the agent's largest moment, the tree is not packed there.
pub(crate) fn pack<K: Ord, V>(map: &mut BTreeMap<K, V>) {
    *map = std::mem::take(map).into_iter().collect();
}

/// A packed tree of `len` entries given one at a time, in any order,
/// built without a list of them all: each part of a sixteenth is made in
/// a small tree of its own, then appended (`BTreeMap::append` rebuilds
/// the tree from both in order, each node full, freeing the old nodes as
/// it makes the new, as many: they take the room the old ones leave).
/// Besides the tree, a part is held; a list of every entry, as `collect`
/// makes before it builds, was the tree's size once more. The rebuilds
/// move each entry eight times on average, a few milliseconds at 100,000
/// entries.
pub(crate) struct Builder<K, V> {
    tree: BTreeMap<K, V>,
    part: BTreeMap<K, V>,
    part_len: usize,
    appended: bool,
}

impl<K: Ord + Clone, V> Builder<K, V> {
    /// For about `len` entries.
    pub(crate) fn new(len: usize) -> Self {
        Self { tree: BTreeMap::new(), part: BTreeMap::new(), part_len: (len / 16).max(1024), appended: false }
    }

    /// Adds an entry (a key given twice keeps the last value).
    pub(crate) fn insert(&mut self, key: K, value: V) {
        self.part.insert(key, value);
        if self.part.len() >= self.part_len {
            self.append_part();
        }
    }

    fn append_part(&mut self) {
        // The first part is taken as it is: the next append packs both.
        self.appended |= !self.tree.is_empty();
        self.tree.append(&mut self.part);
    }

    /// The tree, every node full.
    pub(crate) fn build(mut self) -> BTreeMap<K, V> {
        self.append_part();
        if !self.appended {
            pack(&mut self.tree);
        }
        self.tree
    }
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

    #[test]
    fn a_tree_built_in_parts_holds_every_entry_given() {
        for n in [0_u32, 1, 1_023, 1_024, 1_025, 5_000, 40_000] {
            // In order, and in an order that is not.
            for order in [1, 7_919] {
                let mut built = Builder::new(usize::try_from(n).unwrap());
                for k in 0..n {
                    let key = k * order % n.max(1);
                    built.insert(key, key.to_string());
                }
                let tree = built.build();
                assert_eq!(tree.len(), usize::try_from(n).unwrap(), "{n} entries, order {order}");
                assert!(tree.iter().zip(0..).all(|((k, v), i)| *k == i && *v == i.to_string()), "{n}, {order}");
            }
        }
    }
}
