//! The compression and optimizer kernels in cubecl, for burn's cubecl backends (wgpu and
//! vulkan everywhere, cuda where it builds). The CPU implementation in
//! [`crate::onebit`] is their reference: packed words are bit-identical,
//! scales and errors agree to f32 rounding.

mod cube;
pub mod cublas;
mod cuda_memory;
#[cfg(test)]
mod cuda_source;
mod dropout;
mod half;
mod layer_norm;
mod mask;
mod messages;
mod onebit;
pub mod optim;
mod server;
pub mod slamb;
pub mod slamb_trust;
mod softmax;
mod word_offsets;

pub use cuda_memory::with_cuda_addresses;
pub use dropout::{dropout_factors, dropped, dropped_half_add, dropped_half_grad};
pub use half::{mean_f16, round_to_f16, widen_f16};
pub use layer_norm::{layer_norm_forward, layer_norm_input_grad};
pub use mask::{DeviceSelection, always_bitmap, select};
pub use messages::{decompress_messages, pack_messages};
pub use onebit::{DeviceCompressed, compress, compress_chunks, decompress, decompress_chunks};
pub use server::{ReceivedCopies, average_and_recompress};
pub use softmax::{ScoreRows, masked_softmax, masked_softmax_grad};
pub use word_offsets::word_offsets;

/// The CUDA headers a kernel with a cubecl `Barrier` includes (cubecl-cpp's
/// `cuda/ty.rs`), as every kernel of cubek's TMA matmul routines has one (a
/// TMA load completes on a barrier, `cuda/tma.rs`): `cuda/barrier` is
/// CCCL's, the others the CUDA runtime's. terse's own kernels have none.
/// Checked against a barrier kernel's source (`cuda_source.rs`); the header
/// datasets have no CCCL, so NVRTC does not compile it here (by hand, stop
/// 92: with pip's CUDA 13.5 runtime and crt headers NVRTC stops at
/// `cooperative_groups/memcpy_async.h`, without CCCL at
/// `cuda/std/type_traits`, and with nvidia-cuda-cccl 13.3.5 it compiles,
/// opening 510 header files, 483 of them CCCL's).
pub const BARRIER_HEADERS: [&str; 3] = [
    "cooperative_groups/memcpy_async.h",
    "cooperative_groups.h",
    "cuda/barrier",
];
