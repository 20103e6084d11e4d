//! LayerNorm over the last dimension, forward and backward in one pass
//! over each row (burn's autodiff records it as ~10 primitive ops, each a
//! full pass and an allocation).
//!
//! Forward: `x̂ = (x − μ)·r`, `r = 1/√(σ² + ε)` (σ² biased, as PyTorch),
//! `y = γ·x̂ + β`. Backward with `u = γ·∂y`: `∂x = r·(u − mean(u) −
//! x̂·mean(u·x̂))`, `∂γ = Σ_rows ∂y·x̂`, `∂β = Σ_rows ∂y`.

use rayon::prelude::*;

use super::rows::{for_row_blocks, for_row_blocks_summing, sum};

/// Per-row statistics the backward pass needs.
#[derive(Debug, Clone, Default)]
pub struct LayerNormStats {
    /// μ per row.
    pub mean: Vec<f32>,
    /// `1/√(σ² + ε)` per row.
    pub rstd: Vec<f32>,
}

/// `y` from `x` (rows of width `d = gamma.len()`).
pub fn layer_norm_forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    y: &mut [f32],
) -> LayerNormStats {
    let d = gamma.len();
    assert_eq!(beta.len(), d);
    assert_eq!(x.len(), y.len());
    // Statistics first (one cheap pass per row, in parallel), then the
    // output rows.
    let stats: Vec<(f32, f32)> = x
        .par_chunks(d.max(1))
        .map(|x| {
            crate::with_avx(|| {
                let mean = sum(d, |j| x[j]) / d as f32;
                let var = sum(d, |j| (x[j] - mean) * (x[j] - mean)) / d as f32;
                (mean, 1.0 / (var + eps).sqrt())
            })
        })
        .collect();
    for_row_blocks(y, d, |first, out| {
        for (r, out) in out.chunks_mut(d).enumerate() {
            let row = first + r;
            let x = &x[row * d..(row + 1) * d];
            let (mean, rstd) = stats[row];
            for j in 0..d {
                out[j] = (x[j] - mean) * rstd * gamma[j] + beta[j];
            }
        }
    });
    let (mean, rstd) = stats.into_iter().unzip();
    LayerNormStats { mean, rstd }
}

/// Gradients of `x`, `γ` and `β` from `∂y`.
pub fn layer_norm_backward(
    grad: &[f32],
    x: &[f32],
    gamma: &[f32],
    stats: &LayerNormStats,
    dx: &mut [f32],
) -> (Vec<f32>, Vec<f32>) {
    let d = gamma.len();
    assert_eq!(grad.len(), x.len());
    assert_eq!(dx.len(), x.len());
    let both = for_row_blocks_summing(dx, d, 2 * d, |first, out, partial| {
        let (dgamma, dbeta) = partial.split_at_mut(d);
        for (r, out) in out.chunks_mut(d).enumerate() {
            let row = first + r;
            let (mean, rstd) = (stats.mean[row], stats.rstd[row]);
            let x = &x[row * d..(row + 1) * d];
            let g = &grad[row * d..(row + 1) * d];
            let xhat = |j: usize| (x[j] - mean) * rstd;
            let mean_u = sum(d, |j| gamma[j] * g[j]) / d as f32;
            let mean_ux = sum(d, |j| gamma[j] * g[j] * xhat(j)) / d as f32;
            for j in 0..d {
                let xh = xhat(j);
                out[j] = rstd * (gamma[j] * g[j] - mean_u - xh * mean_ux);
                dgamma[j] += g[j] * xh;
                dbeta[j] += g[j];
            }
        }
    });
    let (dgamma, dbeta) = both.split_at(d);
    (dgamma.to_vec(), dbeta.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// float64 LayerNorm and its gradients, written from the definition.
    fn reference(x: &[f64], g: &[f64], gamma: &[f64], beta: &[f64], eps: f64) -> [Vec<f64>; 4] {
        let d = gamma.len();
        let (mut y, mut dx) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        let (mut dgamma, mut dbeta) = (vec![0.0; d], vec![0.0; d]);
        for row in 0..x.len() / d {
            let x = &x[row * d..(row + 1) * d];
            let g = &g[row * d..(row + 1) * d];
            let mean = x.iter().sum::<f64>() / d as f64;
            let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
            let r = 1.0 / (var + eps).sqrt();
            let xh: Vec<f64> = x.iter().map(|v| (v - mean) * r).collect();
            let u: Vec<f64> = (0..d).map(|j| gamma[j] * g[j]).collect();
            let mu = u.iter().sum::<f64>() / d as f64;
            let mux = (0..d).map(|j| u[j] * xh[j]).sum::<f64>() / d as f64;
            for j in 0..d {
                y[row * d + j] = gamma[j] * xh[j] + beta[j];
                dx[row * d + j] = r * (u[j] - mu - xh[j] * mux);
                dgamma[j] += g[j] * xh[j];
                dbeta[j] += g[j];
            }
        }
        [y, dx, dgamma, dbeta]
    }

    #[test]
    fn matches_a_float64_reference() {
        let mut rng = terse_rng::SplitMix64::new(3);
        let mut draw = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.next_u64() % 2001) as f32 / 500.0 - 2.0)
                .collect()
        };
        for (rows, d) in [(1, 1), (3, 7), (33, 64), (17, 771)] {
            let (x, g, gamma, beta) = (draw(rows * d), draw(rows * d), draw(d), draw(d));
            let mut y = vec![0.0; x.len()];
            let stats = layer_norm_forward(&x, &gamma, &beta, 1e-12, &mut y);
            let mut dx = vec![0.0; x.len()];
            let (dgamma, dbeta) = layer_norm_backward(&g, &x, &gamma, &stats, &mut dx);
            let f = |v: &[f32]| v.iter().map(|&a| f64::from(a)).collect::<Vec<_>>();
            let want = reference(&f(&x), &f(&g), &f(&gamma), &f(&beta), 1e-12);
            for (got, want) in [&y, &dx, &dgamma, &dbeta].into_iter().zip(&want) {
                let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
                for (a, b) in got.iter().zip(want) {
                    assert!(
                        (f64::from(*a) - b).abs() <= 2e-5 * scale,
                        "rows {rows} d {d}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
