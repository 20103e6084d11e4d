//! Deterministic data parallelism over flat buffers.
//!
//! Work is cut into fixed-size chunks (never sized by the thread count), and
//! partial sums are combined in chunk order, so a result is bit-identical for
//! any number of threads: a resumed run, or a run on another machine, takes the
//! same floating-point path.

use rayon::prelude::*;

use crate::ParamLayout;

/// Elements per parallel work item: large enough to amortise scheduling,
/// small enough to spread a BERT layer's weight over many cores.
pub(crate) const CHUNK: usize = 1 << 14;

/// Independent accumulators of an f64 reduction: enough to fill a vector
/// register and hide the addition latency, fixed so results never depend on
/// the machine.
const LANES: usize = 8;

pub(crate) use terse_kernels::with_avx;

/// Splits a flat buffer into one mutable slice per segment.
pub(crate) fn split_segments_mut<'a>(
    layout: &ParamLayout,
    buf: &'a mut [f32],
) -> Vec<&'a mut [f32]> {
    let mut rest = buf;
    let mut parts = Vec::with_capacity(layout.segments().len());
    for segment in layout.segments() {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(segment.len);
        parts.push(head);
        rest = tail;
    }
    parts
}

/// Splits a flat buffer into one slice per segment.
pub(crate) fn split_segments<'a, T>(layout: &ParamLayout, buf: &'a [T]) -> Vec<&'a [T]> {
    layout.segments().iter().map(|s| &buf[s.range()]).collect()
}

/// One [`CHUNK`] of a pass over whole buffers: its slices of the buffers
/// the pass writes and of those it reads.
pub(crate) type ChunkSlices<'b, const W: usize, const R: usize> =
    ([&'b mut [f32]; W], [&'b [f32]; R]);

/// The whole buffers `writes` and `reads` cut into [`CHUNK`]s from their
/// start (not by segment), in parallel, each chunk with its slices of
/// every buffer: the loop of the element-wise passes over whole buffers.
/// As many chunks as the shortest buffer has, as a zip of their chunks.
pub(crate) fn chunk_slices<'b, const W: usize, const R: usize>(
    writes: [&'b mut [f32]; W],
    reads: [&'b [f32]; R],
) -> impl IndexedParallelIterator<Item = ChunkSlices<'b, W, R>> {
    let lens = writes
        .iter()
        .map(|b| b.len())
        .chain(reads.iter().map(|b| b.len()));
    let count = lens.min().unwrap_or(0).div_ceil(CHUNK);
    let mut writes = writes.map(|b| b.chunks_mut(CHUNK));
    let mut reads = reads.map(|b| b.chunks(CHUNK));
    let each = "a chunk of every buffer";
    let slices: Vec<ChunkSlices<'b, W, R>> = (0..count)
        .map(|_| {
            let w = writes.each_mut().map(|c| c.next().expect(each));
            (w, reads.each_mut().map(|c| c.next().expect(each)))
        })
        .collect();
    slices.into_par_iter()
}

/// Sum of squares of `values` in f64, reduced in chunk order (the same
/// result on any number of threads).
pub fn sum_of_squares(values: &[f32]) -> f64 {
    let partials: Vec<f64> = values.par_chunks(CHUNK).map(chunk_sum_of_squares).collect();
    partials.into_iter().sum()
}

/// One chunk's sum of squares in [`LANES`] accumulators.
pub(crate) fn chunk_sum_of_squares(chunk: &[f32]) -> f64 {
    let mut lanes = [0.0f64; LANES];
    let body = chunk.len() - chunk.len() % LANES;
    for block in chunk[..body].chunks_exact(LANES) {
        for (acc, &x) in lanes.iter_mut().zip(block) {
            *acc += f64::from(x) * f64::from(x);
        }
    }
    for (acc, &x) in lanes.iter_mut().zip(&chunk[body..]) {
        *acc += f64::from(x) * f64::from(x);
    }
    lanes.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_of_squares_is_exact_on_small_integers() {
        // Squares of integers below 2^26 sum exactly in f64: 1² + … + n² = n(n+1)(2n+1)/6.
        for n in [0usize, 1, 7, 8, 9, CHUNK - 1, CHUNK + 5, 3 * CHUNK + 17] {
            let values: Vec<f32> = (1..=n).map(|i| (i % 1000) as f32).collect();
            let expected: f64 = (1..=n).map(|i| ((i % 1000) as f64).powi(2)).sum();
            assert_eq!(sum_of_squares(&values), expected, "n = {n}");
        }
        let n = 1000u64;
        let values: Vec<f32> = (1..=n).map(|i| i as f32).collect();
        assert_eq!(
            sum_of_squares(&values),
            (n * (n + 1) * (2 * n + 1) / 6) as f64
        );
    }
}
