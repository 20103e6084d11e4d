//! The end of a run: the optimizer's own end (SLAMB's averaging), the
//! final evaluation, the export and the run's `summary.json`.

use std::path::Path;

use super::{Run, Trainer};
use crate::TrainError;
use crate::matmul_choice;
use crate::metrics::EvalRecord;
use crate::rank_phase::{self, Phase};
use crate::run_summary::RunSummary;
use crate::task::Task;

impl<T: Task> Run<'_, T> {
    /// Ends the optimizer's run after the last step: SLAMB averages the
    /// parameters over ranks (written into the model); the others leave
    /// them as they are.
    pub(super) fn finish_optimizer(&mut self, model: T::Model) -> Result<T::Model, TrainError> {
        self.flat.finish(&mut self.optimizer, self.comm)?;
        Ok(self.flat.write_into(model)?)
    }

    /// The end of the run: the final evaluation (every rank its share where
    /// the ranks' parameters agree) and the lead rank's export into
    /// `export_dir`; the other ranks wait for it in a collective, under the
    /// deadline (a rank 0 stuck there is named instead of leaving the job
    /// waiting in the transport's shutdown).
    pub(super) fn finish(
        mut self,
        model: &T::Model,
        export_dir: &Path,
    ) -> Result<RunSummary, TrainError> {
        let steps = self.config.train.steps;
        rank_phase::enter(self.rank, Phase::Evaluate(steps));
        // Agreed before the evaluation (a collective on every rank).
        let logged = self.start_step == steps && self.evaluated_at_start()?;
        let eval = self.evaluate_shared(model, false)?;
        rank_phase::enter(self.rank, Phase::Finish);
        if let Some(eval) = eval {
            matmul_choice::log_declined(self.config);
            self.summary.eval = eval;
            // A finished run resumed (its export failed, say) has its
            // final evaluation logged already: the same numbers again.
            if !logged {
                self.log.line(&EvalRecord {
                    step: steps,
                    eval: self.summary.eval.clone(),
                })?;
            }
            match self.task.export(model, export_dir) {
                // A model with no export form: the run itself succeeded.
                Err(e @ TrainError::InvalidRun { .. }) => tracing::warn!("no export: {e}"),
                other => other?,
            }
        }
        if self.world > 1 {
            self.comm.barrier()?;
        }
        Ok(self.summary)
    }
}

impl Trainer<'_> {
    /// The run's summary as the run directory's `summary.json` (the lead
    /// rank's): printed at the end, lost with the terminal otherwise.
    pub(super) fn write_summary(&self, summary: &RunSummary) -> Result<(), TrainError> {
        let path = self.run_dir.join("summary.json");
        let json = serde_json::to_string_pretty(summary).expect("the summary serialises");
        std::fs::write(&path, json + "\n").map_err(|source| TrainError::Io { path, source })
    }
}
