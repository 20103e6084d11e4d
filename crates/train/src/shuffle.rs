//! Seeded shuffling: every permutation of the data comes from the run's seed,
//! so the same config and seed see the same batches.

/// A permutation of `0..n` drawn from the SplitMix64 stream of `seed`
/// (Fisher–Yates with terse's one bounded draw, `terse_rng`).
pub fn shuffled_indices(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    terse_rng::SplitMix64::new(seed).shuffle(&mut order);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_seeded_permutation() {
        let a = shuffled_indices(1000, 5);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_eq!(a, shuffled_indices(1000, 5));
        assert_ne!(a, shuffled_indices(1000, 6));
        assert_ne!(a, sorted);
    }
}
