//! LayerNorm in one kernel each way, one cube per row. Forward: the row's
//! mean and `sqrt(var + ε)` (biased variance), then `x̂ = (x − mean) /
//! sqrt(var + ε)` and `y = x̂·γ + β`, with x̂ and the denominator written
//! for the backward pass. Backward, the input's gradient from the upstream
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

use super::cube::{CUBE, buffer, check_lengths, cube_reduce, launch_dims, reduce_rows};

/// One cube per row of `x` `[rows, d]`: `y = x̂·γ + β` with `x̂ = (x −
/// mean) / denom`, `denom = sqrt(mean((x − mean)²) + eps)` (burn's
/// arithmetic: the centred row's biased variance); x̂ and the row's denom
/// kept. Cubes past the last row terminate.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    y: &mut [f32],
    xhat: &mut [f32],
    denom: &mut [f32],
    rows: usize,
    d: usize,
    eps: f32,
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
        sum += x[base + j];
        j += CUBE;
    }
    let mean = cube_reduce(sum, false) / width;
    let mut squares = 0.0f32;
    j = unit;
    while j < d {
        let centred = x[base + j] - mean;
        squares += centred * centred;
        j += CUBE;
    }
    let root = f32::sqrt(cube_reduce(squares, false) / width + eps);
    if unit == 0 {
        denom[row] = root;
    }
    j = unit;
    while j < d {
        let normalised = (x[base + j] - mean) / root;
        xhat[base + j] = normalised;
        y[base + j] = normalised * gamma[j] + beta[j];
        j += CUBE;
    }
}

/// LayerNorm of `rows` rows of `d` (`x` `rows·d` f32 row by row, γ and β
/// `d`): new buffers `[y, x̂, denom]` of `rows·d`, `rows·d` and `rows` f32.
///
/// # Panics
/// If a buffer is shorter than that.
pub fn layer_norm_forward(
    client: &Client,
    [x, gamma, beta]: [&Handle; 3],
    rows: usize,
    d: usize,
    eps: f32,
) -> [Handle; 3] {
    let n = rows * d;
    check_lengths(&[("x", x, n), ("γ", gamma, d), ("β", beta, d)]);
    let [y, xhat, denom] = [n, n, rows].map(|len| client.empty(len.max(1) * size_of::<f32>()));
    if n == 0 {
        return [y, xhat, denom];
    }
    let (count, dim) = launch_dims(client, rows * CUBE);
    // SAFETY: the inputs' lengths are checked above and the outputs made
    // to size; one cube per row, bounded by `rows`, each unit's reads and
    // writes by `d` within its row.
    unsafe {
        forward_kernel::launch_unchecked(
            client,
            count,
            dim,
            buffer(x, n),
            buffer(gamma, d),
            buffer(beta, d),
            buffer(&y, n),
            buffer(&xhat, n),
            buffer(&denom, rows),
            rows,
            d,
            eps,
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
    forward_kernel::ForwardKernel(b(), b(), b(), b(), b(), b(), (), (), ()),
    input_grad_kernel::InputGradKernel(b(), b(), b(), b(), b(), (), ()),
];
