//! The worker side of the compressed allreduce (ALGORITHMS.md phases 1 and
//! 4) wherever the buffer lives: the allreduce hands a [`Worker`] the chunk
//! layout, gets every chunk's packed signs and scales back on the host, and
//! later hands it the averaged messages to dequantise. Only packed bits and
//! scales cross between the worker's memory and the host.

use crate::onebit::{self, ChunkLayout, Scale, blocks_for, words_for};

/// A buffer `x` and its worker error `e` that the compressed allreduce
/// compresses and overwrites.
pub trait Worker {
    /// Elements in `x` (and `e`).
    fn len(&self) -> usize;

    /// Whether the buffer is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Compresses `x` with error feedback in `layout`'s chunks: `bits` gets
    /// `words_for(len)` words, `scales` `layout.slots(len)` (slots past a
    /// chunk's data are 0).
    fn compress(&mut self, layout: ChunkLayout, scale: Scale, bits: &mut [u32], scales: &mut [f32]);

    /// Overwrites `x` with the dequantised `bits` and `scales` (same sizes
    /// as [`Worker::compress`] writes).
    fn decompress(&mut self, layout: ChunkLayout, bits: &[u32], scales: &[f32]);

    /// [`Worker::decompress`] where only `wanted` of `x` is read afterwards:
    /// at least `wanted` is overwritten, the rest may keep its old values.
    /// Ranks that split the update between them each need only their own
    /// part. The default dequantises everything.
    fn decompress_part(
        &mut self,
        layout: ChunkLayout,
        bits: &[u32],
        scales: &[f32],
        wanted: std::ops::Range<usize>,
    ) {
        let _ = wanted;
        self.decompress(layout, bits, scales);
    }
}

/// A worker over host slices: the CPU kernels of [`onebit`].
#[derive(Debug)]
pub struct HostWorker<'a> {
    /// The buffer `x`.
    pub x: &'a mut [f32],
    /// Its error `e`, as long as `x`.
    pub error: &'a mut [f32],
}

impl Worker for HostWorker<'_> {
    fn len(&self) -> usize {
        self.x.len()
    }

    fn compress(
        &mut self,
        layout: ChunkLayout,
        scale: Scale,
        bits: &mut [u32],
        scales: &mut [f32],
    ) {
        assert_eq!(self.error.len(), self.x.len(), "error buffer length");
        let len = self.x.len();
        scales.fill(0.0);
        for_each_chunk(len, layout, |range, words, slots| {
            let real = range.len();
            onebit::compress(
                &self.x[range.clone()],
                &mut self.error[range],
                layout.block,
                scale,
                &mut bits[words],
                &mut scales[slots.start..slots.start + blocks_for(real, layout.block)],
            );
        });
    }

    fn decompress(&mut self, layout: ChunkLayout, bits: &[u32], scales: &[f32]) {
        let len = self.x.len();
        for_each_chunk(len, layout, |range, words, slots| {
            let real = range.len();
            onebit::decompress(
                &bits[words],
                &scales[slots.start..slots.start + blocks_for(real, layout.block)],
                layout.block,
                &mut self.x[range],
            );
        });
    }

    /// Dequantises the whole sign words around `wanted`, one scale block at
    /// a time: every element is the same `±scale` as in
    /// [`Worker::decompress`], only fewer of them are written.
    fn decompress_part(
        &mut self,
        layout: ChunkLayout,
        bits: &[u32],
        scales: &[f32],
        wanted: std::ops::Range<usize>,
    ) {
        let len = self.x.len();
        for_each_chunk(len, layout, |range, _, slots| {
            let (lo, hi) = (wanted.start.max(range.start), wanted.end.min(range.end));
            if lo >= hi {
                return;
            }
            // Chunks start on word boundaries, so whole words stay whole.
            let (start, end) = (lo / 32 * 32, (hi.div_ceil(32) * 32).min(range.end));
            let mut from = start;
            while from < end {
                let block = (from - range.start) / layout.block;
                let to = end.min(range.start + (block + 1) * layout.block);
                let slot = slots.start + block;
                onebit::decompress(
                    &bits[from / 32..from / 32 + words_for(to - from)],
                    &scales[slot..slot + 1],
                    to - from,
                    &mut self.x[from..to],
                );
                from = to;
            }
        });
    }
}

/// Runs `f(elements, words, scale slots)` for every non-empty chunk.
pub(crate) fn for_each_chunk(
    len: usize,
    layout: ChunkLayout,
    mut f: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>, std::ops::Range<usize>),
) {
    let per_chunk = layout.slots_per_chunk();
    for (j, start) in (0..len).step_by(layout.chunk).enumerate() {
        let end = (start + layout.chunk).min(len);
        let words = start / 32..start / 32 + words_for(end - start);
        f(start..end, words, j * per_chunk..(j + 1) * per_chunk);
    }
}
