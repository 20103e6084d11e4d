//! Seeded shuffling: every permutation of the data comes from the run's seed,
//! so the same config and seed see the same batches.

/// A permutation of `0..n` drawn from a SplitMix64 stream seeded with `seed`
/// (Fisher–Yates).
pub fn shuffled_indices(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
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
