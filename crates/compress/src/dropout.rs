//! Counter-based dropout: whether element `j` of dropout site `s` survives
//! is a pure function of (seed, step, rank, micro-batch, s, j), the same
//! 32-bit hash family as SLAMB's mask ([`crate::mask`]), so a GPU kernel
//! computes the same mask and the backward pass regenerates it instead of
//! storing it. No generator state is shared between threads: local ranks
//! run their forward passes concurrently and still draw exactly the masks
//! they would draw alone.

use std::cell::Cell;

use rayon::prelude::*;
use terse_rng::{mix32, mix64};

/// Elements per parallel task (a mask's factors depend on the element's
/// index only, never on how the loop is cut).
const PIECE: usize = 1 << 14;

/// The forward pass the masks belong to. Sites are numbered in call order
/// within the pass, which a model's forward fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropoutStream {
    key: u64,
}

impl DropoutStream {
    /// The stream of micro-batch `micro` of optimizer step `step` on `rank`.
    pub fn new(seed: u64, step: u64, rank: usize, micro: usize) -> Self {
        let mut key = mix64(seed ^ 0x4452_4f50_4f55_5421);
        for part in [step, rank as u64, micro as u64] {
            key = mix64(key ^ mix64(part.wrapping_add(0x9e37_79b9_7f4a_7c15)));
        }
        DropoutStream { key }
    }

    /// The mask key of site `site` (the `site`-th dropout call of the pass).
    pub fn site_key(&self, site: u64) -> u64 {
        mix64(self.key ^ mix64(site.wrapping_add(0x5eed)))
    }
}

thread_local! {
    /// The calling thread's stream and its next site. A thread that never
    /// entered one (tests, benchmarks, evaluation) uses stream 0.
    static CURRENT: Cell<(DropoutStream, u64)> =
        const { Cell::new((DropoutStream { key: 0 }, 0)) };
}

/// Runs `f` (a forward pass) with its dropout masks drawn from `stream`,
/// sites numbered from 0; the caller's stream is restored after.
pub fn with_dropout_stream<R>(stream: DropoutStream, f: impl FnOnce() -> R) -> R {
    let previous = CURRENT.with(|c| c.replace((stream, 0)));
    let out = f();
    CURRENT.with(|c| c.set(previous));
    out
}

/// The key of the next dropout site of this thread's stream.
pub fn next_site_key() -> u64 {
    CURRENT.with(|c| {
        let (stream, site) = c.get();
        c.set((stream, site + 1));
        stream.site_key(site)
    })
}

/// What a kernel needs per element: keep iff
/// `mix32(mix32(j + key0) ^ key1) ≥ threshold`, survivors scaled by
/// `1/(1 − p)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SiteMask {
    key0: u32,
    key1: u32,
    threshold: u32,
    scale: f32,
}

impl SiteMask {
    /// Dropout probability `prob` in [0, 1) at the site keyed `key`.
    pub fn new(prob: f32, key: u64) -> Self {
        assert!(
            (0.0..1.0).contains(&prob),
            "dropout probability {prob} is not in [0, 1)"
        );
        SiteMask {
            key0: key as u32,
            key1: (key >> 32) as u32,
            threshold: (f64::from(prob) * 4_294_967_296.0).round() as u32,
            scale: 1.0 / (1.0 - prob),
        }
    }

    /// `(key0, key1, threshold, scale)`, what a device kernel needs.
    pub fn parts(&self) -> (u32, u32, u32, f32) {
        (self.key0, self.key1, self.threshold, self.scale)
    }

    /// The factor element `j` is multiplied by: 0 or `1/(1 − p)`.
    #[inline(always)]
    pub fn factor(&self, j: usize) -> f32 {
        self.factor_u32(j as u32)
    }

    /// [`Self::factor`] of `j` taken modulo 2³², as the hash takes it.
    /// Loops index with a u32 counter: LLVM vectorises the hash over a
    /// 32-bit induction variable, not over a truncated 64-bit one (5.6×
    /// faster on 786,432 elements).
    #[inline(always)]
    fn factor_u32(&self, j: u32) -> f32 {
        let h = mix32(mix32(j.wrapping_add(self.key0)) ^ self.key1);
        if h >= self.threshold { self.scale } else { 0.0 }
    }

    /// `out[i] = x[i]·factor(offset + i)`, `out` may alias nothing; for
    /// the backward pass too (the derivative is the same factor).
    pub fn apply(&self, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), out.len());
        out.par_chunks_mut(PIECE)
            .zip(x.par_chunks(PIECE))
            .enumerate()
            .for_each(|(piece, (out, x))| {
                let base = (piece * PIECE) as u32;
                crate::with_avx(|| {
                    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
                        *o = v * self.factor_u32(base.wrapping_add(i as u32));
                    }
                })
            });
    }

    /// Serially, in place: `x[i] ·= factor(offset + i)` — a slice of a
    /// larger tensor, inside a task of an outer parallel loop.
    #[inline(always)]
    pub fn apply_at(&self, offset: usize, x: &mut [f32]) {
        let base = offset as u32;
        for (i, v) in x.iter_mut().enumerate() {
            *v *= self.factor_u32(base.wrapping_add(i as u32));
        }
    }

    /// In place: `x[i] ·= factor(i)`.
    pub fn apply_in_place(&self, x: &mut [f32]) {
        x.par_chunks_mut(PIECE)
            .enumerate()
            .for_each(|(piece, x)| crate::with_avx(|| self.apply_at(piece * PIECE, x)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_about_one_minus_p_and_scales_survivors() {
        let mask = SiteMask::new(0.1, 42);
        let n = 1 << 20;
        let kept = (0..n).filter(|&j| mask.factor(j) != 0.0).count();
        let rate = kept as f64 / n as f64;
        assert!((rate - 0.9).abs() < 0.002, "kept {rate}");
        assert!((0..64).all(|j| [0.0, 1.0 / 0.9].contains(&mask.factor(j))));
        assert!((0..n).all(|j| SiteMask::new(0.0, 42).factor(j) == 1.0));
    }

    #[test]
    fn streams_and_sites_are_independent_and_reproducible() {
        let a = DropoutStream::new(1, 2, 0, 0);
        assert_eq!(a, DropoutStream::new(1, 2, 0, 0));
        for other in [
            DropoutStream::new(2, 2, 0, 0),
            DropoutStream::new(1, 3, 0, 0),
            DropoutStream::new(1, 2, 1, 0),
            DropoutStream::new(1, 2, 0, 1),
        ] {
            assert_ne!(a.site_key(0), other.site_key(0));
        }
        let keys = with_dropout_stream(a, || [next_site_key(), next_site_key()]);
        assert_eq!(keys, [a.site_key(0), a.site_key(1)]);
        assert_ne!(keys[0], keys[1]);
        // Re-entering restarts the numbering: the same pass, the same masks.
        assert_eq!(with_dropout_stream(a, next_site_key), a.site_key(0));
    }

    #[test]
    fn apply_matches_the_per_element_factor_across_pieces() {
        let mask = SiteMask::new(0.25, 7);
        let x: Vec<f32> = (0..3 * PIECE + 5).map(|i| i as f32).collect();
        let mut out = vec![0.0; x.len()];
        mask.apply(&x, &mut out);
        let mut inplace = x.clone();
        mask.apply_in_place(&mut inplace);
        for (j, (&o, &v)) in out.iter().zip(&x).enumerate() {
            assert_eq!(o, v * mask.factor(j));
        }
        assert_eq!(out, inplace);
    }

    /// The keep decisions and scaled values are the same bits in every
    /// vector tier the CPU has as in portable code.
    #[test]
    fn every_tier_draws_the_same_mask() {
        use crate::simd::{SimdTier, with_tier};
        let mask = SiteMask::new(0.1, 0x0123_4567_89ab_cdef);
        let x: Vec<f32> = (0..1 << 18).map(|i| (i as f32).sin()).collect();
        let eval = |tier| {
            with_tier(tier, || {
                x.iter()
                    .enumerate()
                    .map(|(j, &v)| (v * mask.factor(j)).to_bits())
                    .collect::<Vec<_>>()
            })
        };
        let portable = eval(SimdTier::Portable);
        for tier in SimdTier::available() {
            assert_eq!(eval(tier), portable, "{tier:?}");
        }
    }
}
