//! The optimizers' updates on the device: the uncompressed rules
//! (Adam/AdamW, LAMB, SGD), the 1-bit optimizers' compression stage, 0/1
//! Adam's synchronisation, and
//! the whole-buffer sums, copies and global-norm clipping around them (SLAMB's own kernels:
//! [`super::slamb`]). terse-optim's CPU loops are their reference (the same
//! per-element formulas in the same order; a GPU compiler may contract a
//! multiply-add, so results agree to f32 rounding, not bit for bit).
//!
//! Every launch walks the flat buffer in [`DeviceChunks`]: runs of at most
//! [`DEVICE_CHUNK`] elements that never cross a parameter segment, one cube
//! each. A cube therefore knows its segment (weight decay, LAMB's trust
//! ratio) without a search, and the per-chunk partial sums of a reduction
//! can be combined per segment on the host in f64, as the CPU combines its
//! chunks' partials.
//!
//! Per-step scalars (β's, bias corrections, ε, the learning rate) travel as
//! a small f32 buffer uploaded per step: a few bytes, and one compiled
//! kernel for every value.

mod buffers;
mod chunks;
mod clip;
mod compression_stage;
mod trust;
mod uncompressed;
mod zero_one_sync;

pub use buffers::{
    GatherPart, QueuedSums, copied, copy, gather_at, queue_sum_of_squares, scale, sum_of_abs,
    sum_of_squares, zero_at,
};
pub(crate) use chunks::{
    ChunkTable, direction, f32_arg, flags_arg, launch_chunks, segment_reduce, update_moments,
};
pub use chunks::{DEVICE_CHUNK, DeviceChunks, MomentCoefficients};
pub use clip::clip_to_norm;
pub use compression_stage::{
    FreshVarianceConstants, VarianceRatioRule, accumulate_momentum, fresh_variance,
    fresh_variance_update, frozen_apply, scaled_momentum, unscale_masked,
};
pub use trust::{QueuedTrusts, TrustConstants, lamb_step};
pub(crate) use trust::{clipped_trust_ratio, trust_ratio};
pub use uncompressed::{adam_step, sgd_step};
pub use zero_one_sync::{sync_apply, sync_scale};

/// Every optimizer kernel as CUDA C++ ([`crate::device::cuda_source`]).
#[cfg(test)]
pub(crate) fn cuda_sources() -> Vec<(String, String)> {
    [
        buffers::cuda_sources(),
        clip::cuda_sources(),
        compression_stage::cuda_sources(),
        trust::cuda_sources(),
        uncompressed::cuda_sources(),
        zero_one_sync::cuda_sources(),
    ]
    .concat()
}
