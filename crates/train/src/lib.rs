//! The trainer of terse: one loop for every task and backend ([`Trainer`]):
//! a rank per process (MPI) or per thread (`local`), each reading its share
//! of a seeded global batch, accumulating micro-batch gradients into the
//! flat buffer the optimizer steps and communicates; checkpoints written
//! atomically with checksums and resumed bit-identically ([`checkpoint`]);
//! a JSONL line per step and an end-of-run summary ([`metrics`]); levelled,
//! ranked logs on the terminal and in the run directory ([`logging`]); SIGINT and
//! SIGTERM end a run with a checkpoint ([`signals`]). The tasks
//! ([`tasks`]): BERT pre-training, SQuAD and GLUE fine-tuning, image
//! classification with any image model of terse-models; [`dispatch`] maps a
//! run config to its task in one place and [`launch`] starts the ranks;
//! plus the collation of BERT inputs ([`batch`]).
#![warn(missing_docs)]

pub mod allocator;
pub mod batch;
pub mod checkpoint;
mod collective_deadline;
mod comm_choice;
mod config;
pub mod cuda_check;
mod deepspeed_batch;
pub mod deepspeed_config;
mod deepspeed_optimizer;
mod deepspeed_precision;
mod deepspeed_scheduler;
mod device;
pub mod dispatch;
mod error;
mod eval_progress;
mod grad_clip;
mod inspect;
pub mod launch;
pub mod logging;
mod loss_scale;
mod matmul_choice;
pub mod metrics;
mod micro_batches;
mod out_of_memory;
pub mod overrides;
mod precision;
mod progress;
mod rank_exchange;
mod rank_phase;
mod ready_gradient;
pub mod run_dir;
pub mod run_summary;
mod shared_evaluation;
pub mod signals;
mod step_order;
mod step_reads;
mod stuck_ranks;
mod task;
pub mod tasks;
pub mod tensorboard;
mod trainer;
mod trainer_checkpoints;

pub use batch::{
    ClassificationBatch, PretrainBatch, SquadBatch, classification_batch, pretrain_batch,
    squad_batch,
};
pub use comm_choice::CommChoice;
pub use config::{Init, RunConfig, TaskConfig, TrainSettings};
pub use device::DeviceChoice;
pub use dispatch::{TaskAction, with_task};
pub use error::TrainError;
pub use eval_progress::EvalProgress;
pub use inspect::{evaluate_checkpoint, export_checkpoint, load_checkpoint, predict_checkpoint};
pub use launch::{Launch, train};
pub use loss_scale::{LossScaler, LossScaling, Overflow};
pub use matmul_choice::{matmul_agrees_with_precision, matmul_machine_lacks};
pub use overrides::Override;
pub use precision::Precision;
pub use task::Task;
pub use trainer::{RunOutcome, Trainer};
