//! Whole-buffer utilities: a copy, a scale, and the per-segment sums of
//! squares and of absolute values (gradient clipping, LAMB's
//! pre-normalisation, the auto freeze's ‖v‖₁, 1-bit LAMB's momentum scales).

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::chunks::*;

/// `y = x`.
#[cube(launch_unchecked)]
fn copy_kernel(x: &[f32], y: &mut [f32]) {
    let i = ABSOLUTE_POS;
    if i >= y.len() {
        terminate!();
    }
    y[i] = x[i];
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

/// `Σx²` per segment of `chunks` (f32 per chunk, combined in f64).
pub fn sum_of_squares(client: &Client, chunks: &DeviceChunks, x: &Handle) -> Vec<f64> {
    chunk_sums(client, chunks, x, false)
}

/// `Σ|x|` per segment of `chunks` (f32 per chunk, combined in f64).
pub fn sum_of_abs(client: &Client, chunks: &DeviceChunks, x: &Handle) -> Vec<f64> {
    chunk_sums(client, chunks, x, true)
}

/// `y = x` over `len` elements.
pub fn copy(client: &Client, x: &Handle, y: &Handle, len: usize) {
    if len == 0 {
        return;
    }
    let (count, dim) = crate::device::onebit::launch_dims(client, len);
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

fn chunk_sums(client: &Client, chunks: &DeviceChunks, x: &Handle, absolute: bool) -> Vec<f64> {
    if chunks.is_empty() {
        return vec![0.0; chunks.segments];
    }
    let partials = client.empty(chunks.count() * size_of::<f32>());
    let (count, dim) = chunks.launch(client);
    let [starts, ends, _, _] = chunks.args();
    // SAFETY: as in `adam_step`; `partials` holds one f32 per chunk.
    unsafe {
        chunk_sum_kernel::launch_unchecked(
            client,
            count,
            dim,
            chunks.flat(x),
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
    let (count, dim) = crate::device::onebit::launch_dims(client, len);
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
