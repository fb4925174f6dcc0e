//! Allocation of backend and rev-NAT ids: never 0, lowest free id first, an
//! id reused only after it was released (its map entry deleted).
use std::collections::BTreeSet;

pub(crate) trait Id: Copy + Ord + TryFrom<u64> + Into<u64> {}
impl Id for u16 {}
impl Id for u32 {}

#[derive(Debug)]
pub(crate) struct IdPool<T> {
    /// Every id below `next` that is free.
    free: BTreeSet<T>,
    /// The lowest id never handed out.
    next: u64,
}

impl<T: Id> Default for IdPool<T> {
    fn default() -> Self {
        Self { free: BTreeSet::new(), next: 1 }
    }
}

impl<T: Id> IdPool<T> {
    /// A pool where `used` are taken (ids found in the maps after a restart).
    pub(crate) fn with_used(used: impl IntoIterator<Item = T>) -> Self {
        let used: BTreeSet<u64> = used.into_iter().map(Into::into).filter(|id| *id != 0).collect();
        let next = used.last().map_or(1, |max| max + 1);
        let free = (1..next).filter(|id| !used.contains(id)).filter_map(|id| T::try_from(id).ok()).collect();
        Self { free, next }
    }

    /// The lowest free id, or `None` when every id of `T` is taken.
    pub(crate) fn allocate(&mut self) -> Option<T> {
        if let Some(id) = self.free.pop_first() {
            return Some(id);
        }
        let id = T::try_from(self.next).ok()?;
        self.next += 1;
        Some(id)
    }

    pub(crate) fn release(&mut self, id: T) {
        if id.into() != 0 && id.into() < self.next {
            self.free.insert(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_zero_and_lowest_first() {
        let mut pool = IdPool::<u16>::default();
        assert_eq!(pool.allocate(), Some(1));
        assert_eq!(pool.allocate(), Some(2));
        pool.release(1);
        assert_eq!(pool.allocate(), Some(1));
        assert_eq!(pool.allocate(), Some(3));
    }

    #[test]
    fn recovered_gaps_are_reused() {
        let mut pool = IdPool::<u32>::with_used([0, 2, 5]);
        let got: Vec<_> = (0..4).filter_map(|_| pool.allocate()).collect();
        assert_eq!(got, vec![1, 3, 4, 6]);
    }

    #[test]
    fn exhausts_at_the_type_limit() {
        let mut pool = IdPool::<u16>::with_used([u16::MAX]);
        for _ in 1..u16::MAX {
            assert!(pool.allocate().is_some());
        }
        assert_eq!(pool.allocate(), None);
    }
}
