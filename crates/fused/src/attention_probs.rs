//! One row of attention probabilities each way: `p = softmax(s·scale +
//! bias)` over the key axis in one pass (burn records scale, bias and the
//! softmax's max, sub, exp, sum and div as separate ops and tensors), and
//! its backward from `p` alone: with `h = ∂out·mask`,
//! `∂s = scale·p·(h − Σ_k h·p)`. The attention core (`attention_core.rs`)
//! calls them per head; its tests check them against float64.

use super::rows::{row_max, sum};
use super::vector_math::exp;

/// One row: `p = softmax(s·scale + b)`.
#[inline(always)]
pub(crate) fn softmax_row(s: &[f32], b: &[f32], scale: f32, p: &mut [f32]) {
    let k = p.len();
    // Zipped loops without bounds checks vectorise; max is exact, so its
    // lanes' order changes no bit.
    for ((p, &s), &b) in p.iter_mut().zip(s).zip(b) {
        *p = s * scale + b;
    }
    let max = row_max(p);
    for v in p.iter_mut() {
        *v = exp(*v - max);
    }
    let inv = 1.0 / sum(k, |j| p[j]);
    for v in p.iter_mut() {
        *v *= inv;
    }
}

/// One row, in place: `h` (the gradient of the probabilities after the
/// dropout mask) becomes `∂s = scale·p·(h − Σ h·p)`.
#[inline(always)]
pub(crate) fn softmax_row_backward(h: &mut [f32], p: &[f32], scale: f32) {
    let dot = sum(h.len(), |j| h[j] * p[j]);
    for (h, &p) in h.iter_mut().zip(p) {
        *h = scale * p * (*h - dot);
    }
}
