//! Measurements kept for the metrics endpoint.

/// A cumulative histogram with fixed upper bounds, as Prometheus has them.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: Vec<f64>,
    /// `counts[i]`: observations `<= bounds[i]` (not cumulative here).
    counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    #[must_use]
    pub fn new(bounds: Vec<f64>) -> Self {
        let n = bounds.len();
        Self { bounds, counts: vec![0; n + 1], sum: 0.0, count: 0 }
    }

    /// kube-proxy's buckets for `network_programming_duration_seconds`:
    /// 0.25 s steps to 0.5 s, 1 s steps to 59 s, 5 s steps to 115 s, 30 s
    /// steps to 300 s.
    #[must_use]
    pub fn network_programming() -> Self {
        let mut b = vec![0.25, 0.5];
        b.extend((1..=59).map(f64::from));
        b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
        b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
        Self::new(b)
    }

    pub fn observe(&mut self, value: f64) {
        let i = self.bounds.iter().position(|b| value <= *b).unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += value;
        self.count += 1;
    }

    /// `(upper bound, cumulative count)` per bucket, `+Inf` last.
    #[must_use]
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.counts)
            .map(|(b, c)| {
                total += c;
                (b, total)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Histogram;

    #[test]
    fn observations_land_in_their_bucket() {
        let mut h = Histogram::new(vec![1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 9.0] {
            h.observe(v);
        }
        assert_eq!(h.cumulative(), vec![(1.0, 2), (2.0, 3), (f64::INFINITY, 4)]);
        assert_eq!(h.count, 4);
        assert!((h.sum - 12.0).abs() < 1e-9);
    }

    #[test]
    fn kube_proxy_buckets() {
        let h = Histogram::network_programming();
        let bounds: Vec<f64> = h.cumulative().iter().map(|(b, _)| *b).collect();
        assert_eq!(bounds.len(), 2 + 59 + 12 + 7 + 1);
        assert!(bounds[..3].iter().zip([0.25, 0.5, 1.0]).all(|(a, b)| (a - b).abs() < f64::EPSILON));
        assert!((bounds[bounds.len() - 2] - 300.0).abs() < f64::EPSILON);
    }
}
