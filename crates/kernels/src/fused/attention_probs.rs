//! Attention probabilities in one pass each way: `p = softmax(s·scale +
//! bias)` over the key axis, then dropout. burn records scale, bias,
//! softmax (max, sub, exp, sum, div) and the dropout mask as separate ops
//! and tensors; here the backward regenerates the dropout mask and needs
//! only `p`.
//!
//! Backward with `h = ∂out·mask`: `∂s = scale·p·(h − Σ_k h·p)`.

use super::dropout::SiteMask;
use super::rows::{for_row_blocks, sum};
use super::vector_math::exp;

/// Shape of the scores: `[batch, heads·queries, keys]` with one additive
/// bias per (batch, key).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoresShape {
    /// Rows of each batch element (heads × queries).
    pub rows_per_batch: usize,
    /// Length of a row (keys).
    pub keys: usize,
}

/// Writes `p` into `probs` and, with dropout, `p·mask` into `out`.
pub fn attention_probs_forward(
    scores: &[f32],
    bias: &[f32],
    shape: ScoresShape,
    scale: f32,
    probs: &mut [f32],
    dropout: Option<(&SiteMask, &mut [f32])>,
) {
    let k = shape.keys;
    assert_eq!(scores.len(), probs.len());
    for_row_blocks(probs, k, |first, out| {
        for (r, p) in out.chunks_mut(k).enumerate() {
            let row = first + r;
            let s = &scores[row * k..(row + 1) * k];
            let b = &bias[row / shape.rows_per_batch * k..][..k];
            softmax_row(s, b, scale, p);
        }
    });
    if let Some((mask, out)) = dropout {
        mask.apply(probs, out);
    }
}

/// `∂s` from `∂out` (in place in `grad`), `p` and the dropout mask.
pub fn attention_probs_backward(
    grad: &mut [f32],
    probs: &[f32],
    keys: usize,
    scale: f32,
    dropout: Option<&SiteMask>,
) {
    assert_eq!(grad.len(), probs.len());
    if let Some(mask) = dropout {
        mask.apply_in_place(grad);
    }
    for_row_blocks(grad, keys, |first, out| {
        for (r, h) in out.chunks_mut(keys).enumerate() {
            let row = first + r;
            softmax_row_backward(h, &probs[row * keys..(row + 1) * keys], scale);
        }
    });
}

/// One row: `p = softmax(s·scale + b)`.
#[inline(always)]
pub(crate) fn softmax_row(s: &[f32], b: &[f32], scale: f32, p: &mut [f32]) {
    let k = p.len();
    // Zipped loops without bounds checks vectorise; the maximum in 8 lanes
    // (max is exact, so the order changes no bit).
    for ((p, &s), &b) in p.iter_mut().zip(s).zip(b) {
        *p = s * scale + b;
    }
    let mut lanes = [f32::NEG_INFINITY; 8];
    for chunk in p.chunks(8) {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(v);
        }
    }
    let max = lanes.into_iter().fold(f32::NEG_INFINITY, f32::max);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_float64_reference_with_padding_and_dropout() {
        let mut rng = terse_rng::SplitMix64::new(9);
        let (batch, rows_per_batch, keys) = (3, 5, 13);
        let n = batch * rows_per_batch * keys;
        let mut draw = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.next_u64() % 2001) as f32 / 250.0 - 4.0)
                .collect()
        };
        let (scores, grad) = (draw(n), draw(n));
        // The last 4 keys of batch element 1 are padding.
        let bias: Vec<f32> = (0..batch * keys)
            .map(|i| {
                if i / keys == 1 && i % keys >= 9 {
                    f32::MIN
                } else {
                    0.0
                }
            })
            .collect();
        let scale = 0.125f32;
        for prob in [0.0f32, 0.1] {
            let mask = SiteMask::new(prob, 99);
            let shape = ScoresShape {
                rows_per_batch,
                keys,
            };
            let mut probs = vec![0.0; n];
            let mut out = vec![0.0; n];
            attention_probs_forward(
                &scores,
                &bias,
                shape,
                scale,
                &mut probs,
                Some((&mask, &mut out)),
            );
            let mut ds = grad.clone();
            attention_probs_backward(&mut ds, &probs, keys, scale, Some(&mask));
            for row in 0..n / keys {
                let at = |j: usize| row * keys + j;
                let b = |j: usize| f64::from(bias[row / rows_per_batch * keys + j]);
                let z: Vec<f64> = (0..keys)
                    .map(|j| f64::from(scores[at(j)]) * f64::from(scale) + b(j))
                    .collect();
                let max = z.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = z.iter().map(|v| (v - max).exp()).collect();
                let total: f64 = e.iter().sum();
                let p: Vec<f64> = e.iter().map(|v| v / total).collect();
                let m = |j: usize| f64::from(mask.factor(at(j)));
                let h: Vec<f64> = (0..keys).map(|j| f64::from(grad[at(j)]) * m(j)).collect();
                let dot: f64 = (0..keys).map(|j| h[j] * p[j]).sum();
                for j in 0..keys {
                    assert!((f64::from(probs[at(j)]) - p[j]).abs() < 1e-6);
                    assert!((f64::from(out[at(j)]) - p[j] * m(j)).abs() < 2e-6);
                    let want = f64::from(scale) * p[j] * (h[j] - dot);
                    assert!(
                        (f64::from(ds[at(j)]) - want).abs() < 1e-6,
                        "{} vs {want}",
                        ds[at(j)]
                    );
                    if b(j) < -1e30 {
                        assert_eq!(probs[at(j)], 0.0);
                    }
                }
            }
        }
    }
}
