//! Attention probabilities with dropout in one kernel each way, each row
//! of the scores taken by a segment of a cube's units (as many as the
//! row's keys rounded up to a power of two, 32 to 256: two rows per cube
//! at seq 128, [`segment_width`]): forward `out = softmax(z·scale + bias)·f` over
//! the key axis, the bias row (0 on tokens, the lowest float on padding)
//! shared by the `rows_per_bias` rows of one sequence's heads and queries,
//! `f` the dropout factor of each element by its position (the CPU's
//! `SiteMask` hash, as `dropout.rs`'s kernel computes it); backward
//! `∂z = scale·p·(g·f − Σ g·f·p)`, `p` recomputed from `z` as the forward
//! pass computed it, so that neither the probabilities nor the factors are
//! kept between the passes (flash attention's trade: arithmetic for
//! memory).
//!
//! As burn ops under autodiff the forward pass is a scale and a bias add
//! (on a bias first repeated per head, a copy), a row maximum, the shifted
//! exponential, a row sum, a division and the dropout's factors and
//! product, and the backward pass runs back through each: passes over
//! `[batch·heads, seq, seq]`, the largest activation of a BERT layer. The
//! arithmetic is flex's fused attention's (`terse-fused`'s
//! `attention_probs.rs`): the maximum subtracted, the sum's reciprocal
//! multiplied.

use cubecl::prelude::*;
use cubecl::server::Handle;
use terse_compress::dropout::SiteMask;

use super::cube::{CUBE, buffer, check_lengths, launch_dims, segment_reduce};
use super::dropout::dropout_factor;

/// This unit's row of `z` `[rows, n]`, each row taken by a segment of
/// `width` consecutive units (`CUBE / width` rows per cube): where the
/// row starts in `z` and in the bias (row `r / rows_per_bias`), the
/// unit's lane in its segment, and how many keys it covers (0 for a
/// segment past the last row, whose units still join the cube's
/// reductions). Cubes wholly past the last row terminate.
#[cube]
fn this_row(
    rows: usize,
    n: usize,
    rows_per_bias: usize,
    #[comptime] width: usize,
) -> (usize, usize, usize, usize) {
    let first = CUBE_POS * comptime!(CUBE / width);
    if first >= rows {
        terminate!();
    }
    let unit = UNIT_POS as usize;
    let row = first + unit / width;
    let mut keys = n;
    if row >= rows {
        keys = 0;
    }
    (row * n, (row / rows_per_bias) * n, unit % width, keys)
}

/// The score `z·scale + bias` of key `j` of the row starting at `base`
/// in `z` and `bias_base` in the bias.
#[cube]
fn score(z: &[f32], bias: &[f32], base: usize, bias_base: usize, j: usize, scale: f32) -> f32 {
    z[base + j] * scale + bias[bias_base + j]
}

/// The row's maximum score and the reciprocal of its sum of shifted
/// exponentials, with which `p_j = exp(score_j − max)·inv`; the unit
/// covers keys `lane, lane + width, …` below `keys`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn max_and_inverse_sum(
    z: &[f32],
    bias: &[f32],
    base: usize,
    bias_base: usize,
    lane: usize,
    keys: usize,
    scale: f32,
    #[comptime] width: usize,
) -> (f32, f32) {
    // The lowest finite float, not −∞ (WGSL has no infinite literal): a
    // score is at least that unless z itself is −∞ or beyond 2^103.
    let mut largest = f32::min_value();
    let mut j = lane;
    while j < keys {
        largest = f32::max(largest, score(z, bias, base, bias_base, j, scale));
        j += width;
    }
    let row_max = segment_reduce(largest, width, true);
    let mut sum = 0.0f32;
    j = lane;
    while j < keys {
        sum += f32::exp(score(z, bias, base, bias_base, j, scale) - row_max);
        j += width;
    }
    (row_max, 1.0f32 / segment_reduce(sum, width, false))
}

/// One segment of `width` units per row of `z` `[rows, n]`: `out =
/// softmax(z·scale + bias)` times the dropout factors.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn masked_softmax_kernel(
    z: &[f32],
    bias: &[f32],
    out: &mut [f32],
    rows: usize,
    n: usize,
    rows_per_bias: usize,
    scale: f32,
    key0: u32,
    key1: u32,
    threshold: u32,
    keep_scale: f32,
    #[comptime] width: usize,
) {
    let (base, bias_base, lane, keys) = this_row(rows, n, rows_per_bias, width);
    let (row_max, inv) = max_and_inverse_sum(z, bias, base, bias_base, lane, keys, scale, width);
    let mut j = lane;
    while j < keys {
        let i = base + j;
        let p = f32::exp(score(z, bias, base, bias_base, j, scale) - row_max) * inv;
        out[i] = p * dropout_factor(i, key0, key1, threshold, keep_scale);
        j += width;
    }
}

/// One segment of `width` units per row of `[rows, n]`: with `p`
/// recomputed from `z` as the forward pass computed it and the factors
/// `f`, `∂z = scale·p·(g·f − Σ g·f·p)`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn masked_softmax_grad_kernel(
    g: &[f32],
    z: &[f32],
    bias: &[f32],
    dz: &mut [f32],
    rows: usize,
    n: usize,
    rows_per_bias: usize,
    scale: f32,
    key0: u32,
    key1: u32,
    threshold: u32,
    keep_scale: f32,
    #[comptime] width: usize,
) {
    let (base, bias_base, lane, keys) = this_row(rows, n, rows_per_bias, width);
    let (row_max, inv) = max_and_inverse_sum(z, bias, base, bias_base, lane, keys, scale, width);
    let mut dot = 0.0f32;
    let mut j = lane;
    while j < keys {
        let i = base + j;
        let p = f32::exp(score(z, bias, base, bias_base, j, scale) - row_max) * inv;
        dot += g[i] * dropout_factor(i, key0, key1, threshold, keep_scale) * p;
        j += width;
    }
    let row_dot = segment_reduce(dot, width, false);
    j = lane;
    while j < keys {
        let i = base + j;
        let p = f32::exp(score(z, bias, base, bias_base, j, scale) - row_max) * inv;
        let h = g[i] * dropout_factor(i, key0, key1, threshold, keep_scale);
        dz[i] = scale * p * (h - row_dot);
        j += width;
    }
}

/// The scores' shape and scale: `z` `[rows, n]` row-major, row `r` biased
/// by row `r / rows_per_bias` of the bias `[rows / rows_per_bias, n]`.
#[derive(Debug, Clone, Copy)]
pub struct ScoreRows {
    /// Rows of `z`.
    pub rows: usize,
    /// Keys per row.
    pub n: usize,
    /// Consecutive rows sharing one bias row (heads × queries).
    pub rows_per_bias: usize,
    /// The scores' scale (1/√head_dim).
    pub scale: f32,
}

impl ScoreRows {
    /// Checks the shape against the buffers; the elements of `z`.
    fn check(&self, z: &Handle, bias: &Handle) -> usize {
        let ScoreRows {
            rows,
            n,
            rows_per_bias,
            ..
        } = *self;
        assert!(
            rows_per_bias > 0 && rows.is_multiple_of(rows_per_bias),
            "{rows} rows do not share bias rows {rows_per_bias} at a time"
        );
        let len = rows * n;
        assert!(
            u32::try_from(len).is_ok(),
            "{len} scores: the dropout hash indexes them as u32"
        );
        check_lengths(&[("z", z, len), ("bias", bias, rows / rows_per_bias * n)]);
        len
    }

    /// `z` and the bias as the kernels take them.
    ///
    /// # Safety
    /// [`Self::check`] passed for these buffers.
    unsafe fn score_args(&self, z: &Handle, bias: &Handle) -> (BufferArg, BufferArg) {
        let len = self.rows * self.n;
        // SAFETY: the caller's contract: `check` measured both.
        unsafe {
            (
                buffer(z, len),
                buffer(bias, self.rows / self.rows_per_bias * self.n),
            )
        }
    }
}

/// `softmax(z·scale + bias)` over each row of `z` times `dropout`'s
/// factors (at probability 0 all 1), the factor of element `i` by its
/// position in `z`; returns a new buffer of `rows·n` f32.
///
/// # Panics
/// If `rows_per_bias` is 0 or does not divide `rows`, a buffer is shorter
/// than the shape says, or `rows·n` exceeds u32.
pub fn masked_softmax(
    client: &Client,
    [z, bias]: [&Handle; 2],
    shape: ScoreRows,
    dropout: &SiteMask,
) -> Handle {
    launch_rows(client, None, [z, bias], shape, dropout)
}

/// The gradient of [`masked_softmax`]'s `z` from the upstream `g`
/// `[rows, n]`, the same `z`, bias and dropout (the probabilities
/// recomputed as the forward pass computed them): `scale·p·(g·f − Σ_row
/// g·f·p)` in a new buffer of `rows·n` f32.
///
/// # Panics
/// As [`masked_softmax`], or if `g` is shorter than `z`.
pub fn masked_softmax_grad(
    client: &Client,
    [g, z, bias]: [&Handle; 3],
    shape: ScoreRows,
    dropout: &SiteMask,
) -> Handle {
    launch_rows(client, Some(g), [z, bias], shape, dropout)
}

/// The units per row for rows of `n` keys: the power of two that holds
/// them, at least 32 (a warp) and at most a cube. A cube takes `CUBE /
/// width` rows: at BERT's seq 128 two, where one row per cube left half
/// its units idle through every reduction.
fn segment_width(n: usize) -> usize {
    n.next_power_of_two().clamp(32, CUBE)
}

/// The forward kernel, or with the upstream gradient `g` the backward
/// one, into a new buffer of `rows·n` f32.
fn launch_rows(
    client: &Client,
    g: Option<&Handle>,
    [z, bias]: [&Handle; 2],
    shape: ScoreRows,
    dropout: &SiteMask,
) -> Handle {
    let len = shape.check(z, bias);
    if let Some(g) = g {
        check_lengths(&[("g", g, len)]);
    }
    let out = client.empty(len.max(1) * size_of::<f32>());
    if len == 0 {
        return out;
    }
    let (key0, key1, threshold, keep_scale) = dropout.parts();
    let width = segment_width(shape.n);
    let (count, dim) = launch_dims(client, shape.rows.div_ceil(CUBE / width) * CUBE);
    let ScoreRows {
        rows,
        n,
        rows_per_bias,
        scale,
    } = shape;
    // SAFETY: the lengths are checked above (`g`, `z` and `out` hold `len`
    // f32); one segment of `width` units per row, a segment past the last
    // row covering no keys, each unit's reads and writes bounded by `n`
    // within its row, and the bias row `r / rows_per_bias` below `rows /
    // rows_per_bias`.
    unsafe {
        let (z, bias) = shape.score_args(z, bias);
        let out = buffer(&out, len);
        match g {
            None => masked_softmax_kernel::launch_unchecked(
                client,
                count,
                dim,
                z,
                bias,
                out,
                rows,
                n,
                rows_per_bias,
                scale,
                key0,
                key1,
                threshold,
                keep_scale,
                width,
            ),
            Some(g) => masked_softmax_grad_kernel::launch_unchecked(
                client,
                count,
                dim,
                buffer(g, len),
                z,
                bias,
                out,
                rows,
                n,
                rows_per_bias,
                scale,
                key0,
                key1,
                threshold,
                keep_scale,
                width,
            ),
        }
    }
    out
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    masked_softmax_kernel::MaskedSoftmaxKernel(b(), b(), b(), (), (), (), (), (), (), (), (), 128),
    masked_softmax_grad_kernel::MaskedSoftmaxGradKernel(
        b(),
        b(),
        b(),
        b(),
        (),
        (),
        (),
        (),
        (),
        (),
        (),
        (),
        256
    ),
];
