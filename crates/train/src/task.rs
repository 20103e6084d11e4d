//! [`Task`]: what the training loop needs from a task (pre-training,
//! GLUE, SQuAD, image classification): its examples, its model, a loss,
//! and optionally its evaluation, predictions and export.

use std::path::Path;

use burn::module::Module;
use burn::store::ModuleSnapshot;
use burn::tensor::{Device, Tensor};

use crate::TrainError;
use crate::eval_progress::EvalProgress;

/// What the loop needs from a task: its examples, its model, and a loss.
pub trait Task: Sync {
    /// The model with its head.
    type Model: Module + ModuleSnapshot;

    /// Training examples; the loop addresses them as `0..examples()`.
    fn examples(&self) -> usize;

    /// A fresh model (pretrained weights loaded where the task says so);
    /// called with the backend's RNG seeded from the run's seed, so every
    /// rank builds the same one.
    fn init(&self, device: &Device) -> Result<Self::Model, TrainError>;

    /// The mean loss over `examples` (indices into `0..examples()`), in
    /// pass `epoch` over the data (augmentation may depend on it).
    fn loss(
        &self,
        model: &Self::Model,
        examples: &[usize],
        epoch: u64,
        device: &Device,
    ) -> Result<Tensor<1>, TrainError>;

    /// How many batches the held-out evaluation is cut into (0: the task
    /// has none). Each is evaluated apart ([`Task::eval_batch`]), so the
    /// ranks of a run share them (`shared_evaluation.rs`).
    fn eval_batches(&self) -> usize {
        0
    }

    /// Held-out batch `batch`'s outputs (predictions, losses, gold labels):
    /// the numbers [`Task::eval_metrics`] scores, each one an f32 exactly,
    /// so that they move between ranks unchanged; the same whichever rank
    /// computes them.
    fn eval_batch(
        &self,
        model: &Self::Model,
        batch: usize,
        device: &Device,
    ) -> Result<Vec<f32>, TrainError> {
        let _ = (model, batch, device);
        Ok(Vec::new())
    }

    /// The task's metrics from every held-out batch's outputs, in batch
    /// order.
    fn eval_metrics(&self, outputs: &[Vec<f32>]) -> Result<Vec<(String, f64)>, TrainError> {
        let _ = outputs;
        Ok(Vec::new())
    }

    /// Every held-out batch's outputs, evaluated here, each counted on
    /// `progress`.
    fn eval_outputs(
        &self,
        model: &Self::Model,
        device: &Device,
        progress: &EvalProgress,
    ) -> Result<Vec<Vec<f32>>, TrainError> {
        (0..self.eval_batches())
            .map(|batch| {
                let outputs = self.eval_batch(model, batch, device);
                progress.batch_done();
                outputs
            })
            .collect()
    }

    /// The task's metrics on its held-out data, every batch evaluated here.
    fn evaluate(
        &self,
        model: &Self::Model,
        device: &Device,
        progress: &EvalProgress,
    ) -> Result<Vec<(String, f64)>, TrainError> {
        self.eval_metrics(&self.eval_outputs(model, device, progress)?)
    }

    /// Writes the predictions on the held-out data to `path` (rank 0) and
    /// returns how many; tasks without a prediction format refuse.
    fn predict(
        &self,
        model: &Self::Model,
        device: &Device,
        path: &Path,
        progress: &EvalProgress,
    ) -> Result<usize, TrainError> {
        let _ = (model, device, progress);
        Err(TrainError::InvalidRun {
            field: "task.kind",
            reason: format!(
                "this task writes no predictions (asked for {})",
                path.display()
            ),
        })
    }

    /// Writes the trained model for other tools (HuggingFace layout for
    /// BERT) into `dir` (rank 0, at the end of the run).
    fn export(&self, model: &Self::Model, dir: &Path) -> Result<(), TrainError> {
        let _ = (model, dir);
        Ok(())
    }
}

/// The items (of `len`, cut into batches of `size`) of held-out batch
/// `batch`: what each task's [`Task::eval_batch`] evaluates.
pub(crate) fn eval_range(batch: usize, size: usize, len: usize) -> std::ops::Range<usize> {
    let first = batch * size;
    first..(first + size).min(len)
}

/// `value` (a token id, a class, a count) as one of [`Task::eval_batch`]'s
/// f32 outputs, which hold integers exactly below 2^24.
///
/// # Panics
/// Beyond ±2^24: it would arrive as another integer.
pub(crate) fn exact_f32(value: i64) -> f32 {
    assert!(
        value.unsigned_abs() <= 1 << 24,
        "{value} is not exactly an f32"
    );
    value as f32
}
