//! Which examples a rank reads in an epoch. The global order is a shuffle
//! of all examples drawn from `(seed, epoch)`; rank `r` of `w` takes
//! positions `r, r + w, r + 2w, …` of it. So the examples of global step `s`
//! are the same set for any number of ranks (as long as the global batch is
//! the same), every example is read once per epoch, and ranks never overlap.
//! The last `count mod w` positions are dropped so that every rank has the
//! same number of steps.

use crate::rng::SplitMix64;

/// The example indices rank `rank` of `world` reads in `epoch`, in order.
pub fn epoch_indices(count: usize, seed: u64, epoch: u64, rank: usize, world: usize) -> Vec<usize> {
    assert!(world > 0 && rank < world, "rank {rank} of {world}");
    let mut order: Vec<usize> = (0..count).collect();
    SplitMix64::keyed(seed, &[0x5045_5452, epoch]).shuffle(&mut order);
    let usable = count - count % world;
    order[..usable]
        .iter()
        .skip(rank)
        .step_by(world)
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_partition_the_same_global_order() {
        let one = epoch_indices(103, 9, 2, 0, 1);
        let mut seen = one.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..103).collect::<Vec<_>>());
        for world in [2, 4, 8] {
            let shares: Vec<Vec<usize>> = (0..world)
                .map(|r| epoch_indices(103, 9, 2, r, world))
                .collect();
            let per_rank = 103 / world;
            for (step, chunk) in one[..per_rank * world].chunks(world).enumerate() {
                // Global step `step` reads the same examples on any world size.
                let got: Vec<usize> = shares.iter().map(|s| s[step]).collect();
                assert_eq!(got, chunk, "world {world}, step {step}");
            }
        }
        assert_ne!(epoch_indices(103, 9, 3, 0, 1), one);
        assert_eq!(epoch_indices(103, 9, 2, 0, 1), one);
    }
}
