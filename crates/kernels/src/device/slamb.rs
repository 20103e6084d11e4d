//! SLAMB's per-element work on the device (terse-optim's `Slamb::step` is
//! the reference): the moment update, the freshness from the step's
//! selection bits ([`super::select`]), the per-chunk norms split by
//! selection, and the update with each element's rate and trust ratio
//! blended by its freshness.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{CUBE, bit, buffer, launch_units, reduce_rows, unit_item};
use super::optim::{
    ChunkTable, DeviceChunks, MomentCoefficients, direction, f32_arg, launch_chunks, update_moments,
};

#[cube]
fn selected(selection: &[u32], i: usize) -> bool {
    bit(selection[i / 32], i % 32)
}

/// `m = β1·m + (1-β1)·g`, `v = β2·v + (1-β2)·g²`.
#[cube(launch_unchecked)]
fn moments_kernel(m: &mut [f32], v: &mut [f32], g: &[f32], table: &ChunkTable, c: &[f32]) {
    let (mut i, end) = table.range();
    while i < end {
        update_moments(m, v, i, g[i], c);
        i += CUBE;
    }
}

/// `f = 1` where selected, `β3·f` elsewhere, over the first `len`
/// elements (a padded buffer's padding is left alone); one unit each.
#[cube(launch_unchecked)]
fn freshness_kernel(f: &mut [f32], selection: &[u32], beta_3: &[f32], len: usize) {
    let i = unit_item(len);
    if selected(selection, i) {
        f[i] = 1.0;
    } else {
        f[i] *= beta_3[0];
    }
}

/// Per chunk, at `6·chunk`: `Σx²`, `Σu²` over the selected elements, the
/// same over the others, and the two counts.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn norms_kernel(
    x: &[f32],
    m: &[f32],
    v: &[f32],
    table: &ChunkTable,
    selection: &[u32],
    c: &[f32],
    partials: &mut [f32],
    #[comptime] inside: bool,
) {
    let (mut i, end) = table.range();
    let wd = table.weight_decay();
    let mut sums = Array::<f32>::new(6usize);
    #[unroll]
    for k in 0..6usize {
        sums[k] = 0.0;
    }
    while i < end {
        let xi = x[i];
        let u = direction(m[i], v[i], xi, wd, c, inside);
        if selected(selection, i) {
            sums[0] += xi * xi;
            sums[1] += u * u;
            sums[4] += 1.0;
        } else {
            sums[2] += xi * xi;
            sums[3] += u * u;
            sums[5] += 1.0;
        }
        i += CUBE;
    }
    // The six sums reduced together, as six rows.
    let unit = UNIT_POS as usize;
    let mut shared = Shared::<[f32]>::new_slice(6 * CUBE);
    #[unroll]
    for k in 0..6usize {
        shared[k * CUBE + unit] = sums[k];
    }
    reduce_rows(&mut shared, 6usize, false);
    if unit < 6 {
        partials[6 * CUBE_POS + unit] = shared[unit * CUBE];
    }
}

/// `x -= (lr·f + lr_stale·(1-f)) · clamp(φ_max·f + φ_min·(1-f), lo, hi) · u`,
/// with the segment's `[φ_max, φ_min, lo, hi]` in `phi`; `rates` holds
/// `[lr, lr_stale]`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn apply_kernel(
    x: &mut [f32],
    m: &[f32],
    v: &[f32],
    f: &[f32],
    table: &ChunkTable,
    c: &[f32],
    phi: &[f32],
    rates: &[f32],
    #[comptime] inside: bool,
) {
    let (mut i, end) = table.range();
    let s = table.segment();
    let wd = table.weight_decay();
    let (phi_max, phi_min) = (phi[4 * s], phi[4 * s + 1]);
    let (lo, hi) = (phi[4 * s + 2], phi[4 * s + 3]);
    let (lr, stale_lr) = (rates[0], rates[1]);
    while i < end {
        let xi = x[i];
        let fi = f[i];
        let u = direction(m[i], v[i], xi, wd, c, inside);
        let p = f32::min(f32::max(phi_max * fi + phi_min * (1.0 - fi), lo), hi);
        let eta = lr * fi + stale_lr * (1.0 - fi);
        x[i] = xi - eta * p * u;
        i += CUBE;
    }
}

/// The moment update over the whole buffer.
pub fn moments(
    client: &Client,
    chunks: &DeviceChunks,
    m: &Handle,
    v: &Handle,
    g: &Handle,
    coefficients: &MomentCoefficients,
) {
    if chunks.is_empty() {
        return;
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    // SAFETY: the flat buffers hold `chunks.len()` f32 (`DeviceChunks::flat`);
    // the chunk table addresses only elements below that.
    unsafe {
        launch_chunks!(client, chunks, moments_kernel([m, v, g], c));
    }
}

/// The freshness update from `selection` (one word per 32 elements).
pub fn freshness(client: &Client, f: &Handle, selection: &Handle, len: usize, beta_3: f32) {
    if len == 0 {
        return;
    }
    let beta_3 = f32_arg(client, &[beta_3]);
    // SAFETY: `f` holds `len` f32, `selection` one word per 32 of them.
    unsafe {
        launch_units!(
            client,
            len,
            freshness_kernel(
                buffer(f, len),
                buffer(selection, len.div_ceil(32)),
                beta_3,
                len
            )
        );
    }
}

/// Each chunk's norms split by `selection` (six f32 per chunk, in a new
/// device buffer, not read: [`super::slamb_trust`] totals them there);
/// `None` when there are no chunks.
pub(super) fn queue_split_norms(
    client: &Client,
    chunks: &DeviceChunks,
    [x, m, v]: [&Handle; 3],
    selection: &Handle,
    coefficients: &MomentCoefficients,
    inside: bool,
) -> Option<Handle> {
    if chunks.is_empty() {
        return None;
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    let (partials, partials_arg) = chunks.partials(client, 6);
    // SAFETY: as in `moments`; `partials` holds six f32 per chunk, the
    // selection one word per 32 elements.
    unsafe {
        let selection = buffer(selection, chunks.len().div_ceil(32));
        launch_chunks!(
            client,
            chunks,
            norms_kernel([x, m, v], selection, c, partials_arg, inside)
        );
    }
    Some(partials)
}

/// The update: `phi` holds `[φ_max, φ_min, lo, hi]` per segment, the two
/// ratios and the bounds their blend is clipped to (on the device, as
/// [`super::slamb_trust::trust_ratios`] leaves them).
#[allow(clippy::too_many_arguments)]
pub fn apply(
    client: &Client,
    chunks: &DeviceChunks,
    x: &Handle,
    m: &Handle,
    v: &Handle,
    f: &Handle,
    coefficients: &MomentCoefficients,
    phi: &Handle,
    lr: f32,
    stale_lr: f32,
    inside: bool,
) {
    if chunks.is_empty() {
        return;
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    // SAFETY (of the launch below too): four f32 per segment, the caller's
    // contract.
    let phi = unsafe { buffer(phi, 4 * chunks.segment_count()) };
    let rates = f32_arg(client, &[lr, stale_lr]);
    // SAFETY: as in `moments`; four values per segment, two rates.
    unsafe {
        launch_chunks!(
            client,
            chunks,
            apply_kernel([x, m, v, f], c, phi, rates, inside)
        );
    }
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    moments_kernel::MomentsKernel(b(), b(), b(), table(), b()),
    freshness_kernel::FreshnessKernel(b(), b(), b(), ()),
    norms_kernel::NormsKernel(b(), b(), b(), table(), b(), b(), b(), true),
    norms_kernel::NormsKernel(b(), b(), b(), table(), b(), b(), b(), false),
    apply_kernel::ApplyKernel(b(), b(), b(), b(), table(), b(), b(), b(), true),
    apply_kernel::ApplyKernel(b(), b(), b(), b(), table(), b(), b(), b(), false),
];
