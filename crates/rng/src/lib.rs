//! The one pseudo-random generator of terse: SplitMix64 (Steele, Lea and
//! Flood, "Fast splittable pseudorandom number generators", 2014), as in
//! `java.util.SplittableRandom`, and the counter-based hashes built from its
//! finaliser. Small, fast and fully determined by a 64-bit seed, so every
//! shuffle, mask, dropout decision and augmentation is reproducible from
//! the config's seed on any machine and any number of threads or ranks.
//!
//! It lives in its own crate, below every other, so the data pipeline, the
//! kernels and the trainer draw from the same code (one stream, one way to
//! draw a bounded integer).
#![warn(missing_docs)]

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
        mix64(self.state)
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

    /// Uniform in [-1, 1), on a grid of 2^-23 (test and benchmark inputs).
    pub fn symmetric(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Standard normal (Box–Muller), for inputs with realistic tails.
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    /// Fisher–Yates shuffle, drawing with [`SplitMix64::below`].
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// SplitMix64's finaliser: a bijection of u64 with full avalanche.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A bijection of u32 with low bias (C. Wellons' "lowbias32"). 32-bit only, so
/// a GPU kernel computes exactly the same values.
#[inline]
pub fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
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
