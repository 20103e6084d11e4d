//! Mean cross-entropy from logits in one pass each way (log-sum-exp per
//! row; the backward writes `(softmax − onehot)·∂loss/n` directly).

use super::rows::{for_row_blocks, sum};
use super::vector_math::exp;

/// Per-row `log Σ exp` and the mean loss `mean(lse − logit[label])`.
pub fn cross_entropy_forward(logits: &[f32], labels: &[i64], classes: usize) -> (Vec<f32>, f32) {
    let rows = labels.len();
    assert_eq!(logits.len(), rows * classes);
    let mut lse = vec![0.0f32; rows];
    // One "row" of width 1 per sample: the row loop is the parallel loop.
    for_row_blocks(&mut lse, 1, |first, out| {
        for (r, l) in out.iter_mut().enumerate() {
            let x = &logits[(first + r) * classes..(first + r + 1) * classes];
            let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            *l = max + sum(classes, |j| exp(x[j] - max)).ln();
        }
    });
    let total: f64 = labels
        .iter()
        .enumerate()
        .map(|(r, &label)| {
            f64::from(lse[r]) - f64::from(logits[r * classes + label_index(label, classes)])
        })
        .sum();
    (lse, (total / rows.max(1) as f64) as f32)
}

/// `∂logits` for an upstream gradient `grad` of the mean loss.
pub fn cross_entropy_backward(
    logits: &[f32],
    labels: &[i64],
    lse: &[f32],
    classes: usize,
    grad: f32,
    out: &mut [f32],
) {
    let scale = grad / labels.len().max(1) as f32;
    for_row_blocks(out, classes, |first, rows| {
        for (r, o) in rows.chunks_mut(classes).enumerate() {
            let row = first + r;
            let x = &logits[row * classes..(row + 1) * classes];
            for j in 0..classes {
                o[j] = scale * exp(x[j] - lse[row]);
            }
            o[label_index(labels[row], classes)] -= scale;
        }
    });
}

fn label_index(label: i64, classes: usize) -> usize {
    usize::try_from(label)
        .ok()
        .filter(|&l| l < classes)
        .unwrap_or_else(|| panic!("label {label} is outside 0..{classes}"))
}
