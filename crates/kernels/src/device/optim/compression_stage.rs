//! The 1-bit optimizers' compression stage: the local momentum (1-bit
//! LAMB's scaled per segment), the synchronised momentum masked and
//! unscaled, 1-bit LAMB's fresh variance with each chunk's largest
//! variance ratio, and the update with the variance frozen.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::chunks::*;
use crate::device::cube::cube_reduce;
use crate::host_reads;

/// `m = β1·m + (1-β1)·g` (the compression stage's local momentum).
#[cube(launch_unchecked)]
fn momentum_kernel(m: &mut [f32], g: &[f32], table: &ChunkTable, c: &[f32]) {
    let (mut i, end) = table.range();
    while i < end {
        m[i] = first_moment(m[i], g[i], c);
        i += CUBE;
    }
}

/// 1-bit LAMB's scaled momentum: `m = (β1·m + (1-β1)·g)·k_s`.
#[cube(launch_unchecked)]
fn scaled_momentum_kernel(m: &mut [f32], g: &[f32], table: &ChunkTable, c: &[f32], k: &[f32]) {
    let (mut i, end) = table.range();
    let ks = k[table.segment()];
    while i < end {
        m[i] = first_moment(m[i], g[i], c) * ks;
        i += CUBE;
    }
}

/// The synchronised momentum masked where the frozen v is zero (with
/// `hold`), then unscaled: `m = hold && v == 0 ? 0 : m / k_s`.
#[cube(launch_unchecked)]
fn unscale_masked_kernel(
    m: &mut [f32],
    v: &[f32],
    table: &ChunkTable,
    k: &[f32],
    #[comptime] hold: bool,
) {
    let (mut i, end) = table.range();
    let ks = k[table.segment()];
    while i < end {
        if hold && v[i] == 0.0 {
            m[i] = 0.0;
        } else {
            m[i] /= ks;
        }
        i += CUBE;
    }
}

/// 1-bit LAMB's fresh variance from the momentum difference,
/// `g = (m - β1·m_last)/(1-β1)`, `v_fresh = β2·v_fresh + (1-β2)·g²`, and
/// per chunk the largest variance ratio into `partials[chunk]`:
/// `denom(v)/denom(v_fresh)`, or `(v+ε)/(v_fresh+ε)` with `variance`.
/// `inv_one_minus_beta_1` holds `1/(1-β1)` (rounded as the CPU rounds it).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn fresh_variance_kernel(
    m: &[f32],
    m_last: &[f32],
    v: &[f32],
    fresh: &mut [f32],
    table: &ChunkTable,
    c: &[f32],
    inv_one_minus_beta_1: &[f32],
    partials: &mut [f32],
    #[comptime] inside: bool,
    #[comptime] variance: bool,
) {
    let (mut i, end) = table.range();
    let mut r = 0.0f32;
    while i < end {
        let g = (m[i] - c[BETA_1] * m_last[i]) * inv_one_minus_beta_1[0];
        let f = second_moment(fresh[i], g, c);
        fresh[i] = f;
        let vi = v[i];
        let mut ratio = (vi + c[EPS]) / (f + c[EPS]);
        if !variance {
            ratio = denominator(vi, c, inside) / denominator(f, c, inside);
        }
        r = f32::max(r, ratio);
        i += CUBE;
    }
    let largest = cube_reduce(r, true);
    if UNIT_POS == 0 {
        partials[CUBE_POS] = largest;
    }
}

/// `m = β1·m + (1-β1)·g` over the whole buffer.
pub fn accumulate_momentum(
    client: &Client,
    chunks: &DeviceChunks,
    m: &Handle,
    g: &Handle,
    coefficients: &MomentCoefficients,
) {
    if chunks.is_empty() {
        return;
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    // SAFETY: as in `adam_step`.
    unsafe {
        launch_chunks!(client, chunks, momentum_kernel([m, g], c));
    }
}

/// The compression stage's update with v frozen: `x` and `m` in place, one
/// rate per segment; with `hold`, where the frozen v is exactly zero, m is
/// zeroed and x stays.
#[allow(clippy::too_many_arguments)]
pub fn frozen_apply(
    client: &Client,
    chunks: &DeviceChunks,
    x: &Handle,
    m: &Handle,
    v: &Handle,
    coefficients: &MomentCoefficients,
    segment_lr: &[f32],
    inside: bool,
    hold: bool,
) {
    super::uncompressed::rate_update(
        client,
        chunks,
        [x, m, v],
        coefficients,
        segment_lr,
        inside,
        hold,
    );
}

/// `m = (β1·m + (1-β1)·g)·k_s`, one factor per segment.
pub fn scaled_momentum(
    client: &Client,
    chunks: &DeviceChunks,
    m: &Handle,
    g: &Handle,
    coefficients: &MomentCoefficients,
    k: &[f32],
) {
    assert_eq!(k.len(), chunks.segments, "one factor per segment");
    if chunks.is_empty() {
        return;
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    let k = f32_arg(client, k);
    // SAFETY: as in `adam_step`; one factor per segment.
    unsafe {
        launch_chunks!(client, chunks, scaled_momentum_kernel([m, g], c, k));
    }
}

/// `m = v == 0 ? 0 : m / k_s`, one factor per segment.
pub fn unscale_masked(
    client: &Client,
    chunks: &DeviceChunks,
    m: &Handle,
    v: &Handle,
    k: &[f32],
    hold: bool,
) {
    assert_eq!(k.len(), chunks.segments, "one factor per segment");
    if chunks.is_empty() {
        return;
    }
    let k = f32_arg(client, k);
    // SAFETY: as in `adam_step`; one factor per segment.
    unsafe {
        launch_chunks!(client, chunks, unscale_masked_kernel([m, v], k, hold));
    }
}

/// 1-bit LAMB's fresh variance (see `fresh_variance_kernel`), updated in
/// place; returns each segment's largest variance ratio.
#[allow(clippy::too_many_arguments)]
pub fn fresh_variance(
    client: &Client,
    chunks: &DeviceChunks,
    m: &Handle,
    m_last: &Handle,
    v: &Handle,
    fresh: &Handle,
    coefficients: &MomentCoefficients,
    inv_one_minus_beta_1: f32,
    inside: bool,
    variance: bool,
) -> Vec<f32> {
    let mut ratios = vec![0.0f32; chunks.segments];
    if chunks.is_empty() {
        return ratios;
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    let inv = f32_arg(client, &[inv_one_minus_beta_1]);
    let (partials, partials_arg) = chunks.partials(client, 1);
    // SAFETY: as in `adam_step`; `partials` holds one f32 per chunk.
    unsafe {
        launch_chunks!(
            client,
            chunks,
            fresh_variance_kernel(
                [m, m_last, v, fresh],
                c,
                inv,
                partials_arg,
                inside,
                variance
            )
        );
    }
    let read = host_reads::read_f32(client, partials);
    for (&(s, _, _), &r) in chunks.table.iter().zip(&read) {
        ratios[s] = ratios[s].max(r);
    }
    ratios
}
