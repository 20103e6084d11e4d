//! SLAMB's synchronisation masks (ALGORITHMS.md "SLAMB"): which elements of
//! the flat momentum travel at step `t`, computed identically on every rank
//! from the seed alone, and the gather/scatter of the selected values.
//!
//! Every function here uses 32-bit integer arithmetic only, so a GPU kernel
//! computes exactly the same mask.

use std::ops::Range;

use rayon::prelude::*;

use terse_rng::{mix32, mix64};

use crate::half_mean::{HalfExchange, HalfSlices};

/// Elements per parallel work item.
const PIECE: usize = 1 << 14;

/// Which elements a step synchronises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mask {
    /// Element `j` is selected at step `t` iff `hash(seed, t, j) < k·2³²`:
    /// a fresh independent subset of expected size `k·d` every step.
    Hash {
        /// Seed of the run.
        seed: u64,
        /// Fraction selected, in (0, 1].
        k: f64,
    },
    /// The authors' v1: a fixed seeded permutation of `0..len` cut into
    /// `round(1/k)` contiguous chunks; step `t` takes chunk `t mod round(1/k)`.
    /// Every element is synchronised exactly once per cycle.
    Cyclic {
        /// Seed of the run (fixes the permutation).
        seed: u64,
        /// Fraction selected, in (0, 1].
        k: f64,
        /// Length of the flat buffer the permutation is over.
        len: usize,
    },
}

/// The per-step constants of a [`Mask`]: what a kernel needs per element.
#[derive(Debug, Clone, Copy)]
pub enum StepMask {
    /// Selected iff `mix32(mix32(j + key0) ^ key1) < threshold` (threshold
    /// as u64 so that k = 1 selects all).
    Hash {
        /// First per-step key.
        key0: u32,
        /// Second per-step key.
        key1: u32,
        /// `k·2³²`, rounded.
        threshold: u64,
    },
    /// Selected iff `⌊π(j)·chunks / len⌋ == chunk`.
    Cyclic {
        /// Feistel round keys of the permutation π.
        keys: [u32; 4],
        /// Half width of the Feistel network in bits.
        half_bits: u32,
        /// Length of the permuted range.
        len: u32,
        /// Number of chunks in a cycle.
        chunks: u32,
        /// The chunk selected this step.
        chunk: u32,
    },
}

impl Mask {
    /// The constants for step `t` (optimizer steps count from 1).
    pub fn at_step(&self, t: u64) -> StepMask {
        match *self {
            Mask::Hash { seed, k } => {
                let key = mix64(seed ^ mix64(t.wrapping_add(0x5eed)));
                StepMask::Hash {
                    key0: key as u32,
                    key1: (key >> 32) as u32,
                    threshold: (k.clamp(0.0, 1.0) * 4_294_967_296.0).round() as u64,
                }
            }
            Mask::Cyclic { seed, k, len } => {
                assert!(
                    len <= u32::MAX as usize,
                    "cyclic mask over more than 2^32 elements"
                );
                let chunks = (1.0 / k).round().max(1.0) as u32;
                let mut half_bits = 1;
                while 1u64 << (2 * half_bits) < len as u64 {
                    half_bits += 1;
                }
                let key = mix64(seed ^ 0xc1c1_1c5e_ed00_0000);
                let key2 = mix64(key);
                StepMask::Cyclic {
                    keys: [
                        key as u32,
                        (key >> 32) as u32,
                        key2 as u32,
                        (key2 >> 32) as u32,
                    ],
                    half_bits,
                    len: len as u32,
                    chunks,
                    chunk: (t % u64::from(chunks)) as u32,
                }
            }
        }
    }
}

impl StepMask {
    /// Whether element `j` is selected.
    #[inline]
    pub fn selected(&self, j: u32) -> bool {
        match *self {
            StepMask::Hash {
                key0,
                key1,
                threshold,
            } => u64::from(mix32(mix32(j.wrapping_add(key0)) ^ key1)) < threshold,
            StepMask::Cyclic {
                keys,
                half_bits,
                len,
                chunks,
                chunk,
            } => {
                let p = permute(j, keys, half_bits, len);
                (u64::from(p) * u64::from(chunks) / u64::from(len)) as u32 == chunk
            }
        }
    }
}

impl StepMask {
    /// A cyclic step's chunk as the range `[lo, hi)` of π(j) it selects:
    /// `⌊p·chunks/len⌋ == chunk` iff `⌈chunk·len/chunks⌉ ≤ p <
    /// ⌈(chunk+1)·len/chunks⌉` (for a kernel without 64-bit products, and
    /// for selecting by π⁻¹); `None` for a hash step.
    pub fn chunk_bounds(&self) -> Option<Range<u32>> {
        let StepMask::Cyclic {
            len, chunks, chunk, ..
        } = *self
        else {
            return None;
        };
        let bound = |c: u32| (u64::from(c) * u64::from(len)).div_ceil(u64::from(chunks)) as u32;
        Some(bound(chunk)..bound(chunk + 1))
    }
}

/// π(j): a 4-round Feistel bijection of `[0, 2^(2·half_bits))`, walked until
/// it lands inside `[0, len)` (cycle walking keeps it a bijection of `0..len`).
#[inline]
pub fn permute(j: u32, keys: [u32; 4], half_bits: u32, len: u32) -> u32 {
    let mask = (1u64 << half_bits) as u32 - 1;
    let mut x = j;
    loop {
        let (mut left, mut right) = (x >> half_bits, x & mask);
        for key in keys {
            let next = left ^ (mix32(right ^ key) & mask);
            left = right;
            right = next;
        }
        x = (left << half_bits) | right;
        if x < len {
            return x;
        }
    }
}

/// π⁻¹(p), the inverse of [`permute`]: the Feistel rounds run backwards,
/// walked until below `len` (cycle walking's inverse is the inverse's).
#[inline]
pub fn unpermute(p: u32, keys: [u32; 4], half_bits: u32, len: u32) -> u32 {
    let mask = (1u64 << half_bits) as u32 - 1;
    let mut x = p;
    loop {
        let (mut left, mut right) = (x >> half_bits, x & mask);
        for key in keys.into_iter().rev() {
            let previous = right ^ (mix32(left ^ key) & mask);
            right = left;
            left = previous;
        }
        x = (left << half_bits) | right;
        if x < len {
            return x;
        }
    }
}

/// The elements selected at one step, grouped by fixed pieces of the buffer
/// so gather and scatter run in parallel with a deterministic order.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Global indices selected in piece `p` (elements `p·PIECE..`), ascending.
    pieces: Vec<Vec<u32>>,
    count: usize,
}

impl Selection {
    /// Evaluates `mask` at step `t` over `0..len`; elements inside `always`
    /// (sorted, disjoint ranges) are selected regardless.
    pub fn new(mask: &Mask, t: u64, len: usize, always: &[Range<usize>]) -> Selection {
        assert!(
            len <= u32::MAX as usize,
            "masks index at most 2^32 elements"
        );
        let step = mask.at_step(t);
        let pieces = match step {
            StepMask::Hash { .. } => hash_pieces(&step, len, always),
            StepMask::Cyclic { len: over, .. } => {
                assert_eq!(
                    over as usize, len,
                    "the cyclic mask's permutation is over another length"
                );
                cyclic_pieces(&step, len, always)
            }
        };
        let count = pieces.iter().map(Vec::len).sum();
        Selection { pieces, count }
    }

    /// How many elements are selected.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether nothing is selected.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// All selected indices, ascending.
    pub fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.pieces.iter().flatten().map(|&j| j as usize)
    }

    /// `values[k] = x[index_k]` for the k-th selected index.
    pub fn gather(&self, x: &[f32], values: &mut [f32]) {
        assert_eq!(values.len(), self.count, "gather: values length");
        let mut rest = values;
        let mut outs = Vec::with_capacity(self.pieces.len());
        for piece in &self.pieces {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(piece.len());
            outs.push(head);
            rest = tail;
        }
        outs.into_par_iter()
            .zip(&self.pieces)
            .for_each(|(out, piece)| {
                for (o, &j) in out.iter_mut().zip(piece) {
                    *o = x[j as usize];
                }
            });
    }

    /// `x[index_k] = values[k]`: the inverse of [`Selection::gather`].
    pub fn scatter(&self, values: &[f32], x: &mut [f32]) {
        assert_eq!(values.len(), self.count, "scatter: values length");
        let mut offsets = Vec::with_capacity(self.pieces.len());
        let mut at = 0;
        for piece in &self.pieces {
            offsets.push(at);
            at += piece.len();
        }
        x.par_chunks_mut(PIECE)
            .zip(&self.pieces)
            .zip(offsets)
            .enumerate()
            .for_each(|(p, ((x, piece), offset))| {
                let base = p * PIECE;
                for (k, &j) in piece.iter().enumerate() {
                    x[j as usize - base] = values[offset + k];
                }
            });
    }
}

/// The hash mask's pieces: every element's hash evaluated.
fn hash_pieces(step: &StepMask, len: usize, always: &[Range<usize>]) -> Vec<Vec<u32>> {
    (0..len.div_ceil(PIECE))
        .into_par_iter()
        .map(|p| {
            let range = p * PIECE..((p + 1) * PIECE).min(len);
            let (start, end) = (range.start, range.end);
            let first = always.partition_point(|r| r.end <= start);
            let mut forced = always[first..]
                .iter()
                .take_while(move |r| r.start < end)
                .peekable();
            let mut out = Vec::new();
            for j in range {
                while forced.peek().is_some_and(|r| r.end <= j) {
                    forced.next();
                }
                let always = forced.peek().is_some_and(|r| r.contains(&j));
                if always || step.selected(j as u32) {
                    out.push(j as u32);
                }
            }
            out
        })
        .collect()
}

/// The cyclic mask's pieces: π⁻¹ of the step's chunk (a fraction k of the
/// elements, not all of them), sorted, each piece's share merged with the
/// always ranges.
fn cyclic_pieces(step: &StepMask, len: usize, always: &[Range<usize>]) -> Vec<Vec<u32>> {
    let StepMask::Cyclic {
        keys, half_bits, ..
    } = *step
    else {
        unreachable!("cyclic_pieces takes a cyclic step");
    };
    let chunk = step.chunk_bounds().expect("a cyclic step");
    let chosen: Vec<u32> = if chunk.len() == len {
        // One chunk a cycle (k > 2/3): every element, already in order.
        (0..len as u32).collect()
    } else {
        let mut chosen: Vec<u32> = chunk
            .into_par_iter()
            .map(|p| unpermute(p, keys, half_bits, len as u32))
            .collect();
        chosen.par_sort_unstable();
        chosen
    };
    (0..len.div_ceil(PIECE))
        .into_par_iter()
        .map(|p| {
            let (start, end) = (p * PIECE, ((p + 1) * PIECE).min(len));
            let from = chosen.partition_point(|&j| (j as usize) < start);
            let to = chosen.partition_point(|&j| (j as usize) < end);
            with_always(&chosen[from..to], start..end, always)
        })
        .collect()
}

/// The ascending `chosen` indices of `piece` and those of `always` inside
/// it, ascending, each once (also where always ranges overlap, as the hash
/// mask's element-wise test allows).
fn with_always(chosen: &[u32], piece: Range<usize>, always: &[Range<usize>]) -> Vec<u32> {
    let first = always.partition_point(|r| r.end <= piece.start);
    let mut out = Vec::with_capacity(chosen.len());
    let mut rest = chosen.iter().copied().peekable();
    let mut covered = piece.start as u32;
    for r in always[first..].iter().take_while(|r| r.start < piece.end) {
        let a = (r.start.max(piece.start) as u32).max(covered);
        let b = (r.end.min(piece.end) as u32).max(a);
        covered = b;
        while let Some(j) = rest.next_if(|&j| j < a) {
            out.push(j);
        }
        out.extend(a..b);
        while rest.next_if(|&j| j < b).is_some() {}
    }
    out.extend(rest);
    out
}

/// A buffer whose elements a step's mask selects, wherever it lives: SLAMB's
/// sparse allreduce (terse-comm's `SparseAllreduce::allreduce_mean_on`)
/// selects through it, gathers the selected values to the host, averages
/// them over ranks and scatters the means back — or, for a buffer in CUDA
/// memory and a communicator that sums GPU memory (NCCL), averages them on
/// the GPU ([`SparseBuffer::mean_on_gpu`]). [`HostSparse`] is a host slice;
/// a device buffer selects, gathers and scatters with cubecl kernels
/// (terse-optim's SLAMB).
pub trait SparseBuffer {
    /// Selects step `t`'s elements: those of `mask` and every element
    /// inside `always` (sorted, disjoint ranges); returns how many.
    fn select(&mut self, mask: &Mask, t: u64, always: &[Range<usize>]) -> usize;

    /// The selected values in ascending index order into `values` (one per
    /// selected element).
    fn gather(&mut self, values: &mut [f32]);

    /// Writes `values` back to the selected elements.
    fn scatter(&mut self, values: &[f32]);

    /// The `count` selected values gathered into a new device buffer,
    /// summed over ranks by `sum(gathered, summed)` (their CUDA addresses;
    /// it returns whether it succeeded) into another, multiplied by `scale`
    /// there and written back to the selected elements — nothing written
    /// when `sum` fails. Returns false, running nothing, where the buffer
    /// is not in CUDA memory (the default: host slices, wgpu buffers).
    fn mean_on_gpu(
        &mut self,
        count: usize,
        scale: f32,
        sum: &mut dyn FnMut(u64, u64) -> bool,
    ) -> bool {
        let _ = (count, scale, sum);
        false
    }

    /// As [`SparseBuffer::mean_on_gpu`], the values travelling as fp16
    /// (`SparseValues::F16`) in `slices` ([`crate::half_mean`]): rounded to
    /// fp16 on the device, sent by `exchange(HalfExchange::AllToAll, send,
    /// received)`, this rank's slice summed in fp32 in rank order, times
    /// `scale`, rounded to fp16 and sent by `exchange(HalfExchange::AllGather,
    /// own, gathered)` (CUDA addresses; it returns whether it succeeded),
    /// then widened and written back — nothing written when an exchange
    /// fails. Returns false, running nothing, where the buffer is not in
    /// CUDA memory (the default).
    fn mean_f16_on_gpu(
        &mut self,
        slices: HalfSlices,
        scale: f32,
        exchange: &mut dyn FnMut(HalfExchange, u64, u64) -> bool,
    ) -> bool {
        let _ = (slices, scale, exchange);
        false
    }
}

/// A host slice and the selection made over it.
#[derive(Debug)]
pub struct HostSparse<'a> {
    /// The buffer.
    pub buf: &'a mut [f32],
    /// The step's selection, written by [`SparseBuffer::select`].
    pub selection: &'a mut Selection,
}

impl SparseBuffer for HostSparse<'_> {
    fn select(&mut self, mask: &Mask, t: u64, always: &[Range<usize>]) -> usize {
        *self.selection = Selection::new(mask, t, self.buf.len(), always);
        self.selection.len()
    }

    fn gather(&mut self, values: &mut [f32]) {
        self.selection.gather(self.buf, values);
    }

    fn scatter(&mut self, values: &[f32]) {
        self.selection.scatter(values, self.buf);
    }
}
