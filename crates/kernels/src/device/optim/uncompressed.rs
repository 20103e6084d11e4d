//! The uncompressed optimizers' updates: Adam/AdamW in one pass, LAMB's
//! two passes (moments with the chunks' partial norms, then the update
//! with each segment's trust-scaled rate) and momentum SGD.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::chunks::*;

/// One cube per chunk: moments, direction and parameter in one pass.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adam_kernel(
    x: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    starts: &[u32],
    ends: &[u32],
    segment_of: &[u32],
    weight_decay: &[f32],
    c: &[f32],
    #[comptime] inside: bool,
) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let wd = weight_decay[usize::cast_from(segment_of[chunk])];
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + UNIT_POS as usize;
    while i < end {
        let gi = g[i] * c[GRAD_SCALE];
        let mi = c[BETA_1] * m[i] + c[ONE_MINUS_BETA_1] * gi;
        let vi = c[BETA_2] * v[i] + c[ONE_MINUS_BETA_2] * gi * gi;
        m[i] = mi;
        v[i] = vi;
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
fn lamb_norms_kernel(
    x: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
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
    let mut xx = 0.0f32;
    let mut uu = 0.0f32;
    while i < end {
        let gi = g[i] * c[GRAD_SCALE];
        let mi = c[BETA_1] * m[i] + c[ONE_MINUS_BETA_1] * gi;
        let vi = c[BETA_2] * v[i] + c[ONE_MINUS_BETA_2] * gi * gi;
        m[i] = mi;
        v[i] = vi;
        let xi = x[i];
        let u = direction(mi, vi, xi, wd, c, inside);
        xx += xi * xi;
        uu += u * u;
        i += CUBE;
    }
    let mut shared_x = Shared::<[f32]>::new_slice(CUBE);
    let mut shared_u = Shared::<[f32]>::new_slice(CUBE);
    shared_x[unit] = xx;
    shared_u[unit] = uu;
    sync_cube();
    #[unroll]
    for k in 1..9usize {
        let stride = comptime!(CUBE >> k);
        if unit < stride {
            let a = shared_x[unit] + shared_x[unit + stride];
            shared_x[unit] = a;
            let b = shared_u[unit] + shared_u[unit + stride];
            shared_u[unit] = b;
        }
        sync_cube();
    }
    if unit == 0 {
        partials[2 * chunk] = shared_x[0];
        partials[2 * chunk + 1] = shared_u[0];
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
    starts: &[u32],
    ends: &[u32],
    segment_of: &[u32],
    weight_decay: &[f32],
    c: &[f32],
    segment_lr: &[f32],
    #[comptime] inside: bool,
    #[comptime] masked: bool,
) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let s = usize::cast_from(segment_of[chunk]);
    let wd = weight_decay[s];
    let lr = segment_lr[s];
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + UNIT_POS as usize;
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
#[allow(clippy::too_many_arguments)]
fn sgd_kernel(
    x: &mut [f32],
    m: &mut [f32],
    g: &[f32],
    starts: &[u32],
    ends: &[u32],
    segment_of: &[u32],
    weight_decay: &[f32],
    c: &[f32],
    #[comptime] nesterov: bool,
) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let wd = weight_decay[usize::cast_from(segment_of[chunk])];
    let (mu, lr) = (c[0], c[1]);
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + UNIT_POS as usize;
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
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: the flat buffers hold `chunks.len()` f32 (`DeviceChunks::flat`),
    // the table and coefficient buffers are sized by `args` and
    // `coefficients`; the chunks address only elements below `chunks.len()`.
    unsafe {
        adam_kernel::launch_unchecked(
            client,
            count,
            dim,
            chunks.flat(x),
            chunks.flat(m),
            chunks.flat(v),
            chunks.flat(g),
            starts,
            ends,
            segment_of,
            weight_decay,
            c,
            inside,
        );
    }
}

/// LAMB's first pass: updates `m` and `v` in place and returns, per
/// segment, `(Σx², Σu²)` summed in f64 from the chunks' f32 partials.
#[allow(clippy::too_many_arguments)]
pub fn lamb_norms(
    client: &Client,
    chunks: &DeviceChunks,
    x: &Handle,
    m: &Handle,
    v: &Handle,
    g: &Handle,
    coefficients: &MomentCoefficients,
    inside: bool,
) -> Vec<(f64, f64)> {
    if chunks.is_empty() {
        return vec![(0.0, 0.0); chunks.segments];
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    let partials = client.empty(2 * chunks.count() * size_of::<f32>());
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: as in `adam_step`; `partials` holds two f32 per chunk.
    unsafe {
        lamb_norms_kernel::launch_unchecked(
            client,
            count,
            dim,
            chunks.flat(x),
            chunks.flat(m),
            chunks.flat(v),
            chunks.flat(g),
            starts,
            ends,
            segment_of,
            weight_decay,
            c,
            BufferArg::from_raw_parts(partials.clone(), 2 * chunks.count()),
            inside,
        );
    }
    let read = client.read_one_unchecked(partials);
    let partials = f32::from_bytes(&read);
    let xs: Vec<f32> = partials.iter().step_by(2).copied().collect();
    let us: Vec<f32> = partials.iter().skip(1).step_by(2).copied().collect();
    chunks
        .per_segment(&xs)
        .into_iter()
        .zip(chunks.per_segment(&us))
        .collect()
}

/// LAMB's second pass: `x -= segment_lr[s]·u` with `u` recomputed from the
/// moments the first pass left.
#[allow(clippy::too_many_arguments)]
pub fn lamb_apply(
    client: &Client,
    chunks: &DeviceChunks,
    x: &Handle,
    m: &Handle,
    v: &Handle,
    coefficients: &MomentCoefficients,
    segment_lr: &[f32],
    inside: bool,
) {
    rate_update(
        client,
        chunks,
        [x, m, v],
        coefficients,
        segment_lr,
        inside,
        false,
    );
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
    let c = chunks.coefficients(client, coefficients, 0.0);
    let (rates, rates_len) = f32_buffer(client, segment_lr);
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: as in `adam_step`; one rate per segment.
    unsafe {
        rate_update_kernel::launch_unchecked(
            client,
            count,
            dim,
            chunks.flat(x),
            chunks.flat(m),
            chunks.flat(v),
            starts,
            ends,
            segment_of,
            weight_decay,
            c,
            BufferArg::from_raw_parts(rates, rates_len),
            inside,
            masked,
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
    let (c, c_len) = f32_buffer(client, &[mu, lr]);
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: as in `adam_step`.
    unsafe {
        sgd_kernel::launch_unchecked(
            client,
            count,
            dim,
            chunks.flat(x),
            chunks.flat(m),
            chunks.flat(g),
            starts,
            ends,
            segment_of,
            weight_decay,
            BufferArg::from_raw_parts(c, c_len),
            nesterov,
        );
    }
}
