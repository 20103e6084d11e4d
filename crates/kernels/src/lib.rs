//! Compression kernels for terse.
//!
//! The 1-bit and sparse compression of `ALGORITHMS.md`, written once as fused
//! CPU loops for `flex` (in terse-compress, re-exported here) and once as
//! cubecl kernels ([`device`]) for burn's cubecl backends. The CPU versions
//! are the reference the device kernels are tested against (on lavapipe),
//! and what the `flex` backend runs:
//! - [`onebit`]: worker-side error-feedback sign pack with per-block scales
//!   (l1, l2) and dequantisation;
//! - [`server`]: the server side of the compressed allreduce (average the
//!   received chunks, add the server error, recompress);
//! - [`mask`]: SLAMB's counter-based hash mask and cyclic mask, and the masked
//!   gather and scatter;
//! - [`worker`] and [`server`]: the worker and server sides of the
//!   compressed allreduce over host slices; [`tensor`]: one-shot
//!   compression of a burn tensor on any device (`TensorWorker`);
//! - [`host_reads`]: every device → host read terse makes, counted by
//!   where in a training step it happens;
//! - [`device_messages`]: the compressed allreduce on a cubecl device with
//!   its messages there (`DeviceMessages`), exchanged by their CUDA
//!   addresses through NCCL;
#![warn(missing_docs)]

pub mod cube;
pub mod device;
pub mod device_messages;
pub mod dispatches;
pub mod host_reads;
pub mod tensor;

// The host loops live in terse-compress (no burn, no cubecl, so terse-comm
// builds without them); re-exported under their old paths, which the device
// kernels and their tests use as the reference.
pub use terse_compress::{
    SimdTier, half_mean, mask, messages, onebit, resident, server, simd, with_avx, with_tier,
    worker,
};
