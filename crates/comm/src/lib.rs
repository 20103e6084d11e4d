//! Communication for terse: the [`Communicator`] trait every optimizer talks to,
//! and its backends.
//!
//! Today this crate holds the trait, [`SingleRank`] (one process) and
//! [`LocalComm`] (N ranks as threads), so that optimizers already route every
//! gradient through a collective and nothing changes for them when more ranks
//! arrive. The communication issue adds the `mpi` (OpenMPI) and `nccl`
//! (cudarc, feature-gated) backends, the compressed and sparse allreduce of
//! `ALGORITHMS.md`, the traffic meter, and failure detection with timeouts.
#![warn(missing_docs)]

mod communicator;
mod error;
mod local;
mod single;

pub use communicator::{Communicator, ReduceOp};
pub use error::CommError;
pub use local::LocalComm;
pub use single::SingleRank;
