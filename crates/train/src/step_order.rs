//! Which examples a rank reads at each optimizer step: rank `r` of `w`
//! takes positions `r, r + w, …` of a per-epoch shuffle drawn from the seed
//! (`terse_data::pretrain::epoch_indices`), a step consuming the next
//! `global_batch / w` of them. The examples of step `t` are a function of
//! `(seed, t, rank, world)` alone, so a resumed run reads exactly what the
//! uninterrupted one read, and a global step covers the same examples on
//! any number of ranks.

use terse_data::pretrain::epoch_indices;

use crate::TrainError;

pub(crate) struct StepOrder {
    examples: usize,
    seed: u64,
    rank: usize,
    world: usize,
    per_rank: usize,
    steps_per_epoch: u64,
    epoch: Option<(u64, Vec<usize>)>,
}

impl StepOrder {
    pub fn new(
        examples: usize,
        seed: u64,
        rank: usize,
        world: usize,
        per_rank: usize,
    ) -> Result<Self, TrainError> {
        let steps_per_epoch = ((examples / world) / per_rank.max(1)) as u64;
        if steps_per_epoch == 0 {
            return Err(TrainError::InvalidRun {
                field: "train.global_batch",
                reason: format!(
                    "{examples} examples cannot fill one global batch of {}",
                    per_rank * world
                ),
            });
        }
        Ok(Self {
            examples,
            seed,
            rank,
            world,
            per_rank,
            steps_per_epoch,
            epoch: None,
        })
    }

    /// The epoch of step `t` (from 1) and this rank's examples in it.
    pub fn share(&mut self, t: u64) -> (u64, &[usize]) {
        let index = t - 1;
        let epoch = index / self.steps_per_epoch;
        if self.epoch.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let order = epoch_indices(self.examples, self.seed, epoch, self.rank, self.world);
            self.epoch = Some((epoch, order));
        }
        let order = &self.epoch.as_ref().expect("filled above").1;
        let k = (index % self.steps_per_epoch) as usize;
        (epoch, &order[k * self.per_rank..(k + 1) * self.per_rank])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A global step reads the same examples on 1, 2 and 4 ranks, and
    /// every example once per epoch.
    #[test]
    fn global_steps_cover_the_same_examples_on_any_world() {
        let (n, global) = (103, 8);
        let step_set = |world: usize, t: u64| {
            let mut all: Vec<usize> = (0..world)
                .flat_map(|rank| {
                    let mut order = StepOrder::new(n, 5, rank, world, global / world).unwrap();
                    order.share(t).1.to_vec()
                })
                .collect();
            all.sort_unstable();
            all
        };
        let mut epoch: Vec<usize> = Vec::new();
        for t in 1..=12 {
            let one = step_set(1, t);
            assert_eq!(step_set(2, t), one, "step {t}");
            assert_eq!(step_set(4, t), one, "step {t}");
            epoch.extend(one);
        }
        let mut sorted = epoch.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), epoch.len(), "an example twice in one epoch");
        let mut order = StepOrder::new(n, 5, 0, 1, global).unwrap();
        assert_eq!(order.share(13).0, 1, "12 steps of 8 fill an epoch of 103");
        assert!(StepOrder::new(3, 5, 0, 2, 2).is_err());
    }
}
