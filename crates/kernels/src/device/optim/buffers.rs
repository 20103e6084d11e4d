//! Whole-buffer utilities: a copy, a copy or sum into a range of a larger
//! buffer (each parameter's gradient into the flat gradient), a scale, and
//! the per-segment sums of squares and of absolute values (gradient
//! clipping, LAMB's pre-normalisation, the auto freeze's ‖v‖₁, 1-bit LAMB's
//! momentum scales).

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::chunks::*;
use crate::device::cube::{buffer, cube_reduce, launch_units, unit_item};
use crate::host_reads;

/// `y = x` over the first `len` elements (either buffer may be longer).
#[cube(launch_unchecked)]
fn copy_kernel(x: &[f32], y: &mut [f32], len: usize) {
    let i = unit_item(len);
    y[i] = x[i];
}

/// `y[offset + i] = x[i]` (`+=` when `accumulate`) for `i < len`. The
/// offset and count are runtime scalars: one compiled kernel for every
/// parameter (and `x` may be a view into a longer buffer).
#[cube(launch_unchecked)]
fn copy_or_add_at_kernel(
    x: &[f32],
    y: &mut [f32],
    offset: usize,
    len: usize,
    #[comptime] accumulate: bool,
) {
    let i = unit_item(len);
    if accumulate {
        y[offset + i] += x[i];
    } else {
        y[offset + i] = x[i];
    }
}

/// `y[offset..offset + len] = 0`.
#[cube(launch_unchecked)]
fn fill_zeros_at_kernel(y: &mut [f32], offset: usize, len: usize) {
    let i = unit_item(len);
    y[offset + i] = 0.0;
}

/// One cube per chunk: the chunk's `Σx²` (or `Σ|x|`) into `partials[chunk]`.
#[cube(launch_unchecked)]
fn chunk_sum_kernel(
    x: &[f32],
    table: &ChunkTable,
    partials: &mut [f32],
    #[comptime] absolute: bool,
) {
    let (mut i, end) = table.range();
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
    let sum = cube_reduce(acc, false);
    if UNIT_POS == 0 {
        partials[CUBE_POS] = sum;
    }
}

/// `x *= factor[0]` over the first `len` elements, one unit per element.
#[cube(launch_unchecked)]
fn scale_kernel(x: &mut [f32], factor: &[f32], len: usize) {
    let i = unit_item(len);
    x[i] *= factor[0];
}

/// `Σx²` per segment of `chunks` (f32 per chunk, combined in f64).
pub fn sum_of_squares(client: &Client, chunks: &DeviceChunks, x: &Handle) -> Vec<f64> {
    queue_sum_of_squares(client, chunks, x).read(client, chunks)
}

/// [`sum_of_squares`] queued on the device and read later
/// ([`QueuedSums::read`]) or totalled there ([`QueuedSums::total`]), so
/// that the host need not wait for the device where the sum is only
/// reported or clipped by (the trainer's gradient norm).
pub fn queue_sum_of_squares(client: &Client, chunks: &DeviceChunks, x: &Handle) -> QueuedSums {
    queue_chunk_sums(client, chunks, x, false)
}

/// `Σ|x|` per segment of `chunks` (f32 per chunk, combined in f64).
pub fn sum_of_abs(client: &Client, chunks: &DeviceChunks, x: &Handle) -> Vec<f64> {
    queue_chunk_sums(client, chunks, x, true).read(client, chunks)
}

/// Per-chunk partial sums queued on the device, not yet read.
#[derive(Debug)]
#[must_use = "the sums are only computed, not read"]
pub struct QueuedSums {
    /// One f32 per chunk (`None`: no chunks).
    pub(super) partials: Option<Handle>,
}

impl QueuedSums {
    /// The sums per segment of `chunks` (the table they were queued with),
    /// combined in f64 on the host: waits for the device.
    pub fn read(self, client: &Client, chunks: &DeviceChunks) -> Vec<f64> {
        match self.partials {
            Some(partials) => chunks.per_segment(&host_reads::read_f32(client, partials)),
            None => vec![0.0; chunks.segments],
        }
    }
}

/// `y = x` over `len` elements.
pub fn copy(client: &Client, x: &Handle, y: &Handle, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: both hold `len` f32 (the caller's contract).
    unsafe {
        launch_units!(
            client,
            len,
            copy_kernel(buffer(x, len), buffer(y, len), len)
        );
    }
}

/// A new buffer holding a copy of the first `len` f32 of `x`.
pub fn copied(client: &Client, x: &Handle, len: usize) -> Handle {
    let y = client.empty(len.max(1) * size_of::<f32>());
    copy(client, x, &y, len);
    y
}

/// `y[offset..offset + len] = x` (`+= x` when `accumulate`): `x` holds
/// `len` f32, `y` at least `offset + len`. Writes `y` in place, so a
/// parameter's gradient lands in the flat gradient without a new buffer.
///
/// # Panics
/// When `y_len < offset + len`.
pub fn write_at(
    client: &Client,
    x: &Handle,
    len: usize,
    y: &Handle,
    y_len: usize,
    offset: usize,
    accumulate: bool,
) {
    assert!(offset + len <= y_len, "a range past the buffer's end");
    if len == 0 {
        return;
    }
    // SAFETY: `x` holds `len` f32 and `y` `y_len` (the caller's contract);
    // the kernel writes only `offset..offset + len`, within `y_len`.
    unsafe {
        launch_units!(
            client,
            len,
            copy_or_add_at_kernel(buffer(x, len), buffer(y, y_len), offset, len, accumulate)
        );
    }
}

/// `y[offset..offset + len] = 0`, in place (`y` holds `y_len` f32).
///
/// # Panics
/// When `y_len < offset + len`.
pub fn zero_at(client: &Client, y: &Handle, y_len: usize, offset: usize, len: usize) {
    assert!(offset + len <= y_len, "a range past the buffer's end");
    if len == 0 {
        return;
    }
    // SAFETY: `y` holds `y_len` f32; only `offset..offset + len` is written.
    unsafe {
        launch_units!(
            client,
            len,
            fill_zeros_at_kernel(buffer(y, y_len), offset, len)
        );
    }
}

fn queue_chunk_sums(
    client: &Client,
    chunks: &DeviceChunks,
    x: &Handle,
    absolute: bool,
) -> QueuedSums {
    if chunks.is_empty() {
        return QueuedSums { partials: None };
    }
    let (partials, partials_arg) = chunks.partials(client, 1);
    // SAFETY: as in `adam_step`; `partials` holds one f32 per chunk.
    unsafe {
        launch_chunks!(
            client,
            chunks,
            chunk_sum_kernel([x], partials_arg, absolute)
        );
    }
    QueuedSums {
        partials: Some(partials),
    }
}

/// `x *= factor` over `len` elements.
pub fn scale(client: &Client, x: &Handle, len: usize, factor: f32) {
    if len == 0 {
        return;
    }
    let factor = f32_arg(client, &[factor]);
    // SAFETY: `x` holds `len` f32 (the caller's contract).
    unsafe {
        launch_units!(client, len, scale_kernel(buffer(x, len), factor, len));
    }
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    copy_kernel::CopyKernel(b(), b(), ()),
    copy_or_add_at_kernel::CopyOrAddAtKernel(b(), b(), (), (), true),
    copy_or_add_at_kernel::CopyOrAddAtKernel(b(), b(), (), (), false),
    fill_zeros_at_kernel::FillZerosAtKernel(b(), (), ()),
    chunk_sum_kernel::ChunkSumKernel(b(), table(), b(), true),
    chunk_sum_kernel::ChunkSumKernel(b(), table(), b(), false),
    scale_kernel::ScaleKernel(b(), b(), ()),
];
