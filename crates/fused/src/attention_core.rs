//! The attention core `dropout(softmax(q·kᵀ·scale + bias))·v`, forward and
//! backward, one task per (batch, head), on slices in the linear layers'
//! own `[batch, seq, heads·head_dim]` layout.
//!
//! Before, the model split the heads into `[batch, heads, seq, head_dim]`
//! views and burn's batched matmul copied each into contiguous storage and
//! multiplied 96 (BERT-base) small matrices per product, every step
//! (attention was 0.32 s of BERT-base's 3.2 s step, its products ~0.06 s of
//! that). Here each head's products are single-threaded gemm calls that
//! read q, k, v and write the context and the gradients at the heads'
//! strides, and the softmax of a head's rows runs while its scores are in
//! cache. Heads are independent, so the bits do not depend on the thread
//! count. The probabilities `[batch, heads, seq, seq]` are kept for the
//! backward pass; the dropout mask is regenerated, indexed over that
//! tensor exactly as before.

use rayon::prelude::*;

use super::attention_probs::{softmax_row, softmax_row_backward};
use super::gemm_linear::{ONE_THREAD, strided_gemm};
use terse_compress::dropout::SiteMask;

/// `[batch, seq, heads·head_dim]` inputs, `bias` `[batch, seq]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadsShape {
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence (queries and keys).
    pub seq: usize,
    /// Attention heads.
    pub heads: usize,
    /// Values per head.
    pub head_dim: usize,
}

impl HeadsShape {
    fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }

    fn len(&self) -> usize {
        self.batch * self.seq * self.hidden()
    }

    /// Offset of head `task = b·heads + h` in a `[batch, seq, hidden]`
    /// tensor (its rows are `hidden` apart).
    fn head_offset(&self, task: usize) -> usize {
        let (b, h) = (task / self.heads, task % self.heads);
        b * self.seq * self.hidden() + h * self.head_dim
    }
}

/// A raw output pointer the head tasks write disjoint strided parts of.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: each task writes only its own head's positions (see the users).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: callers pass offsets inside the buffer.
        unsafe { self.0.add(offset) }
    }
}

fn check(shape: &HeadsShape, tensors: &[&[f32]], bias: Option<&[f32]>) {
    for t in tensors {
        assert_eq!(t.len(), shape.len(), "attention input is not {shape:?}");
    }
    if let Some(bias) = bias {
        assert_eq!(bias.len(), shape.batch * shape.seq, "attention bias");
    }
}

/// A head's `[t, d]` at row stride `hd` (from `a`) times another's
/// transposed (from `b`) into the `[t, t]` `dst`: the scores q·kᵀ and
/// ∂dropped = ∂context·vᵀ.
///
/// # Safety
/// `a` and `b` must cover a head's `[t, d]` at row stride `hd`, and `dst`
/// must hold `t·t` values.
unsafe fn head_times_head_t(
    (t, d, hd): (usize, usize, isize),
    dst: &mut [f32],
    a: *const f32,
    b: *const f32,
) {
    assert_eq!(dst.len(), t * t);
    // SAFETY: the caller's contract.
    unsafe {
        strided_gemm(
            (t, t, d),
            (dst.as_mut_ptr(), (t as isize, 1)),
            false,
            (a, (hd, 1)),
            (b, (1, hd)),
            ONE_THREAD,
        );
    }
}

/// The `[t, t]` `square` (or its transpose) times a head's `[t, d]` at row
/// stride `hd` (from `head`) into a head's `[t, d]` at `dst`, same stride:
/// the context P·v and the gradients ∂v, ∂q, ∂k.
///
/// # Safety
/// `head` and `dst` must cover a head's `[t, d]` at row stride `hd`, `dst`
/// overlapping neither input, and `square` must hold `t·t` values.
unsafe fn square_times_head(
    (t, d, hd): (usize, usize, isize),
    dst: *mut f32,
    square: &[f32],
    transposed: bool,
    head: *const f32,
) {
    assert_eq!(square.len(), t * t);
    let square_strides = if transposed {
        (1, t as isize)
    } else {
        (t as isize, 1)
    };
    // SAFETY: the caller's contract.
    unsafe {
        strided_gemm(
            (t, d, t),
            (dst, (hd, 1)),
            false,
            (square.as_ptr(), square_strides),
            (head, (hd, 1)),
            ONE_THREAD,
        );
    }
}

/// `(context [batch, seq, hidden], probabilities [batch, heads, seq, seq])`.
pub fn attention_forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    bias: &[f32],
    s: &HeadsShape,
    scale: f32,
    mask: Option<&SiteMask>,
) -> (Vec<f32>, Vec<f32>) {
    check(s, &[q, k, v], Some(bias));
    let (t, d, hd) = (s.seq, s.head_dim, s.hidden() as isize);
    let dims = (t, d, hd);
    let mut context = vec![0.0f32; s.len()];
    let mut probs = vec![0.0f32; s.batch * s.heads * t * t];
    if t == 0 || d == 0 {
        return (context, probs);
    }
    let out = Out(context.as_mut_ptr());
    probs.par_chunks_mut(t * t).enumerate().for_each_init(
        || vec![0.0f32; t * t],
        |scratch, (task, p)| {
            let at = s.head_offset(task);
            let b = &bias[task / s.heads * t..][..t];
            // SAFETY: q and k cover this head's [t, d] at row stride
            // hd; scratch is [t, t].
            unsafe { head_times_head_t(dims, scratch, q.as_ptr().add(at), k.as_ptr().add(at)) };
            // Small closures for `with_avx`, which LLVM inlines into its
            // AVX function (one closure around both loops stayed a
            // baseline call, the mask's hash scalar).
            for (p, sc) in p.chunks_mut(t).zip(scratch.chunks(t)) {
                crate::with_avx(|| softmax_row(sc, b, scale, p));
            }
            if let Some(mask) = mask {
                scratch.copy_from_slice(p);
                crate::with_avx(|| mask.apply_at(task * t * t, scratch));
            }
            let dropped: &[f32] = if mask.is_some() { scratch } else { p };
            // SAFETY: dropped is [t, t], v covers the head's [t, d] at
            // row stride hd, and only this task writes this head's
            // positions of the context.
            unsafe { square_times_head(dims, out.at(at), dropped, false, v.as_ptr().add(at)) };
        },
    );
    (context, probs)
}

/// The gradients `(∂q, ∂k, ∂v)` (each when wanted) for the context's
/// gradient `grad`, from the forward's inputs and probabilities.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    grad: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    probs: &[f32],
    s: &HeadsShape,
    scale: f32,
    mask: Option<&SiteMask>,
) -> [Vec<f32>; 3] {
    check(s, &[grad, q, k, v], None);
    let (t, d, hd) = (s.seq, s.head_dim, s.hidden() as isize);
    let dims = (t, d, hd);
    assert_eq!(
        probs.len(),
        s.batch * s.heads * t * t,
        "attention probabilities"
    );
    let mut grads = [0; 3].map(|_| vec![0.0f32; s.len()]);
    if t == 0 || d == 0 {
        return grads;
    }
    let [dq, dk, dv] = grads.each_mut().map(|g| Out(g.as_mut_ptr()));
    probs.par_chunks(t * t).enumerate().for_each_init(
        || (vec![0.0f32; t * t], vec![0.0f32; t * t]),
        |(dropped, ds), (task, p)| {
            let at = s.head_offset(task);
            let dropped: &[f32] = match mask {
                Some(mask) => {
                    dropped.copy_from_slice(p);
                    crate::with_avx(|| mask.apply_at(task * t * t, dropped));
                    dropped
                }
                None => p,
            };
            // SAFETY (every product): the head's q, k, v, grad and
            // gradients are [t, d] at row stride hd from `at`; dropped and
            // ds are [t, t]; only this task writes this head's positions.
            unsafe {
                // ∂v = droppedᵀ·∂context
                square_times_head(dims, dv.at(at), dropped, true, grad.as_ptr().add(at));
                // ∂dropped = ∂context·vᵀ
                head_times_head_t(dims, ds, grad.as_ptr().add(at), v.as_ptr().add(at));
            }
            if let Some(mask) = mask {
                crate::with_avx(|| mask.apply_at(task * t * t, ds));
            }
            for (h, p) in ds.chunks_mut(t).zip(p.chunks(t)) {
                crate::with_avx(|| softmax_row_backward(h, p, scale));
            }
            unsafe {
                // ∂q = ∂s·k
                square_times_head(dims, dq.at(at), ds, false, k.as_ptr().add(at));
                // ∂k = ∂sᵀ·q
                square_times_head(dims, dk.at(at), ds, true, q.as_ptr().add(at));
            }
        },
    );
    grads
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forward and backward against the definition in float64: the
    /// products, the softmax with a padding bias, the dropout mask indexed
    /// over `[batch, heads, seq, seq]`.
    #[test]
    fn matches_a_float64_reference_with_padding_and_dropout() {
        let s = HeadsShape {
            batch: 2,
            seq: 7,
            heads: 3,
            head_dim: 4,
        };
        let (t, nh, d, hd) = (s.seq, s.heads, s.head_dim, s.hidden());
        let mut rng = terse_rng::SplitMix64::new(9);
        let mut draw = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let (q, k, v, g) = (draw(s.len()), draw(s.len()), draw(s.len()), draw(s.len()));
        // The last 2 keys of sequence 1 are padding.
        let bias: Vec<f32> = (0..s.batch * t)
            .map(|i| {
                if i / t == 1 && i % t >= t - 2 {
                    f32::MIN
                } else {
                    0.0
                }
            })
            .collect();
        let scale = 0.5f32;
        for prob in [0.0f32, 0.1] {
            let mask = (prob > 0.0).then(|| SiteMask::new(prob, 99));
            let (context, probs) = attention_forward(&q, &k, &v, &bias, &s, scale, mask.as_ref());
            let [dq, dk, dv] = attention_backward(&g, &q, &k, &v, &probs, &s, scale, mask.as_ref());
            let at = |b: usize, i: usize, h: usize, x: usize| (b * t + i) * hd + h * d + x;
            let f = |v: &[f32], i: usize| f64::from(v[i]);
            let mut want = [0; 4].map(|_| vec![0.0f64; s.len()]);
            for b in 0..s.batch {
                for h in 0..nh {
                    let m = |i: usize, j: usize| {
                        mask.map_or(1.0, |m| f64::from(m.factor(((b * nh + h) * t + i) * t + j)))
                    };
                    // Row i of one operand's head dotted with row j of another's.
                    let head_dot = |a: &[f32], i: usize, c: &[f32], j: usize| -> f64 {
                        (0..d)
                            .map(|x| f(a, at(b, i, h, x)) * f(c, at(b, j, h, x)))
                            .sum()
                    };
                    let mut p = vec![vec![0.0f64; t]; t];
                    for i in 0..t {
                        let z: Vec<f64> = (0..t)
                            .map(|j| {
                                head_dot(&q, i, &k, j) * f64::from(scale)
                                    + f64::from(bias[b * t + j])
                            })
                            .collect();
                        let max = z.iter().cloned().fold(f64::MIN, f64::max);
                        let total: f64 = z.iter().map(|z| (z - max).exp()).sum();
                        for j in 0..t {
                            p[i][j] = (z[j] - max).exp() / total;
                            let got = f64::from(probs[((b * nh + h) * t + i) * t + j]);
                            assert!((got - p[i][j]).abs() < 1e-6, "p {got} vs {}", p[i][j]);
                        }
                    }
                    let mut ds = vec![vec![0.0f64; t]; t];
                    for i in 0..t {
                        let hrow: Vec<f64> =
                            (0..t).map(|j| head_dot(&g, i, &v, j) * m(i, j)).collect();
                        let dot: f64 = (0..t).map(|j| hrow[j] * p[i][j]).sum();
                        for j in 0..t {
                            ds[i][j] = f64::from(scale) * p[i][j] * (hrow[j] - dot);
                        }
                    }
                    for i in 0..t {
                        for x in 0..d {
                            want[0][at(b, i, h, x)] = (0..t)
                                .map(|j| p[i][j] * m(i, j) * f(&v, at(b, j, h, x)))
                                .sum();
                            want[1][at(b, i, h, x)] =
                                (0..t).map(|j| ds[i][j] * f(&k, at(b, j, h, x))).sum();
                            want[2][at(b, i, h, x)] =
                                (0..t).map(|j| ds[j][i] * f(&q, at(b, j, h, x))).sum();
                            want[3][at(b, i, h, x)] = (0..t)
                                .map(|j| p[j][i] * m(j, i) * f(&g, at(b, j, h, x)))
                                .sum();
                        }
                    }
                }
            }
            for (name, got, want) in [
                ("context", &context, &want[0]),
                ("∂q", &dq, &want[1]),
                ("∂k", &dk, &want[2]),
                ("∂v", &dv, &want[3]),
            ] {
                for (g, w) in got.iter().zip(want) {
                    assert!(
                        (f64::from(*g) - w).abs() < 2e-6,
                        "{name} (p {prob}): {g} vs {w}"
                    );
                }
            }
        }
    }
}
