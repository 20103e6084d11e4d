//! A residual block's end, `relu(a + b)`, in one pass each way. burn
//! records the add and the ReLU as two ops over the whole activation
//! (single-threaded on flex below 4M elements, a ResNet-20 activation is
//! 2M) and its ReLU backward builds a boolean mask tensor; here the
//! backward reads the output's sign.

use rayon::prelude::*;

use super::PIECE;

/// `out = max(a + b, 0)`; `a` becomes the output (in place: it is the
/// block's fresh branch output).
pub fn add_relu_forward(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "add_relu: operands differ in length");
    a.par_chunks_mut(PIECE)
        .zip(b.par_chunks(PIECE))
        .for_each(|(a, b)| {
            crate::with_avx(|| {
                for (a, &b) in a.iter_mut().zip(b) {
                    *a = (*a + b).max(0.0);
                }
            })
        });
}

/// `grad ·= [out > 0]` in place: the gradient of both operands.
pub fn add_relu_backward(grad: &mut [f32], out: &[f32]) {
    assert_eq!(
        grad.len(),
        out.len(),
        "add_relu: gradient and output differ"
    );
    grad.par_chunks_mut(PIECE)
        .zip(out.par_chunks(PIECE))
        .for_each(|(g, o)| {
            crate::with_avx(|| {
                for (g, &o) in g.iter_mut().zip(o) {
                    *g = if o > 0.0 { *g } else { 0.0 };
                }
            })
        });
}
