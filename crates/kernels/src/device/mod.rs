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
