//! Which examples a rank reads in an epoch. Two schemes, both drawn from
//! `(seed, epoch)` only, so any run with the same seed reads the same
//! examples in the same order whatever the thread count:
//!
//! - [`epoch_indices`]: one global shuffle of all examples, rank `r` of `w`
//!   taking positions `r, r + w, r + 2w, …` of it. The examples of global
//!   step `s` are then the same set for any number of ranks (with the same
//!   global batch), which makes runs on 1 and on 8 ranks comparable. The
//!   last `count mod w` positions are dropped so that every rank has the
//!   same number of steps.
//! - [`RankShare`] (`RankShare::new(&set, rank, world)`): a fixed share per rank,
//!   examples `i` with `i mod w = r`, shuffled within the rank each epoch.
//!   The shares are disjoint and cover every example exactly once; they
//!   differ in size by at most one, and [`RankShare::steps`] says how many
//!   every rank has, so synchronous ranks stop together (the left-over
//!   example of a longer share changes with the epoch).

use super::instances::PretrainExample;
use super::set::ShardSet;
use crate::DataError;
use terse_rng::SplitMix64;

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

/// One rank's fixed share of a [`ShardSet`]: its examples `rank`,
/// `rank + world`, … as local indices `0..len()`.
#[derive(Debug, Clone, Copy)]
pub struct RankShare<'a> {
    set: &'a ShardSet,
    rank: usize,
    world: usize,
}

impl<'a> RankShare<'a> {
    /// The share of rank `rank` of `world` (`rank < world`).
    pub fn new(set: &'a ShardSet, rank: usize, world: usize) -> Result<Self, DataError> {
        if rank >= world {
            return Err(DataError::Config {
                config: "rank share",
                detail: format!("rank {rank} of a world of {world}: need rank < world"),
            });
        }
        Ok(Self { set, rank, world })
    }

    /// Examples in this share: `⌈(count − rank) / world⌉`.
    pub fn len(&self) -> usize {
        self.set
            .len()
            .saturating_sub(self.rank)
            .div_ceil(self.world)
    }

    /// Whether the share has no example (fewer examples than ranks).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Examples every rank of the world has: `⌊count / world⌋`, the number
    /// of steps (at batch size 1) synchronous ranks can all take.
    pub fn steps(&self) -> usize {
        self.set.len() / self.world
    }

    /// The index in the whole set of local example `k`.
    pub fn global_index(&self, k: usize) -> usize {
        self.rank + k * self.world
    }

    /// Local example `k` (an error naming the set when `k ≥ len()`).
    pub fn get(&self, k: usize) -> Result<PretrainExample, DataError> {
        self.set.get(
            k.checked_mul(self.world)
                .and_then(|i| i.checked_add(self.rank))
                .unwrap_or(usize::MAX),
        )
    }

    /// The order of the local indices `0..len()` in `epoch`: a shuffle drawn
    /// from `(seed, epoch, rank, world)` alone, the same on every run.
    pub fn epoch_order(&self, seed: u64, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len()).collect();
        let keys = [0x5241_4E4B, epoch, self.rank as u64, self.world as u64];
        SplitMix64::keyed(seed, &keys).shuffle(&mut order);
        order
    }
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
