//! Whole-buffer utilities: a copy, copies or sums of several buffers into
//! ranges of a larger one in one launch (the parameters' gradients into
//! the flat gradient), a scale, and
//! the per-segment sums of squares and of absolute values (gradient
//! clipping, LAMB's pre-normalisation, the auto freeze's ‖v‖₁, 1-bit LAMB's
//! momentum scales).

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::chunks::*;
use crate::device::cube::{CUBE, buffer, cube_reduce, launch_units, unit_item};
use crate::host_reads;

/// `y = x` over the first `len` elements (either buffer may be longer).
#[cube(launch_unchecked)]
fn copy_kernel(x: &[f32], y: &mut [f32], len: usize) {
    let i = unit_item(len);
    y[i] = x[i];
}

/// Several buffers copied (added when `accumulate`) into ranges of `y` in
/// one launch. Source `s` (of `count`, comptime) is copied by cubes
/// `table[s]..table[s + 1]`, is `table[count + 1 + s]` f32 long and lands
/// at `y[table[2·count + 1 + s]..]`; its cubes stride over it. Each unit
/// picks its source once, by its cube (a comptime switch on a value
/// uniform in the cube): picking it per element made the flat-gradient
/// round trip 5–11× slower on lavapipe, and so did a grid of as many cubes
/// for every source as for the longest (lavapipe runs each cube, idle or
/// not, on a CPU thread).
#[cube(launch_unchecked)]
fn gather_at_kernel(
    sources: &Sequence<OwnedTensor<f32>>,
    y: &mut [f32],
    table: &[u32],
    #[comptime] count: usize,
    #[comptime] accumulate: bool,
) {
    let cube = CUBE_POS as u32;
    #[unroll]
    for s in 0..count {
        let (first_cube, end_cube) = (table[s], table[s + 1]);
        if cube >= first_cube && cube < end_cube {
            let len = usize::cast_from(table[count + 1 + s]);
            let offset = usize::cast_from(table[2 * count + 1 + s]);
            let x = sources.index(s).as_slice();
            let stride = usize::cast_from(end_cube - first_cube) * CUBE;
            let mut i = usize::cast_from(cube - first_cube) * CUBE + UNIT_POS as usize;
            while i < len {
                if accumulate {
                    y[offset + i] += x[i];
                } else {
                    y[offset + i] = x[i];
                }
                i += stride;
            }
        }
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

/// Buffers per [`gather_at`] launch at most: 16, fewer where the device
/// binds fewer buffers to a kernel (two more are `y` and the table).
fn sources_per_launch(client: &Client) -> usize {
    let bindings = client.properties().hardware.max_bindings as usize;
    bindings.saturating_sub(2).clamp(1, 16)
}

/// One part of a [`gather_at`]: `len` f32 of `source` for `y[offset..]`.
#[derive(Debug, Clone)]
pub struct GatherPart {
    /// Holds at least `len` f32.
    pub source: Handle,
    /// Elements copied.
    pub len: usize,
    /// Where they land in `y`.
    pub offset: usize,
}

/// Every part's `len` f32 of its `source` into `y[offset..offset + len]`
/// (added when `accumulate`), in as few launches as the device's bindings
/// allow ([`sources_per_launch`]) instead of one per part: a training
/// step's gradients into the flat gradient (one part per parameter: ~200
/// for BERT-base). The ranges must not overlap.
///
/// # Panics
/// When a range ends past `y_len`, or `y_len` exceeds u32 (the table's
/// offsets).
pub fn gather_at(
    client: &Client,
    parts: &[GatherPart],
    y: &Handle,
    y_len: usize,
    accumulate: bool,
) {
    assert!(
        u32::try_from(y_len).is_ok(),
        "{y_len} elements: offsets are u32"
    );
    for part in parts {
        assert!(
            part.offset + part.len <= y_len,
            "a range past the buffer's end"
        );
    }
    let parts: Vec<&GatherPart> = parts.iter().filter(|part| part.len > 0).collect();
    for group in parts.chunks(sources_per_launch(client)) {
        let count = group.len();
        // Each source's cubes: enough to keep a GPU's memory busy (an H100
        // holds ~1,000 such cubes at once), each striding over the rest.
        let mut table = vec![0u32];
        for part in group {
            let cubes = part.len.div_ceil(CUBE).min(1024) as u32;
            table.push(table[table.len() - 1] + cubes);
        }
        let cubes = table[count];
        table.extend(group.iter().map(|part| part.len as u32));
        table.extend(group.iter().map(|part| part.offset as u32));
        let mut sources = SequenceArg::new();
        for part in group {
            // SAFETY: `source` holds `len` f32 (the caller's contract), read
            // as a 1-D contiguous tensor of that length.
            sources.push(unsafe {
                TensorArg::from_raw_parts(part.source.clone(), [1usize].into(), [part.len].into())
            });
        }
        let table_handle = client.create_from_slice(u32::as_bytes(&table));
        // SAFETY: a unit of source `s`'s cubes reads it below its `len`
        // and writes `y` below `offset + len <= y_len` (checked above); the
        // table holds `3·count + 1` words; at most 16 × 1,024 cubes.
        unsafe {
            gather_at_kernel::launch_unchecked(
                client,
                CubeCount::Static(cubes, 1, 1),
                CubeDim::new_1d(CUBE as u32),
                sources,
                buffer(y, y_len),
                BufferArg::from_raw_parts(table_handle, table.len()),
                count,
                accumulate,
            );
        }
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
    gather_at_kernel::GatherAtKernel(tensors(16), b(), b(), 16, true),
    gather_at_kernel::GatherAtKernel(tensors(3), b(), b(), 3, false),
    fill_zeros_at_kernel::FillZerosAtKernel(b(), (), ()),
    chunk_sum_kernel::ChunkSumKernel(b(), table(), b(), true),
    chunk_sum_kernel::ChunkSumKernel(b(), table(), b(), false),
    scale_kernel::ScaleKernel(b(), b(), ()),
];
