//! LayerNorm in one kernel each way, one cube per row. Forward: the row's
//! mean and `sqrt(var + ε)` (biased variance), then `x̂ = (x − mean) /
//! sqrt(var + ε)` and `y = x̂·γ + β`, with x̂ and the denominator written
//! for the backward pass; optionally of a residual block's sum `x·f + r`
//! (`f` the dropout factors, hashed here: a post-LN transformer's
//! `LayerNorm(dropout(h) + r)`), so that the sum is neither a dispatch nor
//! a tensor. Backward, the input's gradient from the upstream
//! gradient g, the kept x̂ and denominator and γ:
//! `∂x = (g·γ − mean(g·γ) − x̂·mean(g·γ·x̂)) / sqrt(var + ε)`.
//!
//! As burn ops the forward pass is two row sums (the mean, then the
//! variance of the centred row) and the element-wise steps between and
//! after them, which burn's fusion cannot fuse across the sums: on
//! lavapipe four dispatches, here one that reads the row three times.
//! The backward closed form is a chain: two products, two row sums
//! (their inputs products burn's fusion cannot fold into a reduction it
//! does not own), the means and three element-wise steps, each a pass over
//! the `[rows, d]` activations and a dispatch. Here one cube per row reads
//! g, x̂ and γ twice (the row's two sums in a fixed shared-memory tree,
//! then the gradient) and writes ∂x once.

use cubecl::prelude::*;
use cubecl::server::Handle;

use terse_compress::dropout::SiteMask;

use super::cube::{CUBE, buffer, check_lengths, cube_reduce, launch_dims, reduce_rows};
use super::dropout::dropout_factor;

/// One cube per row of `x` `[rows, d]`: `y = x̂·γ + β` with `x̂ = (s −
/// mean) / denom`, `denom = sqrt(mean((s − mean)²) + eps)` (burn's
/// arithmetic: the centred row's biased variance) for `s = x`, or with
/// `residual` `s = x·f + r` (`f` the dropout factor of the element's
/// position); x̂ and the row's denom kept. The first pass leaves `s` in
/// `y`, which the later passes read back (each unit its own elements) and
/// the last overwrites. Cubes past the last row terminate.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel(
    x: &[f32],
    r: &[f32],
    gamma: &[f32],
    beta: &[f32],
    y: &mut [f32],
    xhat: &mut [f32],
    denom: &mut [f32],
    rows: usize,
    d: usize,
    eps: f32,
    key0: u32,
    key1: u32,
    threshold: u32,
    keep_scale: f32,
    #[comptime] residual: bool,
) {
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let unit = UNIT_POS as usize;
    let base = row * d;
    let width = f32::cast_from(d);
    let mut sum = 0.0f32;
    let mut j = unit;
    while j < d {
        let i = base + j;
        if residual {
            let s = x[i] * dropout_factor(i, key0, key1, threshold, keep_scale) + r[i];
            y[i] = s;
            sum += s;
        } else {
            sum += x[i];
        }
        j += CUBE;
    }
    let mean = cube_reduce(sum, false) / width;
    let mut squares = 0.0f32;
    j = unit;
    while j < d {
        let i = base + j;
        let centred = if residual { y[i] - mean } else { x[i] - mean };
        squares += centred * centred;
        j += CUBE;
    }
    let root = f32::sqrt(cube_reduce(squares, false) / width + eps);
    if unit == 0 {
        denom[row] = root;
    }
    j = unit;
    while j < d {
        let i = base + j;
        let centred = if residual { y[i] - mean } else { x[i] - mean };
        let normalised = centred / root;
        xhat[i] = normalised;
        y[i] = normalised * gamma[j] + beta[j];
        j += CUBE;
    }
}

/// LayerNorm of `rows` rows of `d` (`x` `rows·d` f32 row by row, γ and β
/// `d`), or with `residual = Some((r, mask))` of `x·f + r` (`r` `rows·d`,
/// `f` `mask`'s factor of each element by its position): new buffers `[y,
/// x̂, denom]` of `rows·d`, `rows·d` and `rows` f32.
///
/// # Panics
/// If a buffer is shorter than that, or `rows·d` exceeds u32 with a
/// residual (the dropout hash's index).
pub fn layer_norm_forward(
    client: &Client,
    [x, gamma, beta]: [&Handle; 3],
    residual: Option<(&Handle, &SiteMask)>,
    rows: usize,
    d: usize,
    eps: f32,
) -> [Handle; 3] {
    let n = rows * d;
    check_lengths(&[("x", x, n), ("γ", gamma, d), ("β", beta, d)]);
    if let Some((r, _)) = residual {
        check_lengths(&[("residual", r, n)]);
        assert!(
            u32::try_from(n).is_ok(),
            "{n} elements: the dropout hash indexes them as u32"
        );
    }
    let [y, xhat, denom] = [n, n, rows].map(|len| client.empty(len.max(1) * size_of::<f32>()));
    if n == 0 {
        return [y, xhat, denom];
    }
    // Without a residual the kernel reads neither `r` nor the mask.
    let unread = client.empty(size_of::<f32>());
    let (r, r_len, mask) = match residual {
        Some((r, mask)) => (r, n, mask.parts()),
        None => (&unread, 1, (0, 0, 0, 1.0)),
    };
    let (key0, key1, threshold, keep_scale) = mask;
    let (count, dim) = launch_dims(client, rows * CUBE);
    // SAFETY: the inputs' lengths are checked above and the outputs made
    // to size (`r` is read only with a residual, when it holds `n`); one
    // cube per row, bounded by `rows`, each unit's reads and writes by `d`
    // within its row.
    unsafe {
        forward_kernel::launch_unchecked(
            client,
            count,
            dim,
            buffer(x, n),
            buffer(r, r_len),
            buffer(gamma, d),
            buffer(beta, d),
            buffer(&y, n),
            buffer(&xhat, n),
            buffer(&denom, rows),
            rows,
            d,
            eps,
            key0,
            key1,
            threshold,
            keep_scale,
            residual.is_some(),
        );
    }
    [y, xhat, denom]
}

/// One cube per row of `[rows, d]`; cubes past the last row terminate.
#[cube(launch_unchecked)]
fn input_grad_kernel(
    g: &[f32],
    xhat: &[f32],
    denom: &[f32],
    gamma: &[f32],
    dx: &mut [f32],
    rows: usize,
    d: usize,
) {
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let unit = UNIT_POS as usize;
    let base = row * d;
    let mut shared = Shared::<[f32]>::new_slice(2 * CUBE);
    let mut sum = 0.0f32;
    let mut sum_xhat = 0.0f32;
    let mut j = unit;
    while j < d {
        let a = g[base + j] * gamma[j];
        sum += a;
        sum_xhat += a * xhat[base + j];
        j += CUBE;
    }
    shared[unit] = sum;
    shared[CUBE + unit] = sum_xhat;
    reduce_rows(&mut shared, 2usize, false);
    let width = f32::cast_from(d);
    let mean = shared[0] / width;
    let mean_xhat = shared[CUBE] / width;
    let scale = denom[row];
    j = unit;
    while j < d {
        let a = g[base + j] * gamma[j];
        dx[base + j] = (a - mean - xhat[base + j] * mean_xhat) / scale;
        j += CUBE;
    }
}

/// LayerNorm's input gradient over `rows` rows of `d`: `g` and `xhat`
/// hold `rows·d` f32 row by row, `denom` one per row, `gamma` `d`; returns
/// a new buffer of `rows·d` f32.
///
/// # Panics
/// If a buffer is shorter than that.
pub fn layer_norm_input_grad(
    client: &Client,
    [g, xhat, denom, gamma]: [&Handle; 4],
    rows: usize,
    d: usize,
) -> Handle {
    let n = rows * d;
    check_lengths(&[
        ("g", g, n),
        ("x̂", xhat, n),
        ("denom", denom, rows),
        ("γ", gamma, d),
    ]);
    let dx = client.empty(n.max(1) * size_of::<f32>());
    if n == 0 {
        return dx;
    }
    let (count, dim) = launch_dims(client, rows * CUBE);
    // SAFETY: the lengths are checked above; one cube per row, bounded by
    // `rows`, each unit's reads and writes by `d` within its row.
    unsafe {
        input_grad_kernel::launch_unchecked(
            client,
            count,
            dim,
            buffer(g, n),
            buffer(xhat, n),
            buffer(denom, rows),
            buffer(gamma, d),
            buffer(&dx, n),
            rows,
            d,
        );
    }
    dx
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    forward_kernel::ForwardKernel(
        b(),
        b(),
        b(),
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
        true
    ),
    input_grad_kernel::InputGradKernel(b(), b(), b(), b(), b(), (), ()),
];
