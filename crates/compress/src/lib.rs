//! The host side of terse's gradient compression (`ALGORITHMS.md`), as
//! fused CPU loops with no dependency on burn or cubecl, so that terse-comm
//! (and a host-only user of it) builds without them. terse-kernels' cubecl
//! kernels do the same work on a device and are tested against these loops.
//! - [`onebit`]: worker-side error-feedback sign pack with per-block scales
//!   (l1, l2) and dequantisation;
//! - [`server`]: the server side of the compressed allreduce (average the
//!   received chunks, add the server error, recompress);
//! - [`worker`]: the worker side of the compressed allreduce over host
//!   slices, behind the `Worker` trait a device buffer also implements;
//! - [`messages`]: the compressed allreduce whose messages stay in a
//!   device's memory (`MessageBuffers`), exchanged there by a communicator
//!   that moves GPU memory;
//! - [`mask`]: SLAMB's counter-based hash mask and cyclic mask, and the
//!   masked gather and scatter;
//! - [`half_mean`]: the slices SLAMB's fp16 values are averaged in, on the
//!   host or the device;
//! - [`dropout`]: dropout's counter-based mask (the same hash family), which
//!   the fused model ops, the device kernels and burn's ops on other
//!   backends all draw from;
//! - [`resident`]: buffers filled page by page on the threads that use them;
//! - [`simd`]: the AVX tier the loops (and the fused model ops) dispatch on.
#![warn(missing_docs)]

pub mod dropout;
pub mod half_mean;
pub mod mask;
pub mod messages;
pub mod onebit;
pub mod resident;
pub mod server;
pub mod simd;
pub mod worker;

pub use simd::{SimdTier, with_avx, with_tier};
