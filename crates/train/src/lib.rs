//! The trainer of terse.
//!
//! This crate will hold the distributed training loop (per-rank data
//! sharding, gradient accumulation, optimizer and schedule from the config,
//! periodic evaluation), checkpoints written atomically and resumed
//! bit-identically, the JSONL metrics log and the per-step timing breakdown;
//! the trainer issue fills it. Today it has the single-rank image-classifier
//! run that `terse train mlp` and the optimizer tests use (an MLP trained on
//! real Fashion-MNIST through burn autodiff with any terse-optim optimizer),
//! and the collation of pre-training, classification and SQuAD examples
//! into BERT's input tensors ([`batch`]).
#![warn(missing_docs)]

pub mod batch;
pub mod checkpoint;
mod classifier;
mod config;
mod error;
pub mod metrics;
mod progress;
mod sentence_classifier;
mod shuffle;
pub mod signals;
mod step;
pub mod tasks;
mod trainer;

pub use batch::{
    ClassificationBatch, PretrainBatch, SquadBatch, classification_batch, pretrain_batch,
    squad_batch,
};
pub use classifier::{ClassifierRun, EpochReport};
pub use config::{Init, RunConfig, TaskConfig, TrainSettings};
pub use error::TrainError;
pub use sentence_classifier::{ClassificationTask, SentenceClassifierRun};
pub use shuffle::shuffled_indices;
pub use trainer::{RunOutcome, Task, Trainer};
