//! The tasks the trainer runs: each turns example indices into a loss on its
//! model, evaluates on its held-out data and exports what other tools read.
//! [`crate::dispatch`] picks one from a run config.

mod cached_features;
mod export;
mod image;
mod pretrain;
mod sentence;
mod squad;
mod weights;

pub(crate) use image::with_image_task;
pub use image::{IMAGE_DATASETS, ImageTask};
pub use pretrain::PretrainTask;
pub use sentence::{STAND_IN_TASKS, SentenceTask};
pub use squad::SquadTask;

/// Clones of `rows` at `indices`, in that order: a training batch's
/// examples for the batch functions, which take them contiguous.
fn pick<T: Clone>(rows: &[T], indices: &[usize]) -> Vec<T> {
    indices.iter().map(|&i| rows[i].clone()).collect()
}
