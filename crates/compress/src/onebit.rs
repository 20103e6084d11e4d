//! 1-bit compression with error feedback (ALGORITHMS.md "1-bit compression
//! with error feedback"): `y = x + e; q = s·sign(y); e = y - q`, sign(0) = +1,
//! one scale `s` per block of consecutive elements.
//!
//! Bits are packed 32 per u32 word: bit `b` of word `w` is element `32w + b`,
//! 1 = non-negative. Bits past the end of the data are 0 and never read back.
//!
//! Work is cut into fixed pieces of [`PIECE`] elements that never straddle a
//! block, and a block's scale sums its pieces' partial sums in order, so the
//! result is bit-identical for any number of threads.

use rayon::prelude::*;

use crate::simd::{LANES, with_avx};

/// How a block's scale is computed from its values `y`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    /// `mean(|y|)`: the least-squares optimal scale for `s·sign(y)`.
    #[default]
    L1,
    /// `‖y‖ / sqrt(len)` (DeepSpeed parity).
    L2,
}

/// Elements per parallel work item (a multiple of 32: pieces pack whole words).
pub const PIECE: usize = 1 << 14;

/// Number of u32 words holding `len` signs.
pub fn words_for(len: usize) -> usize {
    len.div_ceil(32)
}

/// Number of scales for `len` elements in blocks of `block`.
pub fn blocks_for(len: usize, block: usize) -> usize {
    len.div_ceil(effective_block(block, len))
}

/// The block size actually used: at least 1, at most the whole buffer.
pub fn effective_block(block: usize, len: usize) -> usize {
    block.max(1).min(len.max(1))
}

/// Blocks that restart every `chunk` elements: the compressed allreduce's
/// messages, one per chunk, each with its own `ceil(chunk / block)` scale
/// slots (slots past the data hold 0 and are never sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLayout {
    /// Elements per chunk, a positive multiple of 32.
    pub chunk: usize,
    /// Elements per scale inside a chunk: a multiple of 32, at most `chunk`.
    pub block: usize,
}

impl ChunkLayout {
    /// Chunks of `chunk` elements with one scale per `block` (capped at the
    /// chunk).
    ///
    /// # Panics
    /// When `chunk` is not a positive multiple of 32, or a `block` smaller
    /// than the chunk is not a multiple of 32.
    pub fn new(chunk: usize, block: usize) -> ChunkLayout {
        assert!(
            chunk > 0 && chunk.is_multiple_of(32),
            "chunk {chunk} must be a positive multiple of 32"
        );
        let block = block.max(1).min(chunk);
        assert!(
            block.is_multiple_of(32),
            "block {block} must be a multiple of 32 or cover the chunk of {chunk}"
        );
        ChunkLayout { chunk, block }
    }

    /// One chunk over `len` elements, blocked as [`compress`] blocks them.
    pub fn whole(len: usize, block: usize) -> ChunkLayout {
        let chunk = len.max(1).div_ceil(32) * 32;
        let block = effective_block(block, len);
        ChunkLayout::new(chunk, if block >= len { chunk } else { block })
    }

    /// Scale slots per chunk.
    pub fn slots_per_chunk(&self) -> usize {
        self.chunk.div_ceil(self.block)
    }

    /// Scale slots for `len` elements: every chunk's, the last one's in full.
    pub fn slots(&self, len: usize) -> usize {
        len.div_ceil(self.chunk) * self.slots_per_chunk()
    }
}

fn check_lengths(len: usize, block: usize, bits: usize, scales: usize) {
    assert!(
        block.is_multiple_of(32) || block >= len,
        "block {block} must be a multiple of 32 or cover all {len} elements"
    );
    assert_eq!(bits, words_for(len), "bits buffer length");
    assert_eq!(scales, blocks_for(len, block), "scales buffer length");
}

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
    assert_eq!(error.len(), len, "error buffer length");
    check_lengths(len, block, bits.len(), scales.len());
    if len == 0 {
        return;
    }
    let block = effective_block(block, len);
    let block_words = block.div_ceil(32);
    if block <= PIECE {
        // Small blocks: a work item holds whole blocks, each done in cache.
        let per = (PIECE / block).max(1);
        x.par_chunks(per * block)
            .zip(error.par_chunks_mut(per * block))
            .zip(bits.par_chunks_mut(per * block_words))
            .zip(scales.par_chunks_mut(per))
            .for_each(|(((x, e), bits), scales)| {
                let blocks = x.chunks(block).zip(e.chunks_mut(block));
                for ((x, e), (bits, s)) in blocks.zip(bits.chunks_mut(block_words).zip(scales)) {
                    let partial = sign_pack(x, e, bits, scale);
                    *s = finish_scale(partial, x.len(), scale);
                    apply_quantisation(e, bits, *s);
                }
            });
        return;
    }
    // Large blocks: a read-only pass for the scale, then one pass that packs
    // the signs and updates the error (each piece's y = x + e recomputed, so
    // e is written once: 20 bytes of traffic per element instead of 24).
    let partials: Vec<Vec<f64>> = x
        .par_chunks(block)
        .zip(error.par_chunks(block))
        .map(|(x, e)| {
            x.par_chunks(PIECE)
                .zip(e.par_chunks(PIECE))
                .map(|(x, e)| scale_sum(x, e, scale))
                .collect()
        })
        .collect();
    for ((s, partials), x) in scales.iter_mut().zip(&partials).zip(x.chunks(block)) {
        *s = finish_scale(partials.iter().sum(), x.len(), scale);
    }
    x.par_chunks(block)
        .zip(error.par_chunks_mut(block))
        .zip(bits.par_chunks_mut(block_words))
        .zip(scales.par_iter())
        .for_each(|(((x, e), bits), &s)| {
            x.par_chunks(PIECE)
                .zip(e.par_chunks_mut(PIECE))
                .zip(bits.par_chunks_mut(PIECE / 32))
                .for_each(|((x, e), bits)| pack_quantise(x, e, bits, s));
        });
}

/// `Σ|x + e|` or `Σ(x + e)²` in f64, summed exactly as [`sign_pack`] sums it.
#[inline(always)]
fn scale_sum(x: &[f32], e: &[f32], scale: Scale) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the running CPU supports AVX, checked just above.
        return unsafe {
            match scale {
                Scale::L1 => avx::scale_sum::<false>(x, e),
                Scale::L2 => avx::scale_sum::<true>(x, e),
            }
        };
    }
    let mut e = e.to_vec();
    let mut bits = vec![0u32; words_for(x.len())];
    match scale {
        Scale::L1 => sign_pack_with::<false>(x, &mut e, &mut bits),
        Scale::L2 => sign_pack_with::<true>(x, &mut e, &mut bits),
    }
}

/// `y = x + e`, the signs of `y` into `bits`, `e = y - s·sign(y)`: the same
/// operations as [`sign_pack`] then [`apply_quantisation`], in one pass.
#[inline(always)]
fn pack_quantise(x: &[f32], e: &mut [f32], bits: &mut [u32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the running CPU supports AVX, checked just above.
        unsafe { avx::pack_quantise(x, e, bits, s) };
        return;
    }
    sign_pack_with::<false>(x, e, bits);
    apply_quantisation_scalar(e, bits, s);
}

/// `e += x` (so `e` holds `y`), the signs of `y` into `bits`, and `Σ|y|` or
/// `Σy²` in f64. Written over whole 32-element words with fixed-size arrays
/// so the compiler vectorises it; each word's sum is taken in 8 f32 lanes of
/// 4 terms, then added in f64.
#[inline(always)]
fn sign_pack(x: &[f32], e: &mut [f32], bits: &mut [u32], scale: Scale) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the running CPU supports AVX, checked just above.
        return unsafe {
            match scale {
                Scale::L1 => avx::sign_pack::<false>(x, e, bits),
                Scale::L2 => avx::sign_pack::<true>(x, e, bits),
            }
        };
    }
    match scale {
        Scale::L1 => sign_pack_with::<false>(x, e, bits),
        Scale::L2 => sign_pack_with::<true>(x, e, bits),
    }
}

#[inline(always)]
fn sign_pack_with<const SQUARES: bool>(x: &[f32], e: &mut [f32], bits: &mut [u32]) -> f64 {
    let mut lanes = [0.0f64; LANES];
    let full = x.len() / 32;
    let (x_body, x_tail) = x.split_at(full * 32);
    let (e_body, e_tail) = e.split_at_mut(full * 32);
    for ((x, e), word) in x_body
        .chunks_exact(32)
        .zip(e_body.chunks_exact_mut(32))
        .zip(bits.iter_mut())
    {
        let x: &[f32; 32] = x.try_into().expect("32 elements");
        let e: &mut [f32; 32] = e.try_into().expect("32 elements");
        let mut part = [0.0f32; LANES];
        let mut packed = 0u32;
        for b in 0..32 {
            let y = e[b] + x[b];
            e[b] = y;
            packed |= u32::from(y >= 0.0) << b;
            part[b % LANES] += if SQUARES { y * y } else { y.abs() };
        }
        for (acc, p) in lanes.iter_mut().zip(part) {
            *acc += f64::from(p);
        }
        *word = packed;
    }
    if !x_tail.is_empty() {
        sign_pack_tail::<SQUARES>(x_tail, e_tail, &mut bits[full], &mut lanes);
    }
    lanes.iter().sum()
}

/// The last, partial word of a piece, continuing `lanes` (its element `b` is
/// lane `b % LANES`, as in the whole words); shared by the portable and AVX
/// loops so both give the same bits.
#[inline(always)]
fn sign_pack_tail<const SQUARES: bool>(
    x: &[f32],
    e: &mut [f32],
    word: &mut u32,
    lanes: &mut [f64; LANES],
) {
    let mut packed = 0u32;
    for (b, (&x, e)) in x.iter().zip(e.iter_mut()).enumerate() {
        let y = *e + x;
        *e = y;
        packed |= u32::from(y >= 0.0) << b;
        let y = f64::from(y);
        lanes[b % LANES] += if SQUARES { y * y } else { y.abs() };
    }
    *word = packed;
}

fn finish_scale(sum: f64, len: usize, scale: Scale) -> f32 {
    let mean = sum / len as f64;
    match scale {
        Scale::L1 => mean as f32,
        Scale::L2 => mean.sqrt() as f32,
    }
}

/// `e = y - s·sign(y)` for `e` holding `y` and `bits` its signs.
#[inline(always)]
fn apply_quantisation(e: &mut [f32], bits: &[u32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the running CPU supports AVX, checked just above.
        unsafe { avx::apply_quantisation(e, bits, s) };
        return;
    }
    apply_quantisation_scalar(e, bits, s);
}

#[inline(always)]
pub(crate) fn apply_quantisation_scalar(e: &mut [f32], bits: &[u32], s: f32) {
    let full = e.len() / 32;
    let (body, tail) = e.split_at_mut(full * 32);
    for (e, &word) in body.chunks_exact_mut(32).zip(bits) {
        let e: &mut [f32; 32] = e.try_into().expect("32 elements");
        for (b, e) in e.iter_mut().enumerate() {
            *e -= signed(word, b, s);
        }
    }
    for (b, e) in tail.iter_mut().enumerate() {
        *e -= signed(bits[full], b, s);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx;

/// `s` when bit `b` of `word` is set, else `-s`: the sign bit is flipped
/// arithmetically so the loop has no branch.
#[inline(always)]
fn signed(word: u32, b: usize, s: f32) -> f32 {
    let negative = (!word >> b) & 1;
    f32::from_bits(s.to_bits() ^ (negative << 31))
}

/// Dequantises `out.len()` elements: element `i` is `±scales[i / block]`.
pub fn decompress(bits: &[u32], scales: &[f32], block: usize, out: &mut [f32]) {
    let len = out.len();
    check_lengths(len, effective_block(block, len), bits.len(), scales.len());
    for_each_block(bits, scales, block, out, |out, bits, s| {
        for_each_word(out, bits, |out, word| *out = signed(word.0, word.1, s));
    });
}

/// Adds the dequantised values to `acc` (`acc[i] += ±scales[i / block]`).
pub fn decompress_add(bits: &[u32], scales: &[f32], block: usize, acc: &mut [f32]) {
    let len = acc.len();
    check_lengths(len, effective_block(block, len), bits.len(), scales.len());
    for_each_block(bits, scales, block, acc, |acc, bits, s| {
        for_each_word(acc, bits, |acc, word| *acc += signed(word.0, word.1, s));
    });
}

/// Runs `f(element, (word, bit))` over every element and its sign bit; whole
/// words as fixed-size arrays so the compiler vectorises `f`.
#[inline(always)]
fn for_each_word(values: &mut [f32], bits: &[u32], f: impl Fn(&mut f32, (u32, usize))) {
    let full = values.len() / 32;
    let (body, tail) = values.split_at_mut(full * 32);
    for (values, &word) in body.chunks_exact_mut(32).zip(bits) {
        let values: &mut [f32; 32] = values.try_into().expect("32 elements");
        for (b, v) in values.iter_mut().enumerate() {
            f(v, (word, b));
        }
    }
    for (b, v) in tail.iter_mut().enumerate() {
        f(v, (bits[full], b));
    }
}

/// Runs `f(out_piece, bits_piece, scale)` over pieces of every block, in
/// parallel.
fn for_each_block(
    bits: &[u32],
    scales: &[f32],
    block: usize,
    out: &mut [f32],
    f: impl Fn(&mut [f32], &[u32], f32) + Sync,
) {
    let len = out.len();
    if len == 0 {
        return;
    }
    let block = effective_block(block, len);
    let block_words = block.div_ceil(32);
    if block <= PIECE {
        let per = (PIECE / block).max(1);
        out.par_chunks_mut(per * block)
            .zip(bits.par_chunks(per * block_words))
            .zip(scales.par_chunks(per))
            .for_each(|((out, bits), scales)| {
                let blocks = out.chunks_mut(block).zip(bits.chunks(block_words));
                for ((out, bits), &s) in blocks.zip(scales) {
                    with_avx(|| f(out, bits, s));
                }
            });
    } else {
        out.par_chunks_mut(block)
            .zip(bits.par_chunks(block_words))
            .zip(scales.par_iter())
            .for_each(|((out, bits), &s)| {
                out.par_chunks_mut(PIECE)
                    .zip(bits.par_chunks(PIECE / 32))
                    .for_each(|(out, bits)| with_avx(|| f(out, bits, s)));
            });
    }
}
