//! 1-bit compression with error feedback on the device: three launches over
//! one 32-element word per unit (sign pack with per-word partial sums, one
//! cube per block for the scale, error update), and dequantisation.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{CUBE, bit, buffer, cube_reduce, launch_units, unit_item};
use crate::onebit::{ChunkLayout, Scale, words_for};

/// `e += x`, the signs of `y = e` into `bits`, and `Σ|y|` (or `Σy²`) of the
/// word into `word_sums`, over the first `len` elements. One unit per word.
///
/// Every kernel here takes its element count as an argument: a kernel's
/// `len()` is its handle's size, and `x` may be a padded flat buffer.
#[cube(launch_unchecked)]
fn sign_pack_kernel(
    x: &[f32],
    e: &mut [f32],
    bits: &mut [u32],
    word_sums: &mut [f32],
    len: usize,
    #[comptime] squares: bool,
) {
    let w = unit_item(bits.len());
    let mut packed = 0u32;
    let mut acc = 0.0f32;
    #[unroll]
    for b in 0..32usize {
        let i = w * 32 + b;
        if i < len {
            let y = e[i] + x[i];
            e[i] = y;
            if y >= 0.0 {
                packed |= 1u32 << u32::cast_from(b);
            }
            if squares {
                acc += y * y;
            } else {
                acc += f32::abs(y);
            }
        }
    }
    bits[w] = packed;
    word_sums[w] = acc;
}

/// One cube per scale slot: the slot's word sums reduced in shared memory,
/// then `mean` (l1) or `sqrt(mean)` (l2) over its real elements. Blocks
/// restart at every `chunk` (each chunk has `ceil(chunk / block)` slots); a
/// slot past the data gets 0.
#[cube(launch_unchecked)]
fn block_scale_kernel(
    word_sums: &[f32],
    scales: &mut [f32],
    len: usize,
    #[comptime] chunk: usize,
    #[comptime] block: usize,
    #[comptime] squares: bool,
) {
    let slot = CUBE_POS;
    let unit = UNIT_POS as usize;
    let per_chunk = comptime!(chunk.div_ceil(block));
    let start = (slot / per_chunk) * chunk + (slot % per_chunk) * block;
    let chunk_end = (slot / per_chunk) * chunk + chunk;
    let mut end = start + block;
    if end > chunk_end {
        end = chunk_end;
    }
    if end > len {
        end = len;
    }
    let first = start / 32;
    let mut last = first;
    if end > start {
        // `div_ceil` has no cubecl expansion.
        #[allow(clippy::manual_div_ceil)]
        {
            last = (end + 31) / 32;
        }
    }
    let mut acc = 0.0f32;
    let mut w = first + unit;
    while w < last {
        acc += word_sums[w];
        w += CUBE;
    }
    let sum = cube_reduce(acc, false);
    if unit == 0 {
        if end > start {
            let mean = sum / f32::cast_from(end - start);
            if squares {
                scales[slot] = f32::sqrt(mean);
            } else {
                scales[slot] = mean;
            }
        } else {
            scales[slot] = 0.0;
        }
    }
}

/// The scale slot of element `i`: its chunk's slots, then its block within
/// the chunk.
#[cube]
fn slot_of(i: usize, #[comptime] chunk: usize, #[comptime] block: usize) -> usize {
    let per_chunk = comptime!(chunk.div_ceil(block));
    (i / chunk) * per_chunk + (i % chunk) / block
}

/// `e -= s·sign(y)` for `e` holding `y`; one unit per word.
#[cube(launch_unchecked)]
fn quantise_kernel(
    e: &mut [f32],
    bits: &[u32],
    scales: &[f32],
    len: usize,
    #[comptime] chunk: usize,
    #[comptime] block: usize,
) {
    let w = unit_item(bits.len());
    let word = bits[w];
    #[unroll]
    for b in 0..32usize {
        let i = w * 32 + b;
        if i < len {
            let s = scales[slot_of(i, chunk, block)];
            let y = e[i];
            if bit(word, b) {
                e[i] = y - s;
            } else {
                e[i] = y + s;
            }
        }
    }
}

/// `out[i] = ±scales[slot_of(i)]`; one unit per word.
#[cube(launch_unchecked)]
fn decompress_kernel(
    bits: &[u32],
    scales: &[f32],
    out: &mut [f32],
    len: usize,
    #[comptime] chunk: usize,
    #[comptime] block: usize,
) {
    let w = unit_item(bits.len());
    let word = bits[w];
    #[unroll]
    for b in 0..32usize {
        let i = w * 32 + b;
        if i < len {
            let s = scales[slot_of(i, chunk, block)];
            if bit(word, b) {
                out[i] = s;
            } else {
                out[i] = -s;
            }
        }
    }
}

/// Packed signs and block scales on the device.
pub struct DeviceCompressed {
    /// `words_for(len)` u32 words.
    pub bits: Handle,
    /// `blocks_for(len, block)` f32 scales.
    pub scales: Handle,
}

/// Compresses `len` elements of `x` with error feedback in place of `error`
/// (both f32 device buffers), writing into `out` (sized as the CPU
/// [`crate::onebit::compress`] requires). Same block rule as the CPU.
pub fn compress(
    client: &Client,
    x: &Handle,
    error: &Handle,
    len: usize,
    block: usize,
    scale: Scale,
    out: &DeviceCompressed,
) {
    if len == 0 {
        return;
    }
    compress_chunks(
        client,
        x,
        error,
        len,
        ChunkLayout::whole(len, block),
        scale,
        out,
    );
}

/// [`compress`] with blocks restarting every `layout.chunk` elements: the
/// worker side of the compressed allreduce in one set of launches. `out`
/// holds `words_for(len)` words and `layout.slots(len)` scales.
pub fn compress_chunks(
    client: &Client,
    x: &Handle,
    error: &Handle,
    len: usize,
    layout: ChunkLayout,
    scale: Scale,
    out: &DeviceCompressed,
) {
    if len == 0 {
        return;
    }
    let ChunkLayout { chunk, block } = layout;
    let words = words_for(len);
    let slots = layout.slots(len);
    let squares = scale == Scale::L2;
    let word_sums = client.empty(words * size_of::<f32>());
    // SAFETY: every buffer holds the element counts given with it (the
    // caller's sizes are those of the CPU function, checked there), and the
    // kernels bound every access by those counts.
    unsafe {
        launch_units!(
            client,
            words,
            sign_pack_kernel(
                buffer(x, len),
                buffer(error, len),
                buffer(&out.bits, words),
                buffer(&word_sums, words),
                len,
                squares
            )
        );
        // One cube per scale slot.
        block_scale_kernel::launch_unchecked(
            client,
            CubeCount::Static(slots as u32, 1, 1),
            CubeDim::new_1d(CUBE as u32),
            buffer(&word_sums, words),
            buffer(&out.scales, slots),
            len,
            chunk,
            block,
            squares,
        );
        launch_units!(
            client,
            words,
            quantise_kernel(
                buffer(error, len),
                buffer(&out.bits, words),
                buffer(&out.scales, slots),
                len,
                chunk,
                block
            )
        );
    }
}

/// Dequantises `len` elements into the f32 device buffer `out`.
pub fn decompress(
    client: &Client,
    compressed: &DeviceCompressed,
    len: usize,
    block: usize,
    out: &Handle,
) {
    if len == 0 {
        return;
    }
    decompress_chunks(client, compressed, len, ChunkLayout::whole(len, block), out);
}

/// [`decompress`] of a chunked layout (see [`compress_chunks`]).
pub fn decompress_chunks(
    client: &Client,
    compressed: &DeviceCompressed,
    len: usize,
    layout: ChunkLayout,
    out: &Handle,
) {
    if len == 0 {
        return;
    }
    let words = words_for(len);
    let slots = layout.slots(len);
    // SAFETY: as in `compress_chunks`.
    unsafe {
        launch_units!(
            client,
            words,
            decompress_kernel(
                buffer(&compressed.bits, words),
                buffer(&compressed.scales, slots),
                buffer(out, len),
                len,
                layout.chunk,
                layout.block
            )
        );
    }
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    sign_pack_kernel::SignPackKernel(b(), b(), b(), b(), (), false),
    sign_pack_kernel::SignPackKernel(b(), b(), b(), b(), (), true),
    block_scale_kernel::BlockScaleKernel(b(), b(), (), 262_144, 65_536, false),
    block_scale_kernel::BlockScaleKernel(b(), b(), (), 262_144, 262_144, true),
    quantise_kernel::QuantiseKernel(b(), b(), b(), (), 262_144, 65_536),
    decompress_kernel::DecompressKernel(b(), b(), b(), (), 262_144, 65_536),
];
