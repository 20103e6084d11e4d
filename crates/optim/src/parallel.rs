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
pub(crate) fn split_segments<'a>(layout: &ParamLayout, buf: &'a [f32]) -> Vec<&'a [f32]> {
    layout.segments().iter().map(|s| &buf[s.range()]).collect()
}

/// Sum of squares of `values` in f64, reduced in chunk order.
pub(crate) fn sum_of_squares(values: &[f32]) -> f64 {
    let partials: Vec<f64> = values
        .par_chunks(CHUNK)
        .map(|chunk| chunk.iter().map(|&x| f64::from(x) * f64::from(x)).sum())
        .collect();
    partials.into_iter().sum()
}
