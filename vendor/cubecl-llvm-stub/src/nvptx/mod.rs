//! The NVPTX target: of the real `cubecl-llvm`'s module, only the PTX version, which
//! cubecl-cuda names.
//!
//! This crate stands in for `cubecl-llvm`, whose build script downloads an LLVM bundle that
//! cannot be fetched here; terse compiles kernels with NVRTC through cubecl's C++ path. See the
//! crate docs.

pub mod ptx_version;
