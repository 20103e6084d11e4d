//! The uncompressed optimizers' updates: Adam/AdamW in one pass, LAMB's
//! two passes (moments with the chunks' partial norms, then the update
//! with each segment's trust-scaled rate) and momentum SGD.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::chunks::*;
use crate::device::cube::reduce_rows;

/// One cube per chunk: moments, direction and parameter in one pass.
#[cube(launch_unchecked)]
fn adam_kernel(
    x: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    table: &ChunkTable,
    c: &[f32],
    #[comptime] inside: bool,
) {
    let (mut i, end) = table.range();
    let wd = table.weight_decay();
    while i < end {
        let (mi, vi) = update_moments(m, v, i, g[i] * c[GRAD_SCALE], c);
        let xi = x[i];
        x[i] = xi - c[LR] * direction(mi, vi, xi, wd, c, inside);
        i += CUBE;
    }
}

/// LAMB's first pass, one cube per chunk: moments updated, the chunk's
/// `Σx²` and `Σu²` (u Adam's direction) into `partials` at `2·chunk` and
/// `2·chunk + 1`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn lamb_norms_kernel(
    x: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    table: &ChunkTable,
    c: &[f32],
    partials: &mut [f32],
    #[comptime] inside: bool,
) {
    let (mut i, end) = table.range();
    let wd = table.weight_decay();
    let mut xx = 0.0f32;
    let mut uu = 0.0f32;
    while i < end {
        let (mi, vi) = update_moments(m, v, i, g[i] * c[GRAD_SCALE], c);
        let xi = x[i];
        let u = direction(mi, vi, xi, wd, c, inside);
        xx += xi * xi;
        uu += u * u;
        i += CUBE;
    }
    // Both sums reduced together, as two rows.
    let unit = UNIT_POS as usize;
    let mut shared = Shared::<[f32]>::new_slice(2 * CUBE);
    shared[unit] = xx;
    shared[CUBE + unit] = uu;
    reduce_rows(&mut shared, 2usize, false);
    if unit == 0 {
        let chunk = CUBE_POS;
        partials[2 * chunk] = shared[0];
        partials[2 * chunk + 1] = shared[CUBE];
    }
}

/// `x -= lr_s·(m̂/denom(v̂) + wd·x)` with one rate per segment: LAMB's
/// second pass, and with `masked` the 1-bit compression stage's update
/// with v frozen, which skips the coordinates whose frozen v is exactly
/// zero (no warmup step reached them) and zeroes their momentum instead
/// (terse-optim's `mask_momentum` and `FrozenUpdate::apply`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn rate_update_kernel(
    x: &mut [f32],
    m: &mut [f32],
    v: &[f32],
    table: &ChunkTable,
    c: &[f32],
    segment_lr: &[f32],
    #[comptime] inside: bool,
    #[comptime] masked: bool,
) {
    let (mut i, end) = table.range();
    let wd = table.weight_decay();
    let lr = segment_lr[table.segment()];
    while i < end {
        let vi = v[i];
        if masked && vi <= 0.0 {
            m[i] = 0.0;
        } else {
            let xi = x[i];
            x[i] = xi - lr * direction(m[i], vi, xi, wd, c, inside);
        }
        i += CUBE;
    }
}

/// SGD with momentum: `d = g + wd·x; m = μm + d; x -= lr·(d + μm | m)`.
#[cube(launch_unchecked)]
fn sgd_kernel(
    x: &mut [f32],
    m: &mut [f32],
    g: &[f32],
    table: &ChunkTable,
    c: &[f32],
    #[comptime] nesterov: bool,
) {
    let (mut i, end) = table.range();
    let wd = table.weight_decay();
    let (mu, lr) = (c[0], c[1]);
    while i < end {
        let xi = x[i];
        let d = g[i] + wd * xi;
        let mi = mu * m[i] + d;
        m[i] = mi;
        let mut step = mi;
        if nesterov {
            step = d + mu * mi;
        }
        x[i] = xi - lr * step;
        i += CUBE;
    }
}

/// One Adam step over `chunks.len()` elements of the f32 device buffers
/// `x`, `m`, `v` (updated in place) and `g`.
#[allow(clippy::too_many_arguments)]
pub fn adam_step(
    client: &Client,
    chunks: &DeviceChunks,
    x: &Handle,
    m: &Handle,
    v: &Handle,
    g: &Handle,
    coefficients: &MomentCoefficients,
    lr: f32,
    inside: bool,
) {
    if chunks.is_empty() {
        return;
    }
    let c = chunks.coefficients(client, coefficients, lr);
    // SAFETY: the flat buffers hold `chunks.len()` f32 (`DeviceChunks::flat`),
    // the table and coefficient buffers are sized by `table` and
    // `coefficients`; the chunks address only elements below `chunks.len()`.
    unsafe {
        launch_chunks!(client, chunks, adam_kernel([x, m, v, g], c, inside));
    }
}

/// [`rate_update_kernel`] over `[x, m, v]`.
pub(crate) fn rate_update(
    client: &Client,
    chunks: &DeviceChunks,
    [x, m, v]: [&Handle; 3],
    coefficients: &MomentCoefficients,
    segment_lr: &[f32],
    inside: bool,
    masked: bool,
) {
    assert_eq!(segment_lr.len(), chunks.segments, "one rate per segment");
    if chunks.is_empty() {
        return;
    }
    let rates = f32_arg(client, segment_lr);
    rate_update_arg(
        client,
        chunks,
        [x, m, v],
        coefficients,
        rates,
        inside,
        masked,
    );
}

/// [`rate_update`] with the rates already on the device (one f32 per
/// segment: the caller's contract).
pub(super) fn rate_update_arg(
    client: &Client,
    chunks: &DeviceChunks,
    [x, m, v]: [&Handle; 3],
    coefficients: &MomentCoefficients,
    rates: BufferArg,
    inside: bool,
    masked: bool,
) {
    if chunks.is_empty() {
        return;
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    // SAFETY: as in `adam_step`; one rate per segment.
    unsafe {
        launch_chunks!(
            client,
            chunks,
            rate_update_kernel([x, m, v], c, rates, inside, masked)
        );
    }
}

/// One SGD step with momentum `mu` (Nesterov's form when asked).
#[allow(clippy::too_many_arguments)]
pub fn sgd_step(
    client: &Client,
    chunks: &DeviceChunks,
    x: &Handle,
    m: &Handle,
    g: &Handle,
    mu: f32,
    lr: f32,
    nesterov: bool,
) {
    if chunks.is_empty() {
        return;
    }
    let c = f32_arg(client, &[mu, lr]);
    // SAFETY: as in `adam_step`.
    unsafe {
        launch_chunks!(client, chunks, sgd_kernel([x, m, g], c, nesterov));
    }
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    adam_kernel::AdamKernel(b(), b(), b(), b(), table(), b(), true),
    adam_kernel::AdamKernel(b(), b(), b(), b(), table(), b(), false),
    lamb_norms_kernel::LambNormsKernel(b(), b(), b(), b(), table(), b(), b(), true),
    lamb_norms_kernel::LambNormsKernel(b(), b(), b(), b(), table(), b(), b(), false),
    rate_update_kernel::RateUpdateKernel(b(), b(), b(), table(), b(), b(), true, true),
    rate_update_kernel::RateUpdateKernel(b(), b(), b(), table(), b(), b(), false, false),
    sgd_kernel::SgdKernel(b(), b(), b(), table(), b(), true),
    sgd_kernel::SgdKernel(b(), b(), b(), table(), b(), false),
];
