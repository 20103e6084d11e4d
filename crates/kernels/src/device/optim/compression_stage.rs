//! The 1-bit optimizers' compression stage: the local momentum (1-bit
//! LAMB's scaled per segment), the synchronised momentum masked and
//! unscaled, 1-bit LAMB's fresh variance with each chunk's largest
//! variance ratio, and the update with the variance frozen.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::chunks::*;
use crate::device::cube::{buffer, cube_reduce};
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

/// The fresh variance's constants, and its ratio's kind.
#[derive(Debug, Clone, Copy)]
pub struct FreshVarianceConstants<'a> {
    /// This step's moment coefficients (the frozen v's bias correction).
    pub coefficients: &'a MomentCoefficients,
    /// `1/(1-β1)`, rounded as the CPU rounds it.
    pub inv_one_minus_beta_1: f32,
    /// ε inside the square root.
    pub inside: bool,
    /// The paper's ratio `(v+ε)/(v_fresh+ε)` instead of the denominators'.
    pub variance: bool,
}

/// Queues [`fresh_variance_kernel`]: v_fresh updated in place, and a new
/// buffer of each chunk's largest ratio, returned.
fn queue_fresh_variance(
    client: &Client,
    chunks: &DeviceChunks,
    [m, m_last, v, fresh]: [&Handle; 4],
    f: &FreshVarianceConstants<'_>,
) -> Handle {
    let c = chunks.coefficients(client, f.coefficients, 0.0);
    let inv = f32_arg(client, &[f.inv_one_minus_beta_1]);
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
                f.inside,
                f.variance
            )
        );
    }
    partials
}

/// 1-bit LAMB's fresh variance (see `fresh_variance_kernel`), updated in
/// place; returns each segment's largest variance ratio, read to the host
/// (for the ratio's DeepSpeed blend, which takes host norms;
/// [`fresh_variance_update`] keeps them on the device).
pub fn fresh_variance(
    client: &Client,
    chunks: &DeviceChunks,
    buffers: [&Handle; 4],
    f: &FreshVarianceConstants<'_>,
) -> Vec<f32> {
    let mut ratios = vec![0.0f32; chunks.segments];
    if chunks.is_empty() {
        return ratios;
    }
    let partials = queue_fresh_variance(client, chunks, buffers, f);
    let read = host_reads::read_f32(client, partials);
    for (&(s, _, _), &r) in chunks.table.iter().zip(&read) {
        ratios[s] = ratios[s].max(r);
    }
    ratios
}

// Indices into the ratio kernel's constants.
const LR: usize = 0;
const R_MIN: usize = 1;
const R_MAX: usize = 2;
const THRESHOLD: usize = 3;

/// One cube per segment: the largest variance ratio over the segment's
/// chunks, clipped to within `r_threshold` of the last one (`scalars[p + s]`,
/// p segments) and then to `[r_min, r_max]`, kept there as the next
/// step's last one, and the rate `lr·r·c_avg` (`c_avg` at `scalars[s]`)
/// into `rates[s]`.
#[cube(launch_unchecked)]
fn variance_rate_kernel(
    partials: &[f32],
    first_chunk: &[u32],
    constants: &[f32],
    scalars: &mut [f32],
    rates: &mut [f32],
) {
    let mut shared = Shared::<[f32]>::new_slice(CUBE);
    let segment = segment_reduce(partials, first_chunk, &mut shared, 1usize, true);
    if UNIT_POS == 0 {
        let last = first_chunk.len() - 1 + segment;
        let prev = scalars[last];
        let step = constants[THRESHOLD];
        let mut r = f32::min(
            f32::max(shared[0], (1.0 - step) * prev),
            (1.0 + step) * prev,
        );
        r = f32::min(f32::max(r, constants[R_MIN]), constants[R_MAX]);
        scalars[last] = r;
        rates[segment] = constants[LR] * r * scalars[segment];
    }
}

/// How 1-bit LAMB turns a segment's largest variance ratio into its rate.
#[derive(Debug, Clone, Copy)]
pub struct VarianceRatioRule {
    /// The step's learning rate.
    pub lr: f32,
    /// The ratio's lower clip.
    pub r_min: f32,
    /// The ratio's upper clip.
    pub r_max: f32,
    /// The largest relative change of the ratio per step.
    pub r_threshold: f32,
}

/// 1-bit LAMB's compression-stage update with its rates computed on the
/// device: the fresh variance (v_fresh updated in place), each segment's
/// largest ratio clipped by `rule` against the last ratio, which it
/// replaces, and the update `x -= lr·r·c_avg·u` with v frozen (with
/// `hold`, m zeroed and x kept where v is zero). `scalars` holds `c_avg`
/// then the last ratios, one f32 per segment each. Nothing is read back.
///
/// # Panics
/// If `scalars` holds fewer than two f32 per segment.
#[allow(clippy::too_many_arguments)]
pub fn fresh_variance_update(
    client: &Client,
    chunks: &DeviceChunks,
    [x, m, m_last, v, fresh]: [&Handle; 5],
    scalars: &Handle,
    f: &FreshVarianceConstants<'_>,
    rule: &VarianceRatioRule,
    hold: bool,
) {
    let p = chunks.segments;
    assert!(
        scalars.size_in_used() as usize >= 2 * p * size_of::<f32>(),
        "two scalars per segment"
    );
    if chunks.is_empty() {
        // No element: nothing moves (the last ratios stay).
        return;
    }
    let partials = queue_fresh_variance(client, chunks, [m, m_last, v, fresh], f);
    let constants = f32_arg(client, &[rule.lr, rule.r_min, rule.r_max, rule.r_threshold]);
    let rates = client.empty(p * size_of::<f32>());
    let ((count, dim), first_chunk) = chunks.segment_launch(client);
    // SAFETY: `partials` holds one f32 per chunk, `first_chunk` one u32
    // per segment plus one (each at most the chunk count), `scalars` two
    // f32 per segment (checked above), `rates` one; one cube per segment,
    // and cubes past the last segment terminate.
    unsafe {
        variance_rate_kernel::launch_unchecked(
            client,
            count,
            dim,
            buffer(&partials, chunks.count()),
            first_chunk,
            constants,
            buffer(scalars, 2 * p),
            buffer(&rates, p),
        );
    }
    // SAFETY: `rates` holds one f32 per segment, what the update reads.
    let rates = unsafe { buffer(&rates, p) };
    super::uncompressed::rate_update_arg(
        client,
        chunks,
        [x, m, v],
        f.coefficients,
        rates,
        f.inside,
        hold,
    );
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    momentum_kernel::MomentumKernel(b(), b(), table(), b()),
    scaled_momentum_kernel::ScaledMomentumKernel(b(), b(), table(), b(), b()),
    unscale_masked_kernel::UnscaleMaskedKernel(b(), b(), table(), b(), true),
    unscale_masked_kernel::UnscaleMaskedKernel(b(), b(), table(), b(), false),
    fresh_variance_kernel::FreshVarianceKernel(
        b(),
        b(),
        b(),
        b(),
        table(),
        b(),
        b(),
        b(),
        true,
        true
    ),
    fresh_variance_kernel::FreshVarianceKernel(
        b(),
        b(),
        b(),
        b(),
        table(),
        b(),
        b(),
        b(),
        false,
        false
    ),
    variance_rate_kernel::VarianceRateKernel(b(), b(), b(), b(), b()),
];
