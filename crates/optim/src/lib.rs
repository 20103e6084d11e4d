//! The flat-parameter optimizers of terse.
//!
//! Every trainable parameter of a burn [`Module`](burn::module::Module) is laid
//! out in one flat vector ([`ParamLayout`]); an optimizer sees that vector, the
//! local flat gradient and a [`Communicator`](terse_comm::Communicator), and
//! decides itself what to send. The update rules are those of
//! `docs/ALGORITHMS.md` (Adam/AdamW, LAMB, momentum SGD), implemented as fused
//! single-pass loops over host slices (auto-vectorised, rayon over chunks),
//! because a chain of tensor ops costs a pass and an allocation each.
//!
//! The compressed optimizers (1-bit Adam, 1-bit LAMB, SLAMB) build on the same
//! [`FlatOptimizer`] trait and state format.
#![warn(missing_docs)]

mod adam;
mod compressed_config;
mod config;
mod error;
mod freeze;
mod gather;
mod kept_out;
mod lamb;
mod layout;
mod moments;
mod onebit_adam;
mod onebit_lamb;
mod optimizer;
mod parallel;
mod schedule;
mod sgd;
mod slamb;
mod state;

pub use adam::Adam;
pub use compressed_config::{
    FreezeRule, MaskKind, OneBitAdamConfig, OneBitLambConfig, RatioKind, ScaleKind, SlambConfig,
};
pub use config::{AdamConfig, EpsMode, LambConfig, OptimizerConfig, SgdConfig};
pub use error::OptimError;
pub use freeze::AutoFreeze;
pub use gather::{gather_grads, gather_params, tensor_to_host, write_back};
pub use lamb::Lamb;
pub use layout::{ParamLayout, Segment};
pub use optimizer::{FlatOptimizer, Optimizer, Stage, StepContext, StepReport};
pub use schedule::LrSchedule;
pub use sgd::Sgd;
