//! Communication for terse: the [`Communicator`] trait every optimizer talks
//! to, its backends, and the collectives built on it.
//!
//! Backends: [`SingleRank`] (one process), [`LocalComm`] (N ranks as threads:
//! tests and single-machine simulation), `MpiComm` (OpenMPI, feature `mpi`,
//! on by default) and `NcclComm` (feature `nccl`, which terse-train turns on:
//! every build of terse has it; GPU-less machines only compile it).
//! On top of any of them: [`CompressedAllreduce`] (1-bit, two-level error
//! feedback) and [`SparseAllreduce`] (SLAMB's masked values). Every call is
//! counted by a [`TrafficMeter`].
#![warn(missing_docs)]

pub mod analytic;
mod communicator;
mod compressed;
#[cfg(feature = "nccl")]
mod cuda_driver;
mod deepspeed_geometry;
mod error;
mod gpu_collectives;
pub mod launch;
#[cfg(feature = "mpi")]
mod launcher_env;
mod local;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "mpi")]
mod mpi_node;
#[cfg(feature = "nccl")]
mod nccl;
#[cfg(feature = "nccl")]
mod one_gpu_each;
pub mod selfcheck;
mod single;
mod sparse;
pub mod traffic;
pub mod watchdog;

pub use communicator::{Communicator, HandedValue, ReduceOp, Width};
pub use compressed::{CompressedAllreduce, CompressionOptions, Geometry};
#[cfg(feature = "nccl")]
pub use cuda_driver::{CudaGpu, cuda_device_count, cuda_driver_present, cuda_gpu};
pub use error::CommError;
pub use gpu_collectives::{GpuBytes, GpuCollectives, GpuF32};
pub use local::{DEFAULT_TIMEOUT, LocalComm};
#[cfg(feature = "mpi")]
pub use mpi::MpiComm;
#[cfg(feature = "nccl")]
pub use nccl::{NcclComm, missing_libraries as nccl_missing_libraries};
#[cfg(feature = "nccl")]
pub use one_gpu_each::gpu_of_process;
pub use single::SingleRank;
pub use sparse::{SparseAllreduce, SparseValues, allreduce_mean_f16};
pub use terse_compress::mask::{HostSparse, Mask, Selection, SparseBuffer};
pub use terse_compress::onebit::Scale;
pub use traffic::{Collective, Traffic, TrafficMeter};
