//! Row-parallel loops with results that do not depend on the thread count:
//! rows go to tasks in fixed blocks, and per-block partial sums (the
//! parameter gradients of LayerNorm and the bias of GELU) are added in
//! block order.

use rayon::prelude::*;

/// Rows per parallel task.
pub(crate) const ROWS_PER_TASK: usize = 16;

/// Sum of `n` terms with 8 independent accumulators (a vector register's
/// worth), combined in a fixed order.
#[inline(always)]
pub(crate) fn sum(n: usize, term: impl Fn(usize) -> f32) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0.0f32; LANES];
    let full = n / LANES * LANES;
    let mut i = 0;
    while i < full {
        for (lane, a) in acc.iter_mut().enumerate() {
            *a += term(i + lane);
        }
        i += LANES;
    }
    let mut tail = 0.0f32;
    for j in full..n {
        tail += term(j);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// The largest value of a row, NaN ignored as a `f32::max` fold from −∞
/// ignores it: 16 running maxima as selects, which vectorise where
/// `f32::max`'s NaN rule does not.
#[inline(always)]
pub(crate) fn row_max(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    acc.iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// Calls `f(first_row, rows_of_out)` for blocks of [`ROWS_PER_TASK`] rows
/// of width `d`, in parallel.
pub(crate) fn for_row_blocks(
    out: &mut [f32],
    d: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if d == 0 {
        return;
    }
    // AVX is entered inside each task: rayon calls the task's closure
    // through its own (baseline-compiled) machinery, so a `with_avx` around
    // the parallel loop would not reach the loop bodies.
    out.par_chunks_mut(ROWS_PER_TASK * d)
        .enumerate()
        .for_each(|(block, rows)| crate::with_avx(|| f(block * ROWS_PER_TASK, rows)));
}

/// As [`for_row_blocks`], each block also producing a partial vector of
/// length `width` (zeroed on entry); returns the partials' sum, added in
/// block order.
pub(crate) fn for_row_blocks_summing(
    out: &mut [f32],
    d: usize,
    width: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    if d == 0 {
        return vec![0.0; width];
    }
    let partials: Vec<Vec<f32>> = out
        .par_chunks_mut(ROWS_PER_TASK * d)
        .enumerate()
        .map(|(block, rows)| {
            let mut partial = vec![0.0f32; width];
            crate::with_avx(|| f(block * ROWS_PER_TASK, rows, &mut partial));
            partial
        })
        .collect();
    add_in_block_order(&partials, width)
}

/// The sum of per-block partial vectors of length `width`, added in block
/// order (so the result does not depend on which thread made which block).
pub(crate) fn add_in_block_order(partials: &[Vec<f32>], width: usize) -> Vec<f32> {
    let mut total = vec![0.0f32; width];
    for partial in partials {
        for (t, p) in total.iter_mut().zip(partial) {
            *t += p;
        }
    }
    total
}
