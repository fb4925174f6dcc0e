//! Maglev consistent hashing (Eisenbud et al., NSDI 2016): a lookup table
//! of `M` entries (a prime) in which every backend holds about `M / N`
//! entries, and which changes little when a backend comes or goes. A flow
//! hashed to an entry therefore keeps its backend on every node (they all
//! compute the same table) and across agent restarts, and mostly keeps it
//! when the backend set changes.
//!
//! Pure: the same backends give the same table on every node and in every
//! build, so the hashes are spelled out here (FNV-1a 64 with two fixed
//! seeds), not taken from `std`, whose hasher may change between releases.

/// Table sizes accepted (primes, as Cilium accepts).
pub(crate) const SIZES: &[usize] = &[251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131_071];
/// The default table size.
pub const DEFAULT_SIZE: usize = 16_381;

/// A Maglev table size that is not one of `SIZES`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Maglev table size {0} is not one of {SIZES:?}")]
pub struct BadSize(pub usize);

/// Checks a configured table size.
pub(crate) fn check_size(m: usize) -> Result<usize, BadSize> {
    if SIZES.contains(&m) { Ok(m) } else { Err(BadSize(m)) }
}

fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const SEED_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const SEED_SKIP: u64 = 0x6c62_272e_07bb_0142;

/// The Maglev table for `backends` (each identified by bytes that are the
/// same on every node, such as its address and port): entry `i` holds the
/// index into `backends` of the backend for flows hashing to `i`. Empty when
/// there are no backends. `m` must be a prime (see `check_size`).
#[must_use]
pub(crate) fn table(backends: &[Vec<u8>], m: usize) -> Vec<u32> {
    let n = backends.len();
    if n == 0 {
        return Vec::new();
    }
    let m64 = m as u64;
    let perms: Vec<(u64, u64)> = backends
        .iter()
        .map(|id| {
            let offset = fnv1a(SEED_OFFSET, id) % m64;
            let skip = fnv1a(SEED_SKIP, id) % (m64 - 1) + 1;
            (offset, skip)
        })
        .collect();
    let mut entry: Vec<Option<u32>> = vec![None; m];
    let mut next: Vec<u64> = vec![0; n];
    let mut filled = 0;
    'fill: loop {
        for (i, (offset, skip)) in perms.iter().enumerate() {
            let mut c = (offset + next[i] * skip) % m64;
            while entry[usize::try_from(c).expect("below m")].is_some() {
                next[i] += 1;
                c = (offset + next[i] * skip) % m64;
            }
            entry[usize::try_from(c).expect("below m")] = Some(u32::try_from(i).expect("fewer than 2^32 backends"));
            next[i] += 1;
            filled += 1;
            if filled == m {
                break 'fill;
            }
        }
    }
    entry.into_iter().map(|e| e.expect("every entry filled")).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ids(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("10.244.{}.{}:8080", i / 250, i % 250).into_bytes()).collect()
    }

    fn counts(t: &[u32], n: usize) -> Vec<usize> {
        let mut c = vec![0; n];
        for e in t {
            c[*e as usize] += 1;
        }
        c
    }

    #[test]
    fn sizes_are_checked() {
        assert_eq!(check_size(16_381), Ok(16_381));
        assert_eq!(check_size(16_384), Err(BadSize(16_384)));
    }

    #[test]
    fn no_backends_no_table() {
        assert!(table(&[], DEFAULT_SIZE).is_empty());
    }

    #[test]
    fn same_backends_same_table() {
        assert_eq!(table(&ids(7), 1021), table(&ids(7), 1021));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every backend holds about M/N entries.
        #[test]
        fn entries_are_spread_evenly(n in 1usize..40) {
            let t = table(&ids(n), DEFAULT_SIZE);
            prop_assert_eq!(t.len(), DEFAULT_SIZE);
            let share = DEFAULT_SIZE / n;
            for c in counts(&t, n) {
                prop_assert!(c.abs_diff(share) <= share / 10 + 1, "{} entries, share {}", c, share);
            }
        }

        /// Removing one backend moves its own entries and only a few more.
        #[test]
        fn removing_a_backend_disturbs_little(n in 3usize..40, gone in 0usize..40) {
            let gone = gone % n;
            let before_ids = ids(n);
            let mut after_ids = before_ids.clone();
            after_ids.remove(gone);
            let before = table(&before_ids, DEFAULT_SIZE);
            let after = table(&after_ids, DEFAULT_SIZE);
            // Compare backend identities, not indices.
            let moved = before.iter().zip(&after).filter(|(b, a)| before_ids[**b as usize] != after_ids[**a as usize]).count();
            let own = counts(&before, n)[gone];
            // Maglev's bound is loose; in practice the extra is a few percent of M.
            prop_assert!(moved <= own + DEFAULT_SIZE / 20, "moved {} of {}, own {}", moved, DEFAULT_SIZE, own);
        }
    }
}
