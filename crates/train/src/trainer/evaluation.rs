//! The trainer's held-out evaluations: before step 1, every
//! `train.eval_every` steps and at the end, each shared between the ranks
//! where their parameters agree (`shared_evaluation.rs`), the lead rank
//! logging it.

use burn::module::Module;

use super::{Run, render_eval};
use crate::TrainError;
use crate::metrics::EvalRecord;
use crate::rank_phase::{self, Phase};
use crate::shared_evaluation::evaluate_shared;
use crate::task::Task;

impl<T: Task> Run<'_, T> {
    /// The evaluation a run starts with: a fresh run's of its starting
    /// point, for comparison (pretrained weights and an untrained head, or
    /// random weights); a resumed run's at its checkpoint's step when one
    /// was due there and is not in the log (a signal at an evaluation step
    /// stops the run after its checkpoint, before the evaluation).
    pub(super) fn evaluate_before(&mut self, model: &T::Model) -> Result<(), TrainError> {
        let (every, start) = (self.config.train.eval_every, self.start_step);
        if every == 0 {
            return Ok(());
        }
        if start == 0 {
            return self.evaluate(model, 0);
        }
        let due = start.is_multiple_of(every) && start < self.config.train.steps;
        if due && !self.evaluated_at_start()? {
            return self.evaluate(model, start);
        }
        Ok(())
    }

    /// Whether the log holds the evaluation after the starting step, as
    /// the lead rank (the one that reads the log) says it: every rank
    /// decides alike, since every rank takes part in an evaluation.
    pub(super) fn evaluated_at_start(&self) -> Result<bool, TrainError> {
        let mut flag = [u8::from(self.log.evaluated_at_start())];
        if self.world > 1 {
            self.comm.broadcast_u8(&mut flag, 0)?;
        }
        Ok(flag[0] == 1)
    }

    /// The held-out evaluation after step `t` (0: before step 1 of a fresh
    /// run, every rank's parameters the same): every rank its share where
    /// the ranks' parameters agree, the lead rank logging it.
    pub(super) fn evaluate(&mut self, model: &T::Model, t: u64) -> Result<(), TrainError> {
        let fresh = t == 0;
        let phase = if fresh {
            Phase::EvaluateBefore
        } else {
            Phase::Evaluate(t)
        };
        rank_phase::enter(self.rank, phase);
        let Some(eval) = self.evaluate_shared(model, fresh)? else {
            return Ok(());
        };
        let when = if fresh {
            "before training".to_string()
        } else {
            format!("step {t}")
        };
        crate::logging::suspended(&self.bar, || {
            tracing::info!("{when}: {}", render_eval(&eval));
        });
        if fresh {
            self.summary.eval_before = eval.clone();
        }
        self.log.line(&EvalRecord { step: t, eval })
    }

    /// The held-out metrics on the lead rank (`None` on the others), every
    /// rank evaluating its share of the batches (`shared_evaluation.rs`)
    /// where all hold the same parameters: always before step 1
    /// (`fresh`), otherwise unless the optimizer's ranks step their own.
    pub(super) fn evaluate_shared(
        &self,
        model: &T::Model,
        fresh: bool,
    ) -> Result<Option<Vec<(String, f64)>>, TrainError> {
        let device = self.device.clone().inner();
        let (task, comm) = (self.task, self.comm);
        let models_agree = fresh || self.optimizer.params_replicated();
        // The run shows progress (a bar, or plain lines off a terminal).
        let show = !self.bar.is_hidden() || self.lines.is_some();
        crate::logging::suspended(&self.bar, || {
            evaluate_shared(task, &model.valid(), &device, comm, models_agree, show)
        })
    }
}
