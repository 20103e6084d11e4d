//! The flat-parameter optimizers of terse.
//!
//! Every trainable parameter of a burn [`Module`](burn::module::Module) is laid
//! out in one flat vector ([`ParamLayout`]); an optimizer sees that vector, the
//! local flat gradient and a [`Communicator`](terse_comm::Communicator), and
//! decides itself what to send. The update rules are those of
//! `docs/ALGORITHMS.md` (Adam/AdamW, LAMB, momentum SGD, and the compressed
//! 1-bit Adam, 1-bit LAMB, SLAMB and 0/1 Adam), each written once over element-wise
//! passes (`pass/`) that run as fused single-pass loops over host slices
//! (auto-vectorised, rayon over fixed chunks: a chain of tensor ops costs a
//! pass and an allocation each) or as cubecl kernels on the device the
//! buffers live on ([`DeviceFlat`], [`Optimizer::step_device`]). A rule's
//! state is named [`Flat`] buffers kept where its parameters are.
#![warn(missing_docs)]

mod adam;
mod compression_config;
mod config_check;
mod device_flat;
mod eps_mode;
mod error;
mod flat_model;
mod freeze;
mod gather;
pub mod gpu_exchange_check;
mod kept_out;
mod lamb;
mod layout;
mod moment_config;
mod moments;
mod momentum_mask;
mod non_freeze;
mod onebit_adam;
mod onebit_lamb;
mod optimizer;
mod parallel;
mod param_patterns;
mod pass;
mod plan;
mod registry;
mod schedule;
mod sgd;
mod shard;
mod slamb;
mod span;
mod state;
mod step;
mod storage;
mod swap;
mod two_moments;
mod zero_one_adam;

pub use adam::{Adam, AdamConfig};
pub use compression_config::{
    FreezeConfig, FreezeRule, OneBitAllreduceConfig, ScaleKind, WithCompression,
    WithOneBitAllreduce,
};
pub use config_check::NoOtherFields;
pub use device_flat::DeviceFlat;
pub use eps_mode::EpsMode;
pub use error::OptimError;
pub use flat_model::{FlatModel, QueuedSquares};
pub use freeze::AutoFreeze;
pub use gather::with_fresh_leaves;
pub use lamb::{Lamb, LambConfig};
pub use layout::{ParamLayout, Segment};
pub use moment_config::{MomentConfig, WithMoments};
pub use onebit_adam::OneBitAdamConfig;
pub use onebit_lamb::{OneBitLambConfig, RatioKind};
pub use optimizer::Optimizer;
pub use parallel::sum_of_squares;
pub use plan::Plan;
pub use registry::{OPTIMIZER_NAMES, OptimizerConfig};
pub use schedule::LrSchedule;
pub use sgd::{Sgd, SgdConfig};
pub use slamb::{MaskKind, SlambCompat, SlambConfig};
pub use step::{CommTime, FlatOptimizer, OwnState, Stage, StepContext, StepReport};
pub use storage::{Flat, FlatMut};
pub use swap::Swapped;
pub use zero_one_adam::ZeroOneAdamConfig;
