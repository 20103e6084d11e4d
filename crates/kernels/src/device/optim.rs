//! The uncompressed optimizers' updates on the device: Adam/AdamW, LAMB's
//! two passes and SGD, plus the sum of squares that gradient clipping and
//! LAMB's pre-normalisation need. terse-optim's CPU loops are their
//! reference (the same per-element formulas in the same order; a GPU
//! compiler may contract a multiply-add, so results agree to f32 rounding,
//! not bit for bit).
//!
//! Every launch walks the flat buffer in [`DeviceChunks`]: runs of at most
//! [`DEVICE_CHUNK`] elements that never cross a parameter segment, one cube
//! each. A cube therefore knows its segment (weight decay, LAMB's trust
//! ratio) without a search, and the per-chunk partial sums of a reduction
//! can be combined per segment on the host in f64, as the CPU combines its
//! chunks' partials.
//!
//! Per-step scalars (β's, bias corrections, ε, the learning rate) travel as
//! a small f32 buffer uploaded per step: a few bytes, and one compiled
//! kernel for every value.

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Elements per chunk: 256 units × 16 elements.
pub const DEVICE_CHUNK: usize = 4096;

/// Units per cube.
pub(crate) const CUBE: usize = 256;

// Indices into the coefficient buffer of the moment kernels.
pub(crate) const BETA_1: usize = 0;
pub(crate) const BETA_2: usize = 1;
pub(crate) const ONE_MINUS_BETA_1: usize = 2;
pub(crate) const ONE_MINUS_BETA_2: usize = 3;
const INV_BIAS_1: usize = 4;
const INV_BIAS_2: usize = 5;
const EPS: usize = 6;
const GRAD_SCALE: usize = 7;
const LR: usize = 8;
const COEFFICIENTS: usize = 9;

/// Adam's per-step constants, as f32 (terse-optim's `Moments`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentCoefficients {
    /// β1.
    pub beta_1: f32,
    /// β2.
    pub beta_2: f32,
    /// 1 − β1, computed in f64 and rounded once.
    pub one_minus_beta_1: f32,
    /// 1 − β2, the same.
    pub one_minus_beta_2: f32,
    /// 1 / (1 − β1^t), or 1 without bias correction.
    pub inv_bias_1: f32,
    /// 1 / (1 − β2^t) (of the freeze step for a frozen variance), or 1.
    pub inv_bias_2: f32,
    /// ε.
    pub eps: f32,
    /// Multiplies the gradient before it enters the moments.
    pub grad_scale: f32,
}

impl MomentCoefficients {
    fn buffer(&self, lr: f32) -> [f32; COEFFICIENTS] {
        let mut c = [0.0; COEFFICIENTS];
        c[BETA_1] = self.beta_1;
        c[BETA_2] = self.beta_2;
        c[ONE_MINUS_BETA_1] = self.one_minus_beta_1;
        c[ONE_MINUS_BETA_2] = self.one_minus_beta_2;
        c[INV_BIAS_1] = self.inv_bias_1;
        c[INV_BIAS_2] = self.inv_bias_2;
        c[EPS] = self.eps;
        c[GRAD_SCALE] = self.grad_scale;
        c[LR] = lr;
        c
    }
}

/// A flat buffer's segments cut into chunks of at most [`DEVICE_CHUNK`]
/// elements, uploaded once per layout, with each segment's weight decay.
#[derive(Clone)]
pub struct DeviceChunks {
    starts: Handle,
    ends: Handle,
    segment_of: Handle,
    weight_decay: Handle,
    /// Per chunk: (segment, start, end), kept on the host to combine partials.
    table: Vec<(usize, usize, usize)>,
    segments: usize,
    len: usize,
}

impl DeviceChunks {
    /// Chunks for consecutive segments of `lens` elements, segment `s`
    /// decaying its weights by `weight_decay[s]`.
    ///
    /// # Panics
    /// If the lengths and decays differ in number, or the buffer has 2^32
    /// elements or more (indices are u32 on the device).
    pub fn new(client: &Client, lens: &[usize], weight_decay: &[f32]) -> Self {
        assert_eq!(
            lens.len(),
            weight_decay.len(),
            "one weight decay per segment"
        );
        let len: usize = lens.iter().sum();
        assert!(
            u32::try_from(len).is_ok(),
            "{len} elements: indices are u32"
        );
        let mut table = Vec::new();
        let mut offset = 0;
        for (s, &n) in lens.iter().enumerate() {
            let mut start = offset;
            while start < offset + n {
                let end = (start + DEVICE_CHUNK).min(offset + n);
                table.push((s, start, end));
                start = end;
            }
            offset += n;
        }
        let column = |f: fn(&(usize, usize, usize)) -> usize| -> Vec<u32> {
            // Padded to one entry: a zero-sized buffer cannot be bound.
            let mut v: Vec<u32> = table.iter().map(|e| f(e) as u32).collect();
            v.push(0);
            v
        };
        let mut decays = weight_decay.to_vec();
        decays.push(0.0);
        Self {
            starts: client.create_from_slice(u32::as_bytes(&column(|e| e.1))),
            ends: client.create_from_slice(u32::as_bytes(&column(|e| e.2))),
            segment_of: client.create_from_slice(u32::as_bytes(&column(|e| e.0))),
            weight_decay: client.create_from_slice(f32::as_bytes(&decays)),
            table,
            segments: lens.len(),
            len,
        }
    }

    /// Number of chunks.
    pub fn count(&self) -> usize {
        self.table.len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sums per-chunk partials per segment in f64, in chunk order.
    pub fn per_segment(&self, partials: &[f32]) -> Vec<f64> {
        let mut sums = vec![0.0f64; self.segments];
        for (&(s, _, _), &p) in self.table.iter().zip(partials) {
            sums[s] += f64::from(p);
        }
        sums
    }

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.segments
    }

    /// Each chunk's segment, in chunk order.
    pub(crate) fn segment_of_chunks(&self) -> impl Iterator<Item = usize> + '_ {
        self.table.iter().map(|&(s, _, _)| s)
    }

    /// The moment coefficients with rate `lr` as a kernel argument.
    pub(crate) fn coefficients(
        &self,
        client: &Client,
        coefficients: &MomentCoefficients,
        lr: f32,
    ) -> BufferArg {
        let (c, len) = f32_buffer(client, &coefficients.buffer(lr));
        // SAFETY: the buffer was created with `len` f32.
        unsafe { BufferArg::from_raw_parts(c, len) }
    }

    pub(crate) fn launch(&self, client: &Client) -> (CubeCount, CubeDim) {
        let dim = CubeDim::new_1d(CUBE as u32);
        (
            cubecl::calculate_cube_count_elemwise(client, self.count() * CUBE, dim),
            dim,
        )
    }

    pub(crate) fn args(&self) -> [BufferArg; 4] {
        let n = self.count() + 1;
        // SAFETY (of the launches using them): each table buffer was
        // created with `count() + 1` entries, the decays with one per
        // segment plus one.
        unsafe {
            [
                BufferArg::from_raw_parts(self.starts.clone(), n),
                BufferArg::from_raw_parts(self.ends.clone(), n),
                BufferArg::from_raw_parts(self.segment_of.clone(), n),
                BufferArg::from_raw_parts(self.weight_decay.clone(), self.segments + 1),
            ]
        }
    }
}

impl std::fmt::Debug for DeviceChunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceChunks({} elements, {} segments, {} chunks)",
            self.len,
            self.segments,
            self.count()
        )
    }
}

/// Adam's direction `m̂/(sqrt(v̂)+ε) + wd·x` (or `m̂/sqrt(v̂+ε)` inside).
#[cube]
pub(crate) fn direction(
    m: f32,
    v: f32,
    x: f32,
    wd: f32,
    c: &[f32],
    #[comptime] inside: bool,
) -> f32 {
    let m_hat = m * c[INV_BIAS_1];
    let v_hat = v * c[INV_BIAS_2];
    let mut denom = f32::sqrt(v_hat) + c[EPS];
    if inside {
        denom = f32::sqrt(v_hat + c[EPS]);
    }
    m_hat / denom + wd * x
}

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

/// LAMB's second pass: `x -= lr_s · u` with the segment's scaled rate.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn lamb_apply_kernel(
    x: &mut [f32],
    m: &[f32],
    v: &[f32],
    starts: &[u32],
    ends: &[u32],
    segment_of: &[u32],
    weight_decay: &[f32],
    c: &[f32],
    segment_lr: &[f32],
    #[comptime] inside: bool,
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
        let xi = x[i];
        x[i] = xi - lr * direction(m[i], v[i], xi, wd, c, inside);
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

/// `m = β1·m + (1-β1)·g` (the compression stage's local momentum).
#[cube(launch_unchecked)]
fn momentum_kernel(m: &mut [f32], g: &[f32], starts: &[u32], ends: &[u32], c: &[f32]) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + UNIT_POS as usize;
    while i < end {
        m[i] = c[BETA_1] * m[i] + c[ONE_MINUS_BETA_1] * g[i];
        i += CUBE;
    }
}

/// The compression stage's update with v frozen, one rate per segment:
/// `x -= lr_s·(m̂/denom(v̂) + wd·x)`, except where the frozen v is exactly
/// zero (a coordinate no warmup step reached): there m is zeroed and x
/// stays (terse-optim's `mask_momentum` and `FrozenUpdate::apply`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn frozen_apply_kernel(
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
        if vi > 0.0 {
            let xi = x[i];
            x[i] = xi - lr * direction(m[i], vi, xi, wd, c, inside);
        } else {
            m[i] = 0.0;
        }
        i += CUBE;
    }
}

/// `y = x`.
#[cube(launch_unchecked)]
fn copy_kernel(x: &[f32], y: &mut [f32]) {
    let i = ABSOLUTE_POS;
    if i >= y.len() {
        terminate!();
    }
    y[i] = x[i];
}

/// 1-bit LAMB's scaled momentum: `m = (β1·m + (1-β1)·g)·k_s`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn scaled_momentum_kernel(
    m: &mut [f32],
    g: &[f32],
    starts: &[u32],
    ends: &[u32],
    segment_of: &[u32],
    c: &[f32],
    k: &[f32],
) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let ks = k[usize::cast_from(segment_of[chunk])];
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + UNIT_POS as usize;
    while i < end {
        m[i] = (c[BETA_1] * m[i] + c[ONE_MINUS_BETA_1] * g[i]) * ks;
        i += CUBE;
    }
}

/// The synchronised momentum masked where the frozen v is zero, then
/// unscaled: `m = v == 0 ? 0 : m / k_s`.
#[cube(launch_unchecked)]
fn unscale_masked_kernel(
    m: &mut [f32],
    v: &[f32],
    starts: &[u32],
    ends: &[u32],
    segment_of: &[u32],
    k: &[f32],
) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let ks = k[usize::cast_from(segment_of[chunk])];
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + UNIT_POS as usize;
    while i < end {
        if v[i] == 0.0 {
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
    starts: &[u32],
    ends: &[u32],
    c: &[f32],
    inv_one_minus_beta_1: &[f32],
    partials: &mut [f32],
    #[comptime] inside: bool,
    #[comptime] variance: bool,
) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let unit = UNIT_POS as usize;
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + unit;
    let mut r = 0.0f32;
    while i < end {
        let g = (m[i] - c[BETA_1] * m_last[i]) * inv_one_minus_beta_1[0];
        let f = c[BETA_2] * fresh[i] + c[ONE_MINUS_BETA_2] * g * g;
        fresh[i] = f;
        let vi = v[i];
        let mut ratio = (vi + c[EPS]) / (f + c[EPS]);
        if !variance {
            ratio = denominator(vi, c, inside) / denominator(f, c, inside);
        }
        r = f32::max(r, ratio);
        i += CUBE;
    }
    let mut shared = Shared::<[f32]>::new_slice(CUBE);
    shared[unit] = r;
    sync_cube();
    #[unroll]
    for k in 1..9usize {
        let stride = comptime!(CUBE >> k);
        if unit < stride {
            let a = f32::max(shared[unit], shared[unit + stride]);
            shared[unit] = a;
        }
        sync_cube();
    }
    if unit == 0 {
        partials[chunk] = shared[0];
    }
}

/// Adam's denominator for a variance `v` (bias-corrected here).
#[cube]
fn denominator(v: f32, c: &[f32], #[comptime] inside: bool) -> f32 {
    let v_hat = v * c[INV_BIAS_2];
    let mut d = f32::sqrt(v_hat) + c[EPS];
    if inside {
        d = f32::sqrt(v_hat + c[EPS]);
    }
    d
}

/// One cube per chunk: the chunk's `Σx²` (or `Σ|x|`) into `partials[chunk]`.
#[cube(launch_unchecked)]
fn chunk_sum_kernel(
    x: &[f32],
    starts: &[u32],
    ends: &[u32],
    partials: &mut [f32],
    #[comptime] absolute: bool,
) {
    let chunk = CUBE_POS;
    if chunk + 1 >= starts.len() {
        terminate!();
    }
    let unit = UNIT_POS as usize;
    let end = usize::cast_from(ends[chunk]);
    let mut i = usize::cast_from(starts[chunk]) + unit;
    let mut acc = 0.0f32;
    while i < end {
        let xi = x[i];
        if absolute {
            acc += f32::abs(xi);
        } else {
            acc += xi * xi;
        }
        i += CUBE;
    }
    let mut shared = Shared::<[f32]>::new_slice(CUBE);
    shared[unit] = acc;
    sync_cube();
    #[unroll]
    for k in 1..9usize {
        let stride = comptime!(CUBE >> k);
        if unit < stride {
            let a = shared[unit] + shared[unit + stride];
            shared[unit] = a;
        }
        sync_cube();
    }
    if unit == 0 {
        partials[chunk] = shared[0];
    }
}

/// `x *= factor[0]`, one unit per element.
#[cube(launch_unchecked)]
fn scale_kernel(x: &mut [f32], factor: &[f32]) {
    let i = ABSOLUTE_POS;
    if i >= x.len() {
        terminate!();
    }
    x[i] *= factor[0];
}

fn f32_buffer(client: &Client, values: &[f32]) -> (Handle, usize) {
    (
        client.create_from_slice(f32::as_bytes(values)),
        values.len(),
    )
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
    let n = chunks.len();
    let (c, c_len) = f32_buffer(client, &coefficients.buffer(lr));
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: the four flat buffers hold `n` f32 (the caller's contract,
    // checked by terse-optim against its layout); the chunks address only
    // elements below `n`; the table buffers are sized by `args`.
    unsafe {
        adam_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(x.clone(), n),
            BufferArg::from_raw_parts(m.clone(), n),
            BufferArg::from_raw_parts(v.clone(), n),
            BufferArg::from_raw_parts(g.clone(), n),
            starts,
            ends,
            segment_of,
            weight_decay,
            BufferArg::from_raw_parts(c, c_len),
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
    let n = chunks.len();
    let (c, c_len) = f32_buffer(client, &coefficients.buffer(0.0));
    let partials = client.empty(2 * chunks.count() * size_of::<f32>());
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: as in `adam_step`; `partials` holds two f32 per chunk.
    unsafe {
        lamb_norms_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(x.clone(), n),
            BufferArg::from_raw_parts(m.clone(), n),
            BufferArg::from_raw_parts(v.clone(), n),
            BufferArg::from_raw_parts(g.clone(), n),
            starts,
            ends,
            segment_of,
            weight_decay,
            BufferArg::from_raw_parts(c, c_len),
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
    assert_eq!(segment_lr.len(), chunks.segments, "one rate per segment");
    if chunks.is_empty() {
        return;
    }
    let n = chunks.len();
    let (c, c_len) = f32_buffer(client, &coefficients.buffer(0.0));
    let (rates, rates_len) = f32_buffer(client, segment_lr);
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: as in `adam_step`; one rate per segment.
    unsafe {
        lamb_apply_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(x.clone(), n),
            BufferArg::from_raw_parts(m.clone(), n),
            BufferArg::from_raw_parts(v.clone(), n),
            starts,
            ends,
            segment_of,
            weight_decay,
            BufferArg::from_raw_parts(c, c_len),
            BufferArg::from_raw_parts(rates, rates_len),
            inside,
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
    let n = chunks.len();
    let (c, c_len) = f32_buffer(client, &[mu, lr]);
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: as in `adam_step`.
    unsafe {
        sgd_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(x.clone(), n),
            BufferArg::from_raw_parts(m.clone(), n),
            BufferArg::from_raw_parts(g.clone(), n),
            starts,
            ends,
            segment_of,
            weight_decay,
            BufferArg::from_raw_parts(c, c_len),
            nesterov,
        );
    }
}

/// `Σx²` per segment of `chunks` (f32 per chunk, combined in f64).
pub fn sum_of_squares(client: &Client, chunks: &DeviceChunks, x: &Handle) -> Vec<f64> {
    chunk_sums(client, chunks, x, false)
}

/// `Σ|x|` per segment of `chunks` (f32 per chunk, combined in f64).
pub fn sum_of_abs(client: &Client, chunks: &DeviceChunks, x: &Handle) -> Vec<f64> {
    chunk_sums(client, chunks, x, true)
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
    let n = chunks.len();
    let (c, c_len) = f32_buffer(client, &coefficients.buffer(0.0));
    let (count, dim) = chunks.launch(client);
    let [starts, ends, _, _] = chunks.args();
    // SAFETY: as in `adam_step`.
    unsafe {
        momentum_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(m.clone(), n),
            BufferArg::from_raw_parts(g.clone(), n),
            starts,
            ends,
            BufferArg::from_raw_parts(c, c_len),
        );
    }
}

/// The compression stage's update with v frozen (see `frozen_apply_kernel`):
/// `x` and `m` in place, one rate per segment.
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
) {
    assert_eq!(segment_lr.len(), chunks.segments, "one rate per segment");
    if chunks.is_empty() {
        return;
    }
    let n = chunks.len();
    let (c, c_len) = f32_buffer(client, &coefficients.buffer(0.0));
    let (rates, rates_len) = f32_buffer(client, segment_lr);
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, weight_decay] = chunks.args();
    // SAFETY: as in `adam_step`; one rate per segment.
    unsafe {
        frozen_apply_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(x.clone(), n),
            BufferArg::from_raw_parts(m.clone(), n),
            BufferArg::from_raw_parts(v.clone(), n),
            starts,
            ends,
            segment_of,
            weight_decay,
            BufferArg::from_raw_parts(c, c_len),
            BufferArg::from_raw_parts(rates, rates_len),
            inside,
        );
    }
}

/// `y = x` over `len` elements.
pub fn copy(client: &Client, x: &Handle, y: &Handle, len: usize) {
    if len == 0 {
        return;
    }
    let (count, dim) = super::onebit::launch_dims(client, len);
    // SAFETY: both hold `len` f32 (the caller's contract).
    unsafe {
        copy_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(x.clone(), len),
            BufferArg::from_raw_parts(y.clone(), len),
        );
    }
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
    let n = chunks.len();
    let (c, c_len) = f32_buffer(client, &coefficients.buffer(0.0));
    let (k, k_len) = f32_buffer(client, k);
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, _] = chunks.args();
    // SAFETY: as in `adam_step`; one factor per segment.
    unsafe {
        scaled_momentum_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(m.clone(), n),
            BufferArg::from_raw_parts(g.clone(), n),
            starts,
            ends,
            segment_of,
            BufferArg::from_raw_parts(c, c_len),
            BufferArg::from_raw_parts(k, k_len),
        );
    }
}

/// `m = v == 0 ? 0 : m / k_s`, one factor per segment.
pub fn unscale_masked(client: &Client, chunks: &DeviceChunks, m: &Handle, v: &Handle, k: &[f32]) {
    assert_eq!(k.len(), chunks.segments, "one factor per segment");
    if chunks.is_empty() {
        return;
    }
    let n = chunks.len();
    let (k, k_len) = f32_buffer(client, k);
    let (count, dim) = chunks.launch(client);
    let [starts, ends, segment_of, _] = chunks.args();
    // SAFETY: as in `adam_step`; one factor per segment.
    unsafe {
        unscale_masked_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(m.clone(), n),
            BufferArg::from_raw_parts(v.clone(), n),
            starts,
            ends,
            segment_of,
            BufferArg::from_raw_parts(k, k_len),
        );
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
    let n = chunks.len();
    let (c, c_len) = f32_buffer(client, &coefficients.buffer(0.0));
    let (inv, inv_len) = f32_buffer(client, &[inv_one_minus_beta_1]);
    let partials = client.empty(chunks.count() * size_of::<f32>());
    let (count, dim) = chunks.launch(client);
    let [starts, ends, _, _] = chunks.args();
    // SAFETY: as in `adam_step`; `partials` holds one f32 per chunk.
    unsafe {
        fresh_variance_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(m.clone(), n),
            BufferArg::from_raw_parts(m_last.clone(), n),
            BufferArg::from_raw_parts(v.clone(), n),
            BufferArg::from_raw_parts(fresh.clone(), n),
            starts,
            ends,
            BufferArg::from_raw_parts(c, c_len),
            BufferArg::from_raw_parts(inv, inv_len),
            BufferArg::from_raw_parts(partials.clone(), chunks.count()),
            inside,
            variance,
        );
    }
    let read = client.read_one_unchecked(partials);
    for (&(s, _, _), &r) in chunks.table.iter().zip(f32::from_bytes(&read)) {
        ratios[s] = ratios[s].max(r);
    }
    ratios
}

fn chunk_sums(client: &Client, chunks: &DeviceChunks, x: &Handle, absolute: bool) -> Vec<f64> {
    if chunks.is_empty() {
        return vec![0.0; chunks.segments];
    }
    let n = chunks.len();
    let partials = client.empty(chunks.count() * size_of::<f32>());
    let (count, dim) = chunks.launch(client);
    let [starts, ends, _, _] = chunks.args();
    // SAFETY: as in `adam_step`; `partials` holds one f32 per chunk.
    unsafe {
        chunk_sum_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(x.clone(), n),
            starts,
            ends,
            BufferArg::from_raw_parts(partials.clone(), chunks.count()),
            absolute,
        );
    }
    let read = client.read_one_unchecked(partials);
    chunks.per_segment(f32::from_bytes(&read))
}

/// `x *= factor` over `len` elements.
pub fn scale(client: &Client, x: &Handle, len: usize, factor: f32) {
    if len == 0 {
        return;
    }
    let (f, f_len) = f32_buffer(client, &[factor]);
    let (count, dim) = super::onebit::launch_dims(client, len);
    // SAFETY: `x` holds `len` f32 (the caller's contract).
    unsafe {
        scale_kernel::launch_unchecked(
            client,
            count,
            dim,
            BufferArg::from_raw_parts(x.clone(), len),
            BufferArg::from_raw_parts(f, f_len),
        );
    }
}
