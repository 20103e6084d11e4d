//! The trainer's checkpoints: writing step `t`'s, and choosing and
//! loading the one a resumed run continues from.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::store::{ModuleSnapshot, SafetensorsStore};
use terse_comm::Communicator;
use terse_comm::watchdog::with_checkpoint_grace;
use terse_optim::Optimizer;

use crate::checkpoint::{self, RankFile, model_file, optimizer_file, optimizer_own_file};
use crate::loss_scale::LossScaler;
use crate::{TrainError, Trainer};

impl Trainer<'_> {
    /// The checkpoint of step `t` (the data's position: fp16's skipped
    /// steps consumed their batch but did not step the optimizer).
    ///
    /// Each file is serialised in memory first (the model once more than
    /// before, the optimizer state as before): its SHA-256 tells the ranks
    /// on one filesystem which files they hold alike before any is written
    /// (`checkpoint::write`).
    ///
    /// Its waits for the other ranks give a stop signal [`CHECKPOINT_GRACE`]
    /// (120 s), not [`STOP_GRACE`] (10 s): the signal's own checkpoint is
    /// written here, and the ranks that only link rank 0's copies wait for
    /// it to write and sync gigabytes (BERT-large), far longer than 10 s,
    /// while every rank is healthy. Each rank calls this on the thread of
    /// its collectives, which is what the guard covers.
    ///
    /// [`STOP_GRACE`]: terse_comm::watchdog::STOP_GRACE
    /// [`CHECKPOINT_GRACE`]: terse_comm::watchdog::CHECKPOINT_GRACE
    pub(crate) fn save<M: ModuleSnapshot>(
        &self,
        model: &M,
        optimizer: &mut Optimizer,
        t: u64,
        scaler: Option<LossScaler>,
        comm: &dyn Communicator,
    ) -> Result<PathBuf, TrainError> {
        with_checkpoint_grace(|| self.save_collectively(model, optimizer, t, scaler, comm))
    }

    /// [`Trainer::save`]'s work, inside its guard.
    fn save_collectively<M: ModuleSnapshot>(
        &self,
        model: &M,
        optimizer: &mut Optimizer,
        t: u64,
        scaler: Option<LossScaler>,
        comm: &dyn Communicator,
    ) -> Result<PathBuf, TrainError> {
        let rank = comm.rank();
        optimizer.sync_state(comm)?;
        checkpoint::write(
            self.run_dir,
            t,
            &optimizer.stage().to_string(),
            scaler,
            self.config,
            comm,
            || {
                let bad = |name: String, reason: String| TrainError::Checkpoint {
                    path: checkpoint::checkpoints_dir(self.run_dir).join(name),
                    reason,
                };
                let mut store = SafetensorsStore::from_bytes(None);
                model
                    .save_into(&mut store)
                    .map_err(|e| bad(model_file(rank), e.to_string()))?;
                let model_bytes = store
                    .get_bytes()
                    .map_err(|e| bad(model_file(rank), e.to_string()))?;
                drop(store);
                let (alike, own) = optimizer
                    .to_checkpoint_bytes()
                    .map_err(|reason| bad(optimizer_file(rank), reason))?;
                let mut files = vec![
                    RankFile {
                        name: model_file,
                        bytes: model_bytes,
                    },
                    RankFile {
                        name: optimizer_file,
                        bytes: alike,
                    },
                ];
                if let Some(own) = own {
                    files.push(RankFile {
                        name: optimizer_own_file,
                        bytes: own,
                    });
                }
                Ok(files)
            },
        )
    }

    /// Before step 1 of a run that starts after step `start`: a warning
    /// from rank 0 where the next checkpoint's files (the model's fp32
    /// parameters and the optimizer state) will not fit on the disk.
    pub(crate) fn warn_if_checkpoint_will_not_fit<M: Module>(
        &self,
        model: &M,
        optimizer: &mut Optimizer,
        start: u64,
        comm: &dyn Communicator,
    ) -> Result<(), TrainError> {
        let train = &self.config.train;
        let Some(next) = next_checkpoint(start, train.checkpoint_every, train.steps) else {
            return Ok(());
        };
        // What ranks on one filesystem write alike they store once.
        let model_bytes = 4 * model.num_params() as u64;
        let (alike, own) = optimizer.state_bytes();
        let mut bytes = checkpoint::Sizes {
            once: alike,
            per_rank: own,
        };
        if optimizer.params_replicated() {
            bytes.once += model_bytes;
        } else {
            bytes.per_rank += model_bytes;
        }
        checkpoint::warn_if_first_will_not_fit(self.run_dir, start, next, bytes, comm)
    }

    /// `dir` as the checkpoint to continue from: it must exist, and when it
    /// is one of this run directory's own, no newer one may follow it (the
    /// continued run would write its checkpoints over them, and a later
    /// plain `--resume` would pick the stale newest).
    fn chosen_checkpoint(&self, dir: &Path) -> Result<PathBuf, TrainError> {
        let bad = |reason: String| TrainError::Checkpoint {
            path: dir.to_path_buf(),
            reason,
        };
        if !dir.is_dir() {
            return Err(bad("no such checkpoint directory".into()));
        }
        // A run directory (as `terse eval --checkpoint` takes one) where a
        // step's directory is meant.
        if checkpoint::checkpoints_dir(dir).is_dir() {
            return Err(bad(format!(
                "a run directory, not a checkpoint: --resume alone continues this run's newest \
                 checkpoint, --resume PATH takes a step's directory ({}/step-…)",
                checkpoint::checkpoints_dir(dir).display()
            )));
        }
        let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        let own = checkpoint::list(self.run_dir)?;
        if let Some(at) = own.iter().position(|(_, p)| canonical(p) == canonical(dir)) {
            let newer: Vec<String> = own[at + 1..]
                .iter()
                .map(|(_, p)| p.display().to_string())
                .collect();
            if !newer.is_empty() {
                return Err(bad(format!(
                    "newer checkpoints of this run follow it ({}): remove them to continue \
                     from here, or continue into another --run-dir",
                    newer.join(", ")
                )));
            }
        } else if let Some((_, newest)) = own.last() {
            // Another run's checkpoint continued here would write beside
            // this directory's own, and a later plain --resume (the line a
            // stop prints) would pick the newest step, perhaps the old
            // run's.
            return Err(bad(format!(
                "{} holds checkpoints of another run (the newest {}): continue into another \
                 --run-dir, or start this one afresh with --overwrite",
                self.run_dir.display(),
                newest.display()
            )));
        }
        Ok(dir.to_path_buf())
    }

    pub(crate) fn restore<M: ModuleSnapshot>(
        &self,
        mut model: M,
        optimizer: &mut Optimizer,
        comm: &dyn Communicator,
    ) -> Result<(M, Option<checkpoint::CheckpointMeta>), TrainError> {
        let chosen = match self.resume_from {
            Some(dir) => Some(self.chosen_checkpoint(dir)?),
            None => checkpoint::agree_on_latest(self.run_dir, comm)?,
        };
        let Some(dir) = chosen else {
            if comm.rank() == 0 {
                tracing::info!(
                    "no checkpoint in {} yet: starting from step 0",
                    checkpoint::checkpoints_dir(self.run_dir).display()
                );
            }
            return Ok((model, None));
        };
        let record = checkpoint::verify_own(&dir, self.config, comm)?;
        checkpoint::load_model(&mut model, &dir.join(model_file(comm.rank())))?;
        // The rank's own optimizer state, where its record lists it (the
        // files it verified, not a leftover beside them).
        let mut parts = vec![dir.join(optimizer_file(comm.rank()))];
        let own = optimizer_own_file(comm.rank());
        if record.files.contains_key(&own) {
            parts.push(dir.join(own));
        }
        let meta = record.meta;
        if self.resume_from.is_some() {
            checkpoint::remove_leftovers_after(self.run_dir, comm.rank(), meta.step)?;
        }
        optimizer.load_parts(&parts.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;
        if comm.rank() == 0 {
            tracing::info!(
                "resumed from {} (step {}, {})",
                dir.display(),
                meta.step,
                meta.stage
            );
        }
        Ok((model, Some(meta)))
    }
}

/// The step of the checkpoint after step `t`'s, for checkpoints every
/// `every` steps (0: none but the last) in a run of `steps`: none after the
/// last step.
pub(crate) fn next_checkpoint(t: u64, every: u64, steps: u64) -> Option<u64> {
    if t >= steps {
        return None;
    }
    if every == 0 {
        return Some(steps);
    }
    Some(((t / every + 1) * every).min(steps))
}

#[cfg(test)]
mod tests {
    use super::next_checkpoint;

    #[test]
    fn the_next_checkpoint_is_the_next_multiple_or_the_last_step() {
        assert_eq!(next_checkpoint(40, 40, 100), Some(80));
        assert_eq!(next_checkpoint(80, 40, 100), Some(100));
        assert_eq!(next_checkpoint(100, 40, 100), None);
        // A signal's checkpoint between the multiples.
        assert_eq!(next_checkpoint(13, 5, 30), Some(15));
        assert_eq!(next_checkpoint(13, 0, 30), Some(30));
    }
}
