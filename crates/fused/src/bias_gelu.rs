//! The feed-forward expansion's bias and exact GELU in one pass each way,
//! with the vectorised erf of [`super::vector_math`] (burn's erf is a
//! scalar libm call per element, and its autodiff keeps four tensors).

use super::rows::{for_row_blocks, for_row_blocks_summing};
use super::vector_math::{gelu, gelu_derivative};

/// `out = gelu(h + bias)` over rows of width `bias.len()`.
pub fn bias_gelu_forward(h: &[f32], bias: &[f32], out: &mut [f32]) {
    let d = bias.len();
    assert_eq!(h.len(), out.len());
    for_row_blocks(out, d, |first, rows| {
        for (r, out) in rows.chunks_mut(d).enumerate() {
            let h = &h[(first + r) * d..(first + r + 1) * d];
            // Zipped, not indexed: no bounds checks, so the loop vectorises.
            for ((out, &h), &b) in out.iter_mut().zip(h).zip(bias) {
                *out = gelu(h + b);
            }
        }
    });
}

/// `∂h = ∂out·gelu'(h + bias)` in place in `grad`; returns `∂bias`.
pub fn bias_gelu_backward(grad: &mut [f32], h: &[f32], bias: &[f32]) -> Vec<f32> {
    let d = bias.len();
    assert_eq!(h.len(), grad.len());
    for_row_blocks_summing(grad, d, d, |first, rows, dbias| {
        for (r, g) in rows.chunks_mut(d).enumerate() {
            let h = &h[(first + r) * d..(first + r + 1) * d];
            for ((g, &h), &b) in g.iter_mut().zip(h).zip(bias) {
                *g *= gelu_derivative(h + b);
            }
            // A loop of its own: with the accumulation inside, the loop
            // above stayed scalar (5x slower).
            for (db, &g) in dbias.iter_mut().zip(g.iter()) {
                *db += g;
            }
        }
    })
}
