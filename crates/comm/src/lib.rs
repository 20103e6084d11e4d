//! Communication for terse: the [`Communicator`] trait every optimizer talks to,
//! and its backends.
//!
//! Today this crate holds the trait and [`SingleRank`], the one-process backend,
//! so that optimizers already route every gradient through a collective and
//! nothing changes for them when more ranks arrive. The communication issue adds
//! the `local` (N ranks as threads), `mpi` (OpenMPI) and `nccl` (cudarc,
//! feature-gated) backends, the compressed and sparse allreduce of
//! `ALGORITHMS.md`, and the traffic meter.
#![warn(missing_docs)]

mod communicator;
mod error;
mod single;

pub use communicator::{Communicator, ReduceOp};
pub use error::CommError;
pub use single::SingleRank;
