//! Compression kernels for terse.
//!
//! The 1-bit and sparse compression of `ALGORITHMS.md`, written once as
//! cubecl kernels (`#[cube(launch_unchecked)]`) for burn's cubecl backends
//! (issue 4) and once as fused CPU loops for `flex`. Today: the CPU 1-bit
//! compression with error feedback ([`onebit`]): per-block scales (l1, l2),
//! the sign pack into u32 words, and dequantisation. The server-side average
//! and recompress, SLAMB's hash-masked gather and scatter, and the cubecl
//! kernels follow with the communication and kernels issues.
#![warn(missing_docs)]

pub mod onebit;
