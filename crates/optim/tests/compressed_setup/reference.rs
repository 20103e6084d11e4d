//! The float64 references the compressed-optimizer tests share: the
//! compressed allreduce of ALGORITHMS.md and the mean over ranks, and how
//! a run's parameters are held against them.

#![allow(dead_code)]
// The reference indexes by rank and element to read like ALGORITHMS.md.
#![allow(clippy::needless_range_loop)]

use terse_optim::ParamLayout;

/// The compressed allreduce of ALGORITHMS.md in f64: one l1 scale per
/// chunk, worker errors `we` (per rank) and server errors `se` (per rank,
/// over the whole buffer for simplicity: rank j uses its chunk). A world of
/// one returns its input: there is nothing to average.
pub fn compressed_allreduce(
    inputs: &[Vec<f64>],
    we: &mut [Vec<f64>],
    se: &mut [Vec<f64>],
) -> Vec<f64> {
    let n = inputs.len();
    if n == 1 {
        return inputs[0].clone();
    }
    let d = inputs[0].len();
    let chunk = d.div_ceil(n).div_ceil(32) * 32;
    let compress = |y: &[f64]| -> Vec<f64> {
        let s = y.iter().map(|v| v.abs()).sum::<f64>() / y.len() as f64;
        y.iter().map(|&v| if v >= 0.0 { s } else { -s }).collect()
    };
    let mut deq = vec![vec![0.0; d]; n];
    for i in 0..n {
        for start in (0..d).step_by(chunk) {
            let r = start..(start + chunk).min(d);
            let y: Vec<f64> = r.clone().map(|k| inputs[i][k] + we[i][k]).collect();
            let q = compress(&y);
            for (o, k) in r.enumerate() {
                we[i][k] = y[o] - q[o];
                deq[i][k] = q[o];
            }
        }
    }
    let mut out = vec![0.0; d];
    for (j, start) in (0..d).step_by(chunk).enumerate() {
        let r = start..(start + chunk).min(d);
        let z: Vec<f64> = r
            .clone()
            .map(|k| (0..n).map(|i| deq[i][k]).sum::<f64>() / n as f64 + se[j][k])
            .collect();
        let q = compress(&z);
        for (o, k) in r.enumerate() {
            se[j][k] = z[o] - q[o];
            out[k] = q[o];
        }
    }
    out
}

/// The mean over ranks of per-rank vectors.
pub fn mean(v: &[Vec<f64>]) -> Vec<f64> {
    (0..v[0].len())
        .map(|k| v.iter().map(|x| x[k]).sum::<f64>() / v.len() as f64)
        .collect()
}

/// Worst per-segment relative error of `got` (every rank) against `want`.
pub fn worst(layout: &ParamLayout, got: &[Vec<f32>], want: &[Vec<f64>]) -> f64 {
    let mut worst = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        for seg in layout.segments() {
            let size = seg
                .range()
                .map(|k| w[k].abs())
                .fold(0.0, f64::max)
                .max(1e-30);
            for k in seg.range() {
                worst = worst.max((f64::from(g[k]) - w[k]).abs() / size);
            }
        }
    }
    worst
}

/// Whether every rank's parameters are rank 0's, bit for bit.
pub fn same_on_every_rank(x: &[Vec<f32>]) -> bool {
    x.iter()
        .all(|r| r.iter().zip(&x[0]).all(|(a, b)| a.to_bits() == b.to_bits()))
}
