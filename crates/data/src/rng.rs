//! The one pseudo-random generator of terse-data: SplitMix64 (Steele, Lea
//! and Flood, "Fast splittable pseudorandom number generators", 2014), as in
//! `java.util.SplittableRandom`. Small, fast, and fully determined by its
//! 64-bit seed, so every shuffle, mask and augmentation is reproducible from
//! the config's seed on any machine and any number of threads or ranks.

/// A SplitMix64 stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A stream for one item of a larger computation (a sample, an epoch):
    /// the same `(seed, keys)` always gives the same stream, whatever else
    /// was drawn before.
    pub fn keyed(seed: u64, keys: &[u64]) -> Self {
        let mut rng = Self::new(seed);
        for &key in keys {
            let mixed = rng.next_u64() ^ key.wrapping_mul(0xD6E8_FEB8_6659_FD93);
            rng = Self::new(mixed);
        }
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2⁻³²
    /// for every `n` used here). `n` must be positive.
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "below(0)");
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in `lo..=hi` (Python's `random.randint`).
    pub fn range_inclusive(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // First outputs for seed 0 of the reference C implementation
        // (Vigna's splitmix64.c), also java.util.SplittableRandom(0).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn draws_are_uniform_enough() {
        let mut rng = SplitMix64::new(7);
        let mut counts = [0usize; 10];
        for _ in 0..100_000 {
            counts[rng.below(10)] += 1;
        }
        // Each count is Binomial(1e5, 0.1): sd ≈ 95; 5 sd = 475.
        assert!(
            counts.iter().all(|&c| c.abs_diff(10_000) < 475),
            "{counts:?}"
        );
        let mean = (0..100_000).map(|_| rng.next_f64()).sum::<f64>() / 1e5;
        // sd of the mean of U(0,1): sqrt(1/12/1e5) ≈ 9.1e-4.
        assert!((mean - 0.5).abs() < 5e-3, "{mean}");
        assert_ne!(SplitMix64::keyed(1, &[2, 3]), SplitMix64::keyed(1, &[3, 2]));
        assert_eq!(SplitMix64::keyed(1, &[2, 3]), SplitMix64::keyed(1, &[2, 3]));
    }
}
