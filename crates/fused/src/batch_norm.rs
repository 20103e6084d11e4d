//! Training-mode BatchNorm over `[batch, channels, plane…]`, with the ReLU
//! that follows it in ResNet and VGG optionally fused in: two passes
//! forward (statistics, then `x·scale + shift`), two backward (per-channel
//! sums, then `∂x`). burn's generic `batch_norm_train` and its backward
//! are chains of a dozen whole-tensor ops, each single-threaded on flex
//! below 4M elements.
//!
//! Sums run per plane in f32 with 8 accumulators (planes in parallel, in
//! memory order) and across a channel's planes in f64 in sample order, so
//! the bits do not depend on the thread count.

use rayon::prelude::*;

/// Elements per parallel task of the elementwise passes.
const ELEMENTS_PER_TASK: usize = 1 << 14;

/// `[batch, channels, plane]`: the layout the kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchNormShape {
    /// Samples.
    pub batch: usize,
    /// Channels (dimension 1), each with its own statistics.
    pub channels: usize,
    /// Elements per channel of one sample (`h·w` for images).
    pub plane: usize,
}

impl BatchNormShape {
    fn len(&self) -> usize {
        self.batch * self.channels * self.plane
    }

    /// Values per channel: the count the statistics average over.
    fn count(&self) -> usize {
        self.batch * self.plane
    }
}

/// The batch statistics of one forward pass, per channel: mean, biased
/// variance (what running statistics are fed) and `1/√(var + ε)`.
#[derive(Debug, Clone)]
pub struct BatchNormStats {
    /// Mean per channel.
    pub mean: Vec<f32>,
    /// Biased variance per channel (divided by the count, not count − 1).
    pub var: Vec<f32>,
    /// `1/√(var + ε)` per channel.
    pub inv_std: Vec<f32>,
}

/// Per channel `c`, `K` sums over the samples of `f(c, start of the plane)`
/// in f64, in sample order from -0.0 (as `Iterator::sum` adds them). The
/// planes' values are computed in memory order, in parallel over runs of
/// planes, and only then summed per channel: a channel at a time read its
/// planes one sample apart (a 256-byte plane every 16 KB at ResNet's 8×8
/// stage), which the prefetcher does not follow.
fn channel_sums<const K: usize>(
    s: &BatchNormShape,
    f: impl Fn(usize, usize) -> [f32; K] + Sync,
) -> Vec<[f64; K]> {
    let planes_per_task = ELEMENTS_PER_TASK.div_ceil(s.plane.max(1));
    let per_plane: Vec<[f32; K]> = (0..s.batch * s.channels)
        .into_par_iter()
        .with_min_len(planes_per_task)
        .map(|q| crate::with_avx(|| f(q % s.channels, q * s.plane)))
        .collect();
    (0..s.channels)
        .map(|c| {
            let mut sums = [-0.0f64; K];
            for b in 0..s.batch {
                for (sum, &v) in sums.iter_mut().zip(&per_plane[b * s.channels + c]) {
                    *sum += f64::from(v);
                }
            }
            sums
        })
        .collect()
}

/// `Σ term(a[j], b[j])` with 8 accumulators over whole chunks (so the loop
/// vectorises), combined in a fixed order.
#[inline(always)]
fn paired_sum(a: &[f32], b: &[f32], term: impl Fn(f32, f32) -> f32) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0.0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (a_tail, b_tail) = (a_chunks.remainder(), b_chunks.remainder());
    for (a, b) in a_chunks.zip(b_chunks) {
        for lane in 0..LANES {
            acc[lane] += term(a[lane], b[lane]);
        }
    }
    let tail: f32 = a_tail.iter().zip(b_tail).map(|(&a, &b)| term(a, b)).sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Per channel, `(scale, shift)` with `y = x·scale + shift`.
fn affine(gamma: &[f32], beta: &[f32], stats: &BatchNormStats) -> Vec<(f32, f32)> {
    (0..gamma.len())
        .map(|c| {
            let scale = gamma[c] * stats.inv_std[c];
            (scale, beta[c] - stats.mean[c] * scale)
        })
        .collect()
}

/// Normalises `x` with its batch statistics into `out` (with `relu`,
/// `max(0, ·)` of that) and returns the statistics.
pub fn batch_norm_forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    s: BatchNormShape,
    eps: f32,
    relu: bool,
    out: &mut [f32],
) -> BatchNormStats {
    assert_eq!(x.len(), s.len(), "batch norm input is not {s:?}");
    assert_eq!(out.len(), s.len());
    assert_eq!(gamma.len(), s.channels);
    assert_eq!(beta.len(), s.channels);
    let n = s.count().max(1) as f64;
    let plane = |at: usize| &x[at..at + s.plane];
    let means: Vec<f32> = channel_sums(&s, |_, at| [paired_sum(plane(at), plane(at), |v, _| v)])
        .iter()
        .map(|[total]| (total / n) as f32)
        .collect();
    let moments: Vec<(f32, f32)> = channel_sums(&s, |c, at| {
        let mean = means[c];
        [paired_sum(plane(at), plane(at), |v, _| {
            (v - mean) * (v - mean)
        })]
    })
    .iter()
    .zip(&means)
    .map(|([squares], &mean)| (mean, (squares / n) as f32))
    .collect();
    let stats = BatchNormStats {
        mean: moments.iter().map(|m| m.0).collect(),
        var: moments.iter().map(|m| m.1).collect(),
        inv_std: moments.iter().map(|m| 1.0 / (m.1 + eps).sqrt()).collect(),
    };
    let coef = affine(gamma, beta, &stats);
    for_planes(out, s.plane, |first_plane, out| {
        for (i, o) in out.chunks_mut(s.plane).enumerate() {
            let plane = first_plane + i;
            let (scale, shift) = coef[plane % s.channels];
            let x = &x[plane * s.plane..][..s.plane];
            if relu {
                for (o, x) in o.iter_mut().zip(x) {
                    *o = (x * scale + shift).max(0.0);
                }
            } else {
                for (o, x) in o.iter_mut().zip(x) {
                    *o = x * scale + shift;
                }
            }
        }
    });
    stats
}

/// Turns the output gradient `grad` into `∂x` in place and returns
/// `(∂γ, ∂β)`. `x`, `gamma`, `beta`, `stats` and `relu` are the forward's;
/// with `relu` the mask (output > 0) is recomputed from them bit for bit.
pub fn batch_norm_backward(
    grad: &mut [f32],
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    stats: &BatchNormStats,
    s: BatchNormShape,
    relu: bool,
) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(x.len(), s.len(), "batch norm input is not {s:?}");
    assert_eq!(grad.len(), s.len(), "batch norm gradient is not {s:?}");
    let coef = affine(gamma, beta, stats);
    // The output gradient where the ReLU passed it (output > 0, computed
    // as the forward computed it), all of it without ReLU.
    let passed = move |g: f32, x: f32, (scale, shift): (f32, f32)| -> f32 {
        if relu && x * scale + shift <= 0.0 {
            0.0
        } else {
            g
        }
    };
    let grad_ro: &[f32] = grad;
    // Σ g, and Σ g·x̂ = inv_std · Σ g·(x − mean), each plane's two while
    // it is in cache.
    let sums: Vec<(f32, f32)> = channel_sums(&s, |c, i| {
        let (mean, k) = (stats.mean[c], coef[c]);
        let (g, x) = (&grad_ro[i..i + s.plane], &x[i..i + s.plane]);
        [
            paired_sum(g, x, |g, x| passed(g, x, k)),
            paired_sum(g, x, |g, x| passed(g, x, k) * (x - mean)),
        ]
    })
    .iter()
    .zip(&stats.inv_std)
    .map(|([dbeta, centered], &inv_std)| (*dbeta as f32, (centered * f64::from(inv_std)) as f32))
    .collect();
    let n = s.count().max(1) as f32;
    for_planes(grad, s.plane, |first_plane, g| {
        for (i, g) in g.chunks_mut(s.plane).enumerate() {
            let plane = first_plane + i;
            let c = plane % s.channels;
            let (dbeta, dgamma) = sums[c];
            let (mean, inv_std, k) = (stats.mean[c], stats.inv_std[c], coef[c]);
            let scale = gamma[c] * inv_std;
            let (db_n, dg_n) = (dbeta / n, dgamma / n);
            let x = &x[plane * s.plane..][..s.plane];
            for (g, &x) in g.iter_mut().zip(x) {
                let x_hat = (x - mean) * inv_std;
                *g = scale * (passed(*g, x, k) - db_n - x_hat * dg_n);
            }
        }
    });
    (
        sums.iter().map(|s| s.1).collect(),
        sums.iter().map(|s| s.0).collect(),
    )
}

/// Calls `f(first_plane, planes)` over whole planes of `out` in parallel.
fn for_planes(out: &mut [f32], plane: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if plane == 0 {
        return;
    }
    let planes_per_task = ELEMENTS_PER_TASK.div_ceil(plane);
    out.par_chunks_mut(planes_per_task * plane)
        .enumerate()
        .for_each(|(task, out)| crate::with_avx(|| f(task * planes_per_task, out)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_and_gradients_match_a_float64_reference() {
        let s = BatchNormShape {
            batch: 3,
            channels: 2,
            plane: 5,
        };
        let x: Vec<f32> = (0..s.len())
            .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let g: Vec<f32> = (0..s.len())
            .map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.1)
            .collect();
        let (gamma, beta) = (vec![1.5, -0.5], vec![0.2, 0.1]);
        let eps = 1e-5;
        for relu in [false, true] {
            let mut out = vec![0.0; s.len()];
            let stats = batch_norm_forward(&x, &gamma, &beta, s, eps, relu, &mut out);
            let mut dx = g.clone();
            let (dgamma, dbeta) = batch_norm_backward(&mut dx, &x, &gamma, &beta, &stats, s, relu);
            for c in 0..s.channels {
                let idx: Vec<usize> = (0..s.batch)
                    .flat_map(|b| (0..s.plane).map(move |j| (b * s.channels + c) * s.plane + j))
                    .collect();
                let n = idx.len() as f64;
                let mean = idx.iter().map(|&i| f64::from(x[i])).sum::<f64>() / n;
                let var = idx
                    .iter()
                    .map(|&i| (f64::from(x[i]) - mean).powi(2))
                    .sum::<f64>()
                    / n;
                let r = 1.0 / (var + f64::from(eps)).sqrt();
                let (ga, be) = (f64::from(gamma[c]), f64::from(beta[c]));
                let xh = |i: usize| (f64::from(x[i]) - mean) * r;
                let y = |i: usize| xh(i) * ga + be;
                let dy = |i: usize| {
                    if relu && y(i) <= 0.0 {
                        0.0
                    } else {
                        f64::from(g[i])
                    }
                };
                let db: f64 = idx.iter().map(|&i| dy(i)).sum();
                let dg: f64 = idx.iter().map(|&i| dy(i) * xh(i)).sum();
                assert!((f64::from(stats.mean[c]) - mean).abs() < 1e-6);
                assert!((f64::from(stats.var[c]) - var).abs() < 1e-6);
                assert!((f64::from(dbeta[c]) - db).abs() < 1e-5);
                assert!((f64::from(dgamma[c]) - dg).abs() < 1e-5);
                for &i in &idx {
                    let want_y = if relu { y(i).max(0.0) } else { y(i) };
                    assert!((f64::from(out[i]) - want_y).abs() < 1e-5);
                    let want_dx = ga * r * (dy(i) - db / n - xh(i) * dg / n);
                    assert!(
                        (f64::from(dx[i]) - want_dx).abs() < 1e-5,
                        "relu {relu}, {i}"
                    );
                }
            }
        }
    }
}
