//! [`Task`]: what the training loop needs from a task (pre-training,
//! GLUE, SQuAD, image classification): its examples, its model, a loss,
//! and optionally its evaluation, predictions and export.

use std::path::Path;

use burn::module::Module;
use burn::store::ModuleSnapshot;
use burn::tensor::{Device, Tensor};

use crate::TrainError;

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

    /// The task's metrics on its held-out data (run by rank 0).
    fn evaluate(
        &self,
        model: &Self::Model,
        device: &Device,
    ) -> Result<Vec<(String, f64)>, TrainError> {
        let _ = (model, device);
        Ok(Vec::new())
    }

    /// Writes the predictions on the held-out data to `path` (rank 0) and
    /// returns how many; tasks without a prediction format refuse.
    fn predict(
        &self,
        model: &Self::Model,
        device: &Device,
        path: &Path,
    ) -> Result<usize, TrainError> {
        let _ = (model, device);
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
