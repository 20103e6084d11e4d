//! 1-bit compression with error feedback (ALGORITHMS.md "1-bit compression
//! with error feedback"): `y = x + e; q = s·sign(y); e = y - q`, sign(0) = +1,
//! one scale `s` per block of consecutive elements.
//!
//! Bits are packed 32 per u32 word: bit `b` of word `w` is element `32w + b`,
//! 1 = non-negative. Bits past the end of the data are 0 and never read back.

use rayon::prelude::*;

/// How a block's scale is computed from its values `y`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    /// `mean(|y|)`: the least-squares optimal scale for `s·sign(y)`.
    #[default]
    L1,
    /// `‖y‖ / sqrt(len)` (DeepSpeed parity).
    L2,
}

/// Number of u32 words holding `len` signs.
pub fn words_for(len: usize) -> usize {
    len.div_ceil(32)
}

/// Number of scales for `len` elements in blocks of `block`.
pub fn blocks_for(len: usize, block: usize) -> usize {
    len.div_ceil(effective_block(block, len))
}

/// The block size actually used: at least 1, at most the whole buffer.
fn effective_block(block: usize, len: usize) -> usize {
    block.max(1).min(len.max(1))
}

/// Buffers of this many elements or more are compressed a block per task.
const PARALLEL_MIN: usize = 1 << 15;

/// Compresses `x` with error feedback in place of `error`.
///
/// `block` must be a multiple of 32 (so a block's signs fill whole words) or
/// at least `x.len()` (one block). `bits` gets `words_for(len)` words and
/// `scales` `blocks_for(len, block)` values.
///
/// # Panics
/// When the buffer lengths do not match the above.
pub fn compress(
    x: &[f32],
    error: &mut [f32],
    block: usize,
    scale: Scale,
    bits: &mut [u32],
    scales: &mut [f32],
) {
    let len = x.len();
    let block = effective_block(block, len);
    assert!(
        block.is_multiple_of(32) || block >= len,
        "block {block} must be a multiple of 32 or cover all {len} elements"
    );
    assert_eq!(error.len(), len, "error buffer length");
    assert_eq!(bits.len(), words_for(len), "bits buffer length");
    assert_eq!(scales.len(), blocks_for(len, block), "scales buffer length");
    let words_per_block = block.div_ceil(32);
    if len < PARALLEL_MIN {
        let blocks = x.chunks(block).zip(error.chunks_mut(block));
        for ((x, e), (bits, s)) in blocks.zip(bits.chunks_mut(words_per_block).zip(scales)) {
            *s = compress_block(x, e, scale, bits);
        }
    } else {
        let blocks = x.par_chunks(block).zip(error.par_chunks_mut(block));
        let outputs = bits
            .par_chunks_mut(words_per_block)
            .zip(scales.par_iter_mut());
        blocks
            .zip(outputs)
            .for_each(|((x, e), (bits, s))| *s = compress_block(x, e, scale, bits));
    }
}

/// One block: `y = x + e` into `e`, the scale, then bits and `e = y - s·sign(y)`.
fn compress_block(x: &[f32], e: &mut [f32], scale: Scale, bits: &mut [u32]) -> f32 {
    let mut acc = 0.0f64;
    for (e, &x) in e.iter_mut().zip(x) {
        *e += x;
        acc += match scale {
            Scale::L1 => f64::from(e.abs()),
            Scale::L2 => f64::from(*e) * f64::from(*e),
        };
    }
    let n = x.len() as f64;
    let s = match scale {
        Scale::L1 => acc / n,
        Scale::L2 => (acc / n).sqrt(),
    } as f32;
    for (word, ys) in bits.iter_mut().zip(e.chunks_mut(32)) {
        let mut packed = 0u32;
        for (b, y) in ys.iter_mut().enumerate() {
            let positive = *y >= 0.0;
            packed |= u32::from(positive) << b;
            *y -= if positive { s } else { -s };
        }
        *word = packed;
    }
    s
}

/// Dequantises `len` elements: element `i` is `±scales[i / block]`.
pub fn decompress(bits: &[u32], scales: &[f32], block: usize, out: &mut [f32]) {
    let len = out.len();
    let block = effective_block(block, len);
    assert_eq!(bits.len(), words_for(len), "bits buffer length");
    assert_eq!(scales.len(), blocks_for(len, block), "scales buffer length");
    for (i, value) in out.iter_mut().enumerate() {
        let s = scales[i / block];
        let positive = bits[i / 32] >> (i % 32) & 1 == 1;
        *value = if positive { s } else { -s };
    }
}
