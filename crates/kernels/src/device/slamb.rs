//! SLAMB's per-element work on the device (terse-optim's `Slamb::step` is
//! the reference): the moment update, the freshness from the step's
//! selection bits ([`super::select`]), the per-chunk norms split by
//! selection, and the update with each element's rate and trust ratio
//! blended by its freshness.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::optim::{
    BETA_1, BETA_2, CUBE, DeviceChunks, MomentCoefficients, ONE_MINUS_BETA_1, ONE_MINUS_BETA_2,
    direction,
};

#[cube]
fn selected(selection: &[u32], i: usize) -> bool {
    (selection[i / 32] >> u32::cast_from(i % 32)) & 1u32 == 1u32
}

/// `m = β1·m + (1-β1)·g`, `v = β2·v + (1-β2)·g²`.
#[cube(launch_unchecked)]
fn moments_kernel(
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    starts: &[u32],
    ends: &[u32],
    c: &[f32],
) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + UNIT_POS as usize;
    while i < end {
        let gi = g[i];
        m[i] = c[BETA_1] * m[i] + c[ONE_MINUS_BETA_1] * gi;
        v[i] = c[BETA_2] * v[i] + c[ONE_MINUS_BETA_2] * gi * gi;
        i += CUBE;
    }
}

/// `f = 1` where selected, `β3·f` elsewhere; one unit per element.
#[cube(launch_unchecked)]
fn freshness_kernel(f: &mut [f32], selection: &[u32], beta_3: &[f32]) {
    let i = ABSOLUTE_POS;
    if i >= f.len() {
        terminate!();
    }
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
    selection: &[u32],
    starts: &[u32],
    ends: &[u32],
    segment_of: &[u32],
    weight_decay: &[f32],
    c: &[f32],
    partials: &mut [f32],
    #[comptime] inside: bool,
) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let unit = UNIT_POS as usize;
    let wd = weight_decay[usize::cast_from(segment_of[chunk])];
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + unit;
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
    let mut shared = Shared::<[f32]>::new_slice(6 * CUBE);
    #[unroll]
    for k in 0..6usize {
        shared[k * CUBE + unit] = sums[k];
    }
    sync_cube();
    #[unroll]
    for s in 1..9usize {
        let stride = comptime!(CUBE >> s);
        if unit < stride {
            #[unroll]
            for k in 0..6usize {
                let a = shared[k * CUBE + unit] + shared[k * CUBE + unit + stride];
                shared[k * CUBE + unit] = a;
            }
        }
        sync_cube();
    }
    if unit < 6 {
        partials[6 * chunk + unit] = shared[unit * CUBE];
    }
}

/// `x -= (lr·f + lr_stale·(1-f)) · (φ_max·f + φ_min·(1-f)) · u`, with the
/// segment's two ratios; `rates` holds `[lr, lr_stale]`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn apply_kernel(
    x: &mut [f32],
    m: &[f32],
    v: &[f32],
    f: &[f32],
    starts: &[u32],
    ends: &[u32],
    segment_of: &[u32],
    weight_decay: &[f32],
    c: &[f32],
    phi: &[f32],
    rates: &[f32],
    #[comptime] inside: bool,
) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let s = usize::cast_from(segment_of[chunk]);
    let wd = weight_decay[s];
    let (phi_max, phi_min) = (phi[2 * s], phi[2 * s + 1]);
    let (lr, stale_lr) = (rates[0], rates[1]);
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + UNIT_POS as usize;
    while i < end {
        let xi = x[i];
        let fi = f[i];
        let u = direction(m[i], v[i], xi, wd, c, inside);
        let p = phi_max * fi + phi_min * (1.0 - fi);
        let eta = lr * fi + stale_lr * (1.0 - fi);
        x[i] = xi - eta * p * u;
        i += CUBE;
    }
}

/// A segment's norms split by selection, summed in f64 from the chunks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SplitNorms {
    /// `Σx²` over the selected elements.
    pub x_selected: f64,
    /// `Σu²` over the selected elements.
    pub u_selected: f64,
    /// `Σx²` over the others.
    pub x_rest: f64,
    /// `Σu²` over the others.
    pub u_rest: f64,
    /// Number of selected elements.
    pub selected: usize,
    /// Number of the others.
    pub rest: usize,
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
    let (count, dim) = chunks.launch(client);
    let [starts, ends, _, _] = chunks.args();
    // SAFETY: the flat buffers hold `chunks.len()` f32 (`DeviceChunks::flat`);
    // the chunk table addresses only elements below that.
    unsafe {
        moments_kernel::launch_unchecked(
            client,
            count,
            dim,
            chunks.flat(m),
            chunks.flat(v),
            chunks.flat(g),
            starts,
            ends,
            c,
        );
    }
}

/// The freshness update from `selection` (one word per 32 elements).
pub fn freshness(client: &Client, f: &Handle, selection: &Handle, len: usize, beta_3: f32) {
    if len == 0 {
        return;
    }
    let b = client.create_from_slice(f32::as_bytes(&[beta_3]));
    let (count, dim) = super::onebit::launch_dims(client, len);
    // SAFETY: `f` holds `len` f32, `selection` one word per 32 of them.
    unsafe {
        freshness_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(f.clone(), len),
            BufferArg::from_raw_parts(selection.clone(), len.div_ceil(32)),
            BufferArg::from_raw_parts(b, 1),
        );
    }
}

/// Each segment's norms split by `selection`.
#[allow(clippy::too_many_arguments)]
pub fn split_norms(
    client: &Client,
    chunks: &DeviceChunks,
    x: &Handle,
    m: &Handle,
    v: &Handle,
    selection: &Handle,
    coefficients: &MomentCoefficients,
    inside: bool,
) -> Vec<SplitNorms> {
    let mut norms = vec![SplitNorms::default(); chunks.segment_count()];
    if chunks.is_empty() {
        return norms;
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    let partials = client.empty(6 * chunks.count() * size_of::<f32>());
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: as in `moments`; `partials` holds six f32 per chunk.
    unsafe {
        norms_kernel::launch_unchecked(
            client,
            count,
            dim,
            chunks.flat(x),
            chunks.flat(m),
            chunks.flat(v),
            BufferArg::from_raw_parts(selection.clone(), chunks.len().div_ceil(32)),
            starts,
            ends,
            segment_of,
            weight_decay,
            c,
            BufferArg::from_raw_parts(partials.clone(), 6 * chunks.count()),
            inside,
        );
    }
    let read = client.read_one_unchecked(partials);
    for (s, p) in chunks
        .segment_of_chunks()
        .zip(f32::from_bytes(&read).chunks_exact(6))
    {
        let n = &mut norms[s];
        n.x_selected += f64::from(p[0]);
        n.u_selected += f64::from(p[1]);
        n.x_rest += f64::from(p[2]);
        n.u_rest += f64::from(p[3]);
        n.selected += p[4] as usize;
        n.rest += p[5] as usize;
    }
    norms
}

/// The update: `phi` holds `[φ_max, φ_min]` per segment.
#[allow(clippy::too_many_arguments)]
pub fn apply(
    client: &Client,
    chunks: &DeviceChunks,
    x: &Handle,
    m: &Handle,
    v: &Handle,
    f: &Handle,
    coefficients: &MomentCoefficients,
    phi: &[f32],
    lr: f32,
    stale_lr: f32,
    inside: bool,
) {
    assert_eq!(
        phi.len(),
        2 * chunks.segment_count(),
        "two ratios per segment"
    );
    if chunks.is_empty() {
        return;
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    let phi = client.create_from_slice(f32::as_bytes(phi));
    let rates = client.create_from_slice(f32::as_bytes(&[lr, stale_lr]));
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: as in `moments`; two ratios per segment, two rates.
    unsafe {
        apply_kernel::launch_unchecked(
            client,
            count,
            dim,
            chunks.flat(x),
            chunks.flat(m),
            chunks.flat(v),
            chunks.flat(f),
            starts,
            ends,
            segment_of,
            weight_decay,
            c,
            BufferArg::from_raw_parts(phi, 2 * chunks.segment_count()),
            BufferArg::from_raw_parts(rates, 2),
            inside,
        );
    }
}
