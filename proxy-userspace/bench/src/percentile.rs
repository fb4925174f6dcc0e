//! Nearest-rank percentiles of the bench's samples.

/// The index of percentile `p` (0..=1) in `len` sorted samples, `None` when
/// there are none.
pub fn index(len: usize, p: f64) -> Option<usize> {
    let last = len.checked_sub(1)?;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an index into at most a few million samples, p clamped to 0..=1"
    )]
    let i = (last as f64 * p.clamp(0.0, 1.0)).round() as usize;
    Some(i.min(last))
}

#[cfg(test)]
mod tests {
    use super::index;

    #[test]
    fn ends_and_middle() {
        assert_eq!(index(0, 0.5), None);
        assert_eq!(index(1, 0.99), Some(0));
        assert_eq!(index(101, 0.5), Some(50));
        assert_eq!(index(101, 0.99), Some(99));
        assert_eq!(index(10, 1.0), Some(9));
        assert_eq!(index(10, 0.0), Some(0));
    }
}
