//! The two hot loops of [`super::compress`] in AVX intrinsics: the compiler
//! does not turn `packed |= (y >= 0) << b` into a compare and a movemask on
//! its own. Same arithmetic in the same order as the portable loops (a
//! compare, an add, `|y|` or `y·y`, no FMA), so results are bit-identical on
//! every x86-64 machine, with or without AVX.

use std::arch::x86_64::*;

#[cfg(test)]
use super::sign_pack_with;
use super::{apply_quantisation_scalar, sign_pack_tail};
use crate::simd::LANES;

/// AVX twin of `sign_pack_with`: whole words vectorised, the tail portable.
#[target_feature(enable = "avx")]
pub(super) fn sign_pack<const SQUARES: bool>(x: &[f32], e: &mut [f32], bits: &mut [u32]) -> f64 {
    let full = x.len() / 32;
    let zero = _mm256_setzero_ps();
    let mut sum = Sum::new();
    for (w, word) in bits[..full].iter_mut().enumerate() {
        let mut part = zero;
        let mut packed = 0u32;
        for k in 0..4 {
            let i = 32 * w + 8 * k;
            // SAFETY: i + 8 <= 32 * full <= len for both slices.
            let (xv, ev) = unsafe {
                (
                    _mm256_loadu_ps(x.as_ptr().add(i)),
                    _mm256_loadu_ps(e.as_ptr().add(i)),
                )
            };
            let y = _mm256_add_ps(ev, xv);
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(e.as_mut_ptr().add(i), y) };
            let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(y, zero);
            packed |= (_mm256_movemask_ps(ge) as u32) << (8 * k);
            part = add_term::<SQUARES>(part, y);
        }
        *word = packed;
        sum.add_word(part);
    }
    let mut lanes = sum.lanes();
    if x.len() > 32 * full {
        // The tail continues these lanes exactly as the portable loop does.
        sign_pack_tail::<SQUARES>(
            &x[32 * full..],
            &mut e[32 * full..],
            &mut bits[full],
            &mut lanes,
        );
    }
    lanes.iter().sum()
}

/// `sign_pack`'s sum without its stores: the scale pass over blocks too
/// large for the cache reads x and e only.
#[target_feature(enable = "avx")]
pub(super) fn scale_sum<const SQUARES: bool>(x: &[f32], e: &[f32]) -> f64 {
    let full = x.len() / 32;
    let mut sum = Sum::new();
    for w in 0..full {
        let mut part = _mm256_setzero_ps();
        for k in 0..4 {
            let i = 32 * w + 8 * k;
            // SAFETY: i + 8 <= 32 * full <= len for both slices.
            let y = unsafe {
                _mm256_add_ps(
                    _mm256_loadu_ps(e.as_ptr().add(i)),
                    _mm256_loadu_ps(x.as_ptr().add(i)),
                )
            };
            part = add_term::<SQUARES>(part, y);
        }
        sum.add_word(part);
    }
    let mut lanes = sum.lanes();
    if x.len() > 32 * full {
        let mut tail = e[32 * full..].to_vec();
        let mut word = 0;
        sign_pack_tail::<SQUARES>(&x[32 * full..], &mut tail, &mut word, &mut lanes);
    }
    lanes.iter().sum()
}

/// `part + |y|` (L1) or `part + y·y` (L2), per lane: the portable loop's
/// term and add. `#[inline]` with the callers' target feature, so it is
/// inlined into their loops (the const parameter leaves no branch there).
#[target_feature(enable = "avx")]
#[inline]
fn add_term<const SQUARES: bool>(part: __m256, y: __m256) -> __m256 {
    let term = if SQUARES {
        _mm256_mul_ps(y, y)
    } else {
        _mm256_and_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)))
    };
    _mm256_add_ps(part, term)
}

/// The 8 f64 lanes a word's 8 f32 partial sums are added into, as the
/// portable loop's `[f64; LANES]`.
struct Sum {
    lo: __m256d,
    hi: __m256d,
}

impl Sum {
    #[target_feature(enable = "avx")]
    #[inline]
    fn new() -> Sum {
        Sum {
            lo: _mm256_setzero_pd(),
            hi: _mm256_setzero_pd(),
        }
    }

    /// Widens one word's partial sums to f64 and adds them lane by lane.
    #[target_feature(enable = "avx")]
    #[inline]
    fn add_word(&mut self, part: __m256) {
        self.lo = _mm256_add_pd(self.lo, _mm256_cvtps_pd(_mm256_castps256_ps128(part)));
        self.hi = _mm256_add_pd(self.hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(part)));
    }

    /// The lanes for the portable tail to continue.
    #[target_feature(enable = "avx")]
    #[inline]
    fn lanes(&self) -> [f64; LANES] {
        let mut lanes = [0.0f64; LANES];
        // SAFETY: `lanes` holds 8 f64, two stores of 4.
        unsafe {
            _mm256_storeu_pd(lanes.as_mut_ptr(), self.lo);
            _mm256_storeu_pd(lanes.as_mut_ptr().add(4), self.hi);
        }
        lanes
    }
}

/// `sign_pack` and `apply_quantisation` fused for a known scale: `e` is
/// read and written once.
#[target_feature(enable = "avx")]
pub(super) fn pack_quantise(x: &[f32], e: &mut [f32], bits: &mut [u32], s: f32) {
    let full = x.len() / 32;
    let zero = _mm256_setzero_ps();
    let plus = _mm256_set1_ps(s);
    let minus = _mm256_xor_ps(plus, _mm256_set1_ps(-0.0));
    for (w, word) in bits[..full].iter_mut().enumerate() {
        let mut packed = 0u32;
        for k in 0..4 {
            let i = 32 * w + 8 * k;
            // SAFETY: i + 8 <= 32 * full <= len for both slices.
            unsafe {
                let y = _mm256_add_ps(
                    _mm256_loadu_ps(e.as_ptr().add(i)),
                    _mm256_loadu_ps(x.as_ptr().add(i)),
                );
                let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(y, zero);
                packed |= (_mm256_movemask_ps(ge) as u32) << (8 * k);
                let q = _mm256_blendv_ps(minus, plus, ge);
                _mm256_storeu_ps(e.as_mut_ptr().add(i), _mm256_sub_ps(y, q));
            }
        }
        *word = packed;
    }
    if x.len() > 32 * full {
        let (x, e) = (&x[32 * full..], &mut e[32 * full..]);
        let mut lanes = [0.0f64; LANES];
        sign_pack_tail::<false>(x, e, &mut bits[full], &mut lanes);
        apply_quantisation_scalar(e, &bits[full..], s);
    }
}

/// The sign-bit masks of 8 lanes for each byte of sign bits: lane `l` gets
/// the f32 sign bit where bit `l` is 0 (a negative element).
const SIGN_TABLE: [[u32; 8]; 256] = {
    let mut table = [[0u32; 8]; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut l = 0;
        while l < 8 {
            if (byte >> l) & 1 == 0 {
                table[byte][l] = 0x8000_0000;
            }
            l += 1;
        }
        byte += 1;
    }
    table
};

/// AVX twin of the portable `apply_quantisation`.
#[target_feature(enable = "avx")]
pub(super) fn apply_quantisation(e: &mut [f32], bits: &[u32], s: f32) {
    let full = e.len() / 32;
    let sv = _mm256_set1_ps(s);
    for (w, &word) in bits[..full].iter().enumerate() {
        for k in 0..4 {
            let byte = ((word >> (8 * k)) & 0xff) as usize;
            let i = 32 * w + 8 * k;
            // SAFETY: the table row holds 8 u32; i + 8 <= 32 * full <= len.
            unsafe {
                let sign = _mm256_loadu_ps(SIGN_TABLE[byte].as_ptr().cast());
                let q = _mm256_xor_ps(sv, sign);
                let ev = _mm256_loadu_ps(e.as_ptr().add(i));
                _mm256_storeu_ps(e.as_mut_ptr().add(i), _mm256_sub_ps(ev, q));
            }
        }
    }
    if e.len() > 32 * full {
        apply_quantisation_scalar(&mut e[32 * full..], &bits[full..], s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use terse_rng::SplitMix64;

    /// The AVX loops give the portable loops' bits exactly, so a machine
    /// without AVX computes the same numbers.
    #[test]
    fn avx_loops_are_bit_identical_to_the_portable_ones() {
        if !std::arch::is_x86_feature_detected!("avx") {
            return;
        }
        let mut rng = SplitMix64::new(5);
        for len in [1usize, 31, 32, 33, 64, 1000, 4099] {
            let x: Vec<f32> = (0..len).map(|_| rng.normal()).collect();
            let e0: Vec<f32> = (0..len)
                .map(|i| if i % 13 == 0 { -0.0 } else { rng.normal() })
                .collect();
            let words = len.div_ceil(32);
            let (mut e1, mut e2) = (e0.clone(), e0.clone());
            let (mut b1, mut b2) = (vec![0u32; words], vec![0u32; words]);
            let s1 = sign_pack_with::<false>(&x, &mut e1, &mut b1);
            // SAFETY: AVX is present (checked above).
            let s2 = unsafe { sign_pack::<false>(&x, &mut e2, &mut b2) };
            assert_eq!((s1.to_bits(), &b1), (s2.to_bits(), &b2), "len {len} l1");
            let q1 = sign_pack_with::<true>(&x, &mut e1.clone(), &mut b1.clone());
            // SAFETY: as above.
            let q2 = unsafe { sign_pack::<true>(&x, &mut e2.clone(), &mut b2.clone()) };
            assert_eq!(q1.to_bits(), q2.to_bits(), "len {len} l2");
            apply_quantisation_scalar(&mut e1, &b1, 0.37);
            // SAFETY: as above.
            unsafe { apply_quantisation(&mut e2, &b2, 0.37) };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&e1), bits(&e2), "len {len}: errors");
            // The fused large-block passes: same sum, bits and errors.
            for squares in [false, true] {
                let sum = if squares {
                    // SAFETY: as above.
                    unsafe { scale_sum::<true>(&x, &e0) }
                } else {
                    // SAFETY: as above.
                    unsafe { scale_sum::<false>(&x, &e0) }
                };
                let mut scratch = (e0.clone(), vec![0u32; words]);
                let reference = if squares {
                    sign_pack_with::<true>(&x, &mut scratch.0, &mut scratch.1)
                } else {
                    sign_pack_with::<false>(&x, &mut scratch.0, &mut scratch.1)
                };
                assert_eq!(sum.to_bits(), reference.to_bits(), "len {len}: sum");
            }
            let mut e3 = e0.clone();
            let mut b3 = vec![0u32; words];
            // SAFETY: as above.
            unsafe { pack_quantise(&x, &mut e3, &mut b3, 0.37) };
            assert_eq!((&b3, bits(&e3)), (&b1, bits(&e1)), "len {len}: fused pass");
        }
    }
}
