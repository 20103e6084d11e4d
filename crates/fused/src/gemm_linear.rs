//! A linear layer's forward and backward as single 2-D gemm calls over all
//! rows (batch × sequence), on slices. burn's `linear` keeps an input of
//! `[8, 128, d]` as 8 batched gemms (its tiling policy keeps row counts
//! that are multiples of 32), which packs the weight 8 times, then adds the
//! bias in a pass of its own; here the bias is the destination the one gemm
//! accumulates into, and the bias gradient is a column sum in fixed row
//! blocks (the same bits on any thread count).

use rayon::prelude::*;

use super::rows::{ROWS_PER_TASK, add_in_block_order};

/// Products below this many multiply-adds run on one thread (flex's own
/// threshold: 192³).
const PARALLEL_THRESHOLD: usize = 192 * 192 * 192;

/// A weight `W` of shape `[k, n]` as it is stored: `[k, n]` row-major, or
/// (`transposed`, the tied MLM decoder) `[n, k]`.
#[derive(Debug, Clone, Copy)]
pub struct Weight<'a> {
    pub values: &'a [f32],
    pub k: usize,
    pub n: usize,
    pub transposed: bool,
}

impl Weight<'_> {
    /// Row and column strides of `W` (`[k, n]`) in its storage, after
    /// checking that the storage holds `k·n` values (the unsafe gemm calls
    /// read that many).
    fn strides(&self) -> (isize, isize) {
        assert_eq!(
            self.values.len(),
            self.k * self.n,
            "the weight holds {} values, not {} × {}",
            self.values.len(),
            self.k,
            self.n
        );
        if self.transposed {
            (1, self.k as isize)
        } else {
            (self.n as isize, 1)
        }
    }
}

fn parallelism(m: usize, n: usize, k: usize) -> gemm::Parallelism {
    if m.saturating_mul(n).saturating_mul(k) >= PARALLEL_THRESHOLD {
        // 0: the threads of the current rayon pool (the rank's own).
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    }
}

/// The parallelism of the products inside loops whose tasks (images,
/// heads) are the parallel level: one thread each.
pub(super) const ONE_THREAD: gemm::Parallelism = gemm::Parallelism::None;

/// `dst[m, n] (+)= A[m, k]·B[k, n]` (adding to `dst` when `read_dst`):
/// gemm's call with each operand given by its base pointer and (row,
/// column) strides in that order (gemm itself takes column stride first),
/// unit scaling.
///
/// # Safety
/// The pointers must cover the operands at those strides, and `dst` must
/// not overlap them.
pub(super) unsafe fn strided_gemm(
    (m, n, k): (usize, usize, usize),
    (dst, (d_rs, d_cs)): (*mut f32, (isize, isize)),
    read_dst: bool,
    (a, (a_rs, a_cs)): (*const f32, (isize, isize)),
    (b, (b_rs, b_cs)): (*const f32, (isize, isize)),
    parallelism: gemm::Parallelism,
) {
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            d_cs,
            d_rs,
            read_dst,
            a,
            a_cs,
            a_rs,
            b,
            b_cs,
            b_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `out + A[m, k]·B[k, n]`, row-major `[m, n]`, each operand given by its
/// base pointer and (row, column) strides, on the rank's pool above
/// [`PARALLEL_THRESHOLD`]. `out` holds the `m·n` values the product is
/// added to (a bias's rows), or none: then gemm writes the fresh buffer
/// without reading it (no zeroing pass first).
///
/// # Safety
/// The pointers must cover the operands at those strides.
unsafe fn product(
    (m, n, k): (usize, usize, usize),
    mut out: Vec<f32>,
    a: *const f32,
    a_strides: (isize, isize),
    b: *const f32,
    b_strides: (isize, isize),
) -> Vec<f32> {
    let len = m * n;
    let read_dst = !out.is_empty();
    assert!(!read_dst || out.len() == len, "out is not [{m}, {n}]");
    out.reserve_exact(len - out.len());
    // SAFETY: the caller's contract for a and b; out's buffer holds m·n
    // elements (initialised when read) and overlaps neither.
    unsafe {
        strided_gemm(
            (m, n, k),
            (out.as_mut_ptr(), (n as isize, 1)),
            read_dst,
            (a, a_strides),
            (b, b_strides),
            parallelism(m, n, k),
        );
        // gemm wrote all m·n elements.
        out.set_len(len);
    }
    out
}

/// `x[rows, k]·W + bias` (`bias` of length n), row-major `[rows, n]`.
pub fn linear_forward(x: &[f32], weight: Weight<'_>, bias: Option<&[f32]>) -> Vec<f32> {
    let (k, n) = (weight.k, weight.n);
    assert_eq!(x.len() % k.max(1), 0, "x is not [rows, {k}]");
    let rows = x.len() / k.max(1);
    let out = match bias {
        None if k == 0 => return vec![0.0; rows * n],
        None => Vec::new(),
        Some(bias) => {
            assert_eq!(bias.len(), n);
            let mut out = Vec::with_capacity(rows * n);
            for _ in 0..rows {
                out.extend_from_slice(bias);
            }
            out
        }
    };
    // SAFETY: x is [rows, k] and W covers [k, n] at its strides.
    unsafe {
        product(
            (rows, n, k),
            out,
            x.as_ptr(),
            (k as isize, 1),
            weight.values.as_ptr(),
            weight.strides(),
        )
    }
}

/// `∂x = ∂y[rows, n]·Wᵀ`, row-major `[rows, k]`.
pub fn linear_x_grad(grad: &[f32], weight: Weight<'_>) -> Vec<f32> {
    let (k, n) = (weight.k, weight.n);
    assert_eq!(grad.len() % n.max(1), 0, "the gradient is not [rows, {n}]");
    let rows = grad.len() / n.max(1);
    if n == 0 {
        return vec![0.0; rows * k];
    }
    let (w_rs, w_cs) = weight.strides();
    // SAFETY: grad is [rows, n]; Wᵀ ([n, k]) is W's storage with its
    // strides swapped.
    unsafe {
        product(
            (rows, k, n),
            Vec::new(),
            grad.as_ptr(),
            (n as isize, 1),
            weight.values.as_ptr(),
            (w_cs, w_rs),
        )
    }
}

/// `∂W` in W's stored layout: `xᵀ·∂y` (`[k, n]`), or for a transposed
/// weight `∂yᵀ·x` (`[n, k]`) directly — not a transpose of the other.
pub fn linear_weight_grad(x: &[f32], grad: &[f32], weight: Weight<'_>) -> Vec<f32> {
    let (k, n) = (weight.k, weight.n);
    let rows = grad.len() / n.max(1);
    assert_eq!(grad.len(), rows * n, "the gradient is not [rows, {n}]");
    assert_eq!(x.len(), rows * k, "x is not [{rows}, {k}]");
    if rows == 0 {
        return vec![0.0; k * n];
    }
    let (m_out, n_out, a, a_strides, b, b_strides) = if weight.transposed {
        // [n, k] = ∂yᵀ[n, rows]·x[rows, k]
        (n, k, grad, (1, n as isize), x, (k as isize, 1))
    } else {
        // [k, n] = xᵀ[k, rows]·∂y[rows, n]
        (k, n, x, (1, k as isize), grad, (n as isize, 1))
    };
    // SAFETY: both operands are row-major [rows, ·], read transposed or not
    // at these strides.
    unsafe {
        product(
            (m_out, n_out, rows),
            Vec::new(),
            a.as_ptr(),
            a_strides,
            b.as_ptr(),
            b_strides,
        )
    }
}

/// `∂bias`: the column sums of `∂y` `[rows, n]`, partial sums over fixed
/// blocks of rows added in block order (the same bits on any thread count).
pub fn linear_bias_grad(grad: &[f32], n: usize) -> Vec<f32> {
    if n == 0 {
        return Vec::new();
    }
    let partials: Vec<Vec<f32>> = grad
        .par_chunks(ROWS_PER_TASK * n)
        .map(|block| {
            let mut sums = vec![0.0f32; n];
            crate::with_avx(|| {
                for row in block.chunks(n) {
                    for (s, &g) in sums.iter_mut().zip(row) {
                        *s += g;
                    }
                }
            });
            sums
        })
        .collect();
    add_in_block_order(&partials, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(len: usize, salt: u64) -> Vec<f32> {
        let mut rng = terse_rng::SplitMix64::new(salt);
        (0..len)
            .map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// All four products against float64 loops, both weight layouts, odd
    /// sizes and one large enough for the threaded path.
    #[test]
    fn matches_a_float64_reference() {
        for (rows, k, n) in [(1, 1, 1), (7, 33, 5), (130, 257, 65), (300, 200, 150)] {
            for transposed in [false, true] {
                let x = draw(rows * k, 1);
                let w = draw(k * n, 2);
                let bias = draw(n, 3);
                let g = draw(rows * n, 4);
                let weight = Weight {
                    values: &w,
                    k,
                    n,
                    transposed,
                };
                let at = |l: usize, j: usize| {
                    f64::from(if transposed {
                        w[j * k + l]
                    } else {
                        w[l * n + j]
                    })
                };
                let close = |got: f32, want: f64, what: &str| {
                    assert!(
                        (f64::from(got) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{what} ({rows}, {k}, {n}, transposed {transposed}): {got} vs {want}"
                    );
                };
                let y = linear_forward(&x, weight, Some(&bias));
                let y0 = linear_forward(&x, weight, None);
                for i in 0..rows {
                    for j in 0..n {
                        let dot: f64 = (0..k).map(|l| f64::from(x[i * k + l]) * at(l, j)).sum();
                        close(y[i * n + j], dot + f64::from(bias[j]), "y");
                        close(y0[i * n + j], dot, "y without bias");
                    }
                }
                let dx = linear_x_grad(&g, weight);
                for i in 0..rows {
                    for l in 0..k {
                        let want: f64 = (0..n).map(|j| f64::from(g[i * n + j]) * at(l, j)).sum();
                        close(dx[i * k + l], want, "dx");
                    }
                }
                let dw = linear_weight_grad(&x, &g, weight);
                for l in 0..k {
                    for j in 0..n {
                        let want: f64 = (0..rows)
                            .map(|i| f64::from(x[i * k + l]) * f64::from(g[i * n + j]))
                            .sum();
                        let got = if transposed {
                            dw[j * k + l]
                        } else {
                            dw[l * n + j]
                        };
                        close(got, want, "dW");
                    }
                }
                let db = linear_bias_grad(&g, n);
                for j in 0..n {
                    let want: f64 = (0..rows).map(|i| f64::from(g[i * n + j])).sum();
                    close(db[j], want, "db");
                }
            }
        }
    }
}
