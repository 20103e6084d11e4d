//! Compression kernels for terse.
//!
//! This crate will hold the 1-bit and sparse compression of `ALGORITHMS.md`,
//! written once as cubecl kernels (`#[cube(launch_unchecked)]`) for burn's
//! cubecl backends and once as fused CPU loops for `flex`: per-block scales
//! (l1, l2), the error-feedback sign pack into u32 words, the server-side
//! average and recompress, unpack/dequantize, and SLAMB's hash-masked gather and
//! scatter. The communication issue brings the CPU implementations, the kernels
//! issue the cubecl ones; until then the crate is empty on purpose.
#![warn(missing_docs)]
