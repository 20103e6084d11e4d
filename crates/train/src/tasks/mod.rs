//! The tasks the trainer runs: each turns example indices into a loss on its
//! model, evaluates on its held-out data and exports what other tools read.

mod image;
mod pretrain;
mod sentence;
mod squad;
mod weights;

pub use image::{ImageClassifier, ImageTask};
pub use pretrain::PretrainTask;
pub use sentence::SentenceTask;
pub use squad::SquadTask;
