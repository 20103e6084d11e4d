//! `eval`, `predict` and `export` on a saved run: rank 0's weights of a
//! verified checkpoint loaded into the task's model, without autodiff or
//! dropout.

use std::path::Path;

use burn::module::Module;
use burn::tensor::Device;

use crate::checkpoint::{self, CheckpointMeta, model_file};
use crate::eval_progress::EvalProgress;
use crate::{Task, TrainError};

/// The model of checkpoint (or run directory) `path`, checked against its
/// checksums, with the checkpoint's description.
pub fn load_checkpoint<T: Task>(
    task: &T,
    path: &Path,
) -> Result<(T::Model, CheckpointMeta), TrainError> {
    let dir = checkpoint::resolve(path)?;
    let meta = checkpoint::verify(&dir)?;
    let device = Device::flex().autodiff();
    let mut model = task.init(&device)?;
    checkpoint::load_model(&mut model, &dir.join(model_file(0)))?;
    Ok((model, meta))
}

/// The task's metrics for the checkpoint at `path`.
pub fn evaluate_checkpoint<T: Task>(
    task: &T,
    path: &Path,
) -> Result<(CheckpointMeta, Vec<(String, f64)>), TrainError> {
    let (model, meta) = load_checkpoint(task, path)?;
    let device = Device::flex();
    let progress = EvalProgress::new(task.eval_batches(), true);
    Ok((meta, task.evaluate(&model.valid(), &device, &progress)?))
}

/// Writes the checkpoint's predictions on the task's held-out data to
/// `out`; returns how many.
pub fn predict_checkpoint<T: Task>(task: &T, path: &Path, out: &Path) -> Result<usize, TrainError> {
    let (model, _) = load_checkpoint(task, path)?;
    let progress = EvalProgress::new(task.eval_batches(), true);
    task.predict(&model.valid(), &Device::flex(), out, &progress)
}

/// Writes the checkpoint's model to `out` as the run's own export would
/// (HuggingFace layout, tokenizer, labels).
pub fn export_checkpoint<T: Task>(task: &T, path: &Path, out: &Path) -> Result<(), TrainError> {
    let (model, _) = load_checkpoint(task, path)?;
    task.export(&model, out)
}
