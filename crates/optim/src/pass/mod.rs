//! The element-wise passes the update rules are written in, each one
//! function with its host loop (SIMD + rayon over fixed chunks, so the bits
//! never depend on the thread count) and its cubecl kernel side by side,
//! dispatching on the step's [`crate::span::Span`]: a rule's `step` is
//! written once over them, whatever holds its buffers. The host loops are
//! the reference the kernels are tested against (`tests/device_optimizers.rs`).

pub(crate) mod adam;
pub(crate) mod fresh_variance;
pub(crate) mod frozen;
pub(crate) mod lamb;
pub(crate) mod sgd;
pub(crate) mod slamb;
pub(crate) mod sums;
pub(crate) mod zero_one_sync;

use crate::EpsMode;
use crate::moments::Moments;
use crate::span::Span;
use terse_kernels::device::optim::MomentCoefficients;

/// What Adam's direction `u = m̂/denom(v̂) + wd·x` needs besides the
/// buffers: this step's moment constants, ε's placement (resolved for the
/// stage: `inside_compressed` counts as outside here) and the weight decay
/// of decaying segments.
pub(crate) struct Direction<'a> {
    pub(crate) moments: &'a Moments,
    pub(crate) eps_mode: EpsMode,
    pub(crate) weight_decay: f32,
}

impl Direction<'_> {
    /// The weight decay of segment `segment` of `span`'s layout.
    pub(crate) fn decay_of(&self, span: &Span<'_>, segment: usize) -> f32 {
        self.decay(span.layout.segments()[segment].decay)
    }

    /// The weight decay of a segment that does (or does not) decay.
    pub(crate) fn decay(&self, decays: bool) -> f32 {
        match decays {
            true => self.weight_decay,
            false => 0.0,
        }
    }

    /// Whether ε goes inside the square root (the kernels' flag).
    pub(crate) fn inside(&self) -> bool {
        self.eps_mode == EpsMode::Inside
    }

    /// What the device kernels take of it: the moment constants and
    /// [`Direction::inside`].
    pub(crate) fn kernel_constants(&self) -> (MomentCoefficients, bool) {
        (self.moments.coefficients(), self.inside())
    }
}
