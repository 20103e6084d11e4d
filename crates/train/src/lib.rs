//! The trainer of terse: one loop for every task and backend ([`Trainer`]):
//! a rank per process (MPI) or per thread (`local`), each reading its share
//! of a seeded global batch, accumulating micro-batch gradients into the
//! flat buffer the optimizer steps and communicates; checkpoints written
//! atomically with checksums and resumed bit-identically ([`checkpoint`]);
//! a JSONL line per step and an end-of-run summary ([`metrics`]); levelled,
//! ranked logs on the terminal and in the run directory ([`logging`]); SIGINT and
//! SIGTERM end a run with a checkpoint ([`signals`]). The tasks
//! ([`tasks`]): BERT pre-training, SQuAD and GLUE fine-tuning, ResNet/VGG
//! image classification; plus the single-rank MLP run of `terse train mlp`
//! and the optimizer tests ([`ClassifierRun`]) and the collation of BERT
//! inputs ([`batch`]).
#![warn(missing_docs)]

pub mod batch;
pub mod checkpoint;
mod classifier;
mod config;
mod error;
mod inspect;
pub mod logging;
pub mod metrics;
pub mod overrides;
mod progress;
mod shuffle;
pub mod signals;
mod step;
mod step_order;
pub mod tasks;
mod trainer;

pub use batch::{
    ClassificationBatch, PretrainBatch, SquadBatch, classification_batch, pretrain_batch,
    squad_batch,
};
pub use classifier::{ClassifierRun, EpochReport};
pub use config::{Init, RunConfig, TaskConfig, TrainSettings};
pub use error::TrainError;
pub use inspect::{evaluate_checkpoint, load_checkpoint, predict_checkpoint};
pub use overrides::Override;
pub use shuffle::shuffled_indices;
pub use trainer::{RunOutcome, Task, Trainer};
