//! The communication-efficient optimizers against a float64 re-implementation
//! of ALGORITHMS.md written here (the compressed allreduce included), on
//! `local` worlds of 1, 2 and 4 ranks, 32 steps spanning warmup → freeze →
//! compression, a different random gradient per rank and step. Parameters
//! must stay within 1e-4 (worst per-segment relative error) of the reference
//! on every rank after every step, and be bit-identical on all ranks (1-bit
//! optimizers: every step; SLAMB: right after each model sync).

// The reference indexes by rank and element to read like ALGORITHMS.md.
#![allow(clippy::needless_range_loop)]

use terse_kernels::mask::{Mask, Selection};
use terse_optim::{
    EpsMode, MomentConfig, OneBitAdamConfig, OneBitLambConfig, OptimizerConfig, ParamLayout,
    RatioKind, SlambConfig, Stage, WithMoments,
};

mod compressed_setup;
use compressed_setup::reference::{compressed_allreduce, mean, same_on_every_rank, worst};
use compressed_setup::*;

// ---------------------------------------------------------------- reference

/// Adam's denominator per ALGORITHMS.md: ε outside or inside the root, and
/// `inside_compressed` inside only while compressing.
fn denominator(mode: EpsMode, compressing: bool, v: f64, eps: f64) -> f64 {
    match mode {
        EpsMode::Inside => (v + eps).sqrt(),
        EpsMode::InsideCompressed if compressing => (v + eps).sqrt(),
        EpsMode::Outside | EpsMode::InsideCompressed => v.sqrt() + eps,
    }
}

/// The decoupled weight decay of a segment: the configured rate where it
/// decays, none where it does not.
fn weight_decay(decays: bool, moments: &MomentConfig) -> f64 {
    if decays { moments.weight_decay } else { 0.0 }
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

fn trust(x: f64, u: f64, lo: f64, hi: f64) -> f64 {
    if x == 0.0 || u == 0.0 {
        1.0
    } else {
        (x / u).clamp(lo, hi)
    }
}

/// Reference state, per rank where the algorithm keeps it per rank.
struct Reference {
    n: usize,
    layout: ParamLayout,
    x: Vec<Vec<f64>>,
    m: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
    v_fresh: Vec<f64>,
    c: Vec<Vec<f64>>,
    we: Vec<Vec<f64>>,
    se: Vec<Vec<f64>>,
    c_avg: Vec<f64>,
    k: Vec<f64>,
    r_prev: Vec<f64>,
}

impl Reference {
    fn new(n: usize) -> Reference {
        let layout = layout();
        let d = layout.len();
        let p = layout.segments().len();
        let x0: Vec<f64> = initial(&layout).iter().map(|&v| f64::from(v)).collect();
        Reference {
            n,
            x: vec![x0; n],
            m: vec![vec![0.0; d]; n],
            v: vec![vec![0.0; d]; n],
            v_fresh: vec![0.0; d],
            c: vec![vec![1.0; d]; n],
            we: vec![vec![0.0; d]; n],
            se: vec![vec![0.0; d]; n],
            c_avg: vec![0.0; p],
            k: vec![1.0; p],
            r_prev: vec![1.0; p],
            layout,
        }
    }

    fn grads(&self, t: u64) -> Vec<Vec<f64>> {
        (0..self.n)
            .map(|i| {
                gradient(&self.layout, i, t)
                    .iter()
                    .map(|&g| f64::from(g))
                    .collect()
            })
            .collect()
    }

    /// Adam on the synchronised gradient (every rank alike).
    fn adam(&mut self, c: &OneBitAdamConfig, g: &[f64], compressing: bool) {
        for i in 0..self.n {
            for seg in self.layout.segments() {
                let wd = weight_decay(seg.decay, &c.moments);
                for k in seg.range() {
                    self.m[i][k] =
                        c.moments.beta_1 * self.m[i][k] + (1.0 - c.moments.beta_1) * g[k];
                    self.v[i][k] =
                        c.moments.beta_2 * self.v[i][k] + (1.0 - c.moments.beta_2) * g[k] * g[k];
                    let denom =
                        denominator(c.moments.eps_mode, compressing, self.v[i][k], c.moments.eps);
                    let u = self.m[i][k] / denom + wd * self.x[i][k];
                    self.x[i][k] -= LR * u;
                }
            }
        }
    }

    fn onebit_adam(&mut self, c: &OneBitAdamConfig, variant: &str, t: u64) {
        let g = self.grads(t);
        if variant == "naive" {
            let gbar = compressed_allreduce(&g, &mut self.we, &mut self.se);
            return self.adam(c, &gbar, true);
        }
        if t <= FREEZE {
            return self.adam(c, &mean(&g), false);
        }
        let local: Vec<Vec<f64>> = (0..self.n)
            .map(|i| {
                (0..g[i].len())
                    .map(|k| c.moments.beta_1 * self.m[i][k] + (1.0 - c.moments.beta_1) * g[i][k])
                    .collect()
            })
            .collect();
        let m = if variant == "fp32" {
            mean(&local)
        } else {
            compressed_allreduce(&local, &mut self.we, &mut self.se)
        };
        for i in 0..self.n {
            self.m[i] = m.clone();
            for seg in self.layout.segments() {
                let wd = weight_decay(seg.decay, &c.moments);
                for k in seg.range() {
                    let denom = denominator(c.moments.eps_mode, true, self.v[i][k], c.moments.eps);
                    let u = m[k] / denom + wd * self.x[i][k];
                    self.x[i][k] -= LR * u;
                }
            }
        }
    }

    fn onebit_lamb(&mut self, c: &OneBitLambConfig, basic: bool, t: u64) {
        let g = self.grads(t);
        let segments = self.layout.segments().to_vec();
        if t <= FREEZE {
            let gbar = mean(&g);
            let (m, v, x) = (&mut self.m[0], &mut self.v[0], &mut self.x[0]);
            for (p, seg) in segments.iter().enumerate() {
                let wd = weight_decay(seg.decay, &c.moments);
                let mut u = Vec::new();
                for k in seg.range() {
                    m[k] = c.moments.beta_1 * m[k] + (1.0 - c.moments.beta_1) * gbar[k];
                    v[k] = c.moments.beta_2 * v[k] + (1.0 - c.moments.beta_2) * gbar[k] * gbar[k];
                    u.push(m[k] / (v[k].sqrt() + c.moments.eps) + wd * x[k]);
                }
                let xn = norm(seg.range().map(|k| x[k]));
                let un = norm(u.iter().copied());
                let coefficient = trust(xn, un, c.c_min, c.c_max);
                if xn != 0.0 && un != 0.0 {
                    self.c_avg[p] = c.beta_3 * self.c_avg[p] + (1.0 - c.beta_3) * coefficient;
                }
                for (o, k) in seg.range().enumerate() {
                    x[k] -= LR * coefficient * u[o];
                }
            }
            if t == FREEZE && !basic {
                self.v_fresh = v.clone();
                let s: Vec<f64> = segments
                    .iter()
                    .map(|seg| norm(seg.range().map(|k| m[k])) / (seg.len as f64).sqrt())
                    .collect();
                let pos: Vec<f64> = s.iter().copied().filter(|&s| s > 0.0).collect();
                let mean_s = pos.iter().sum::<f64>() / pos.len() as f64;
                self.k = s
                    .iter()
                    .map(|&s| if s > 0.0 { mean_s / s } else { 1.0 })
                    .collect();
            }
            for i in 1..self.n {
                self.m[i] = self.m[0].clone();
                self.v[i] = self.v[0].clone();
                self.x[i] = self.x[0].clone();
            }
            return;
        }
        let m_last = self.m[0].clone();
        let mut local = Vec::new();
        for gi in &g {
            let mut mi = vec![0.0; gi.len()];
            for (p, seg) in segments.iter().enumerate() {
                let k = if basic { 1.0 } else { self.k[p] };
                for j in seg.range() {
                    mi[j] = (c.moments.beta_1 * m_last[j] + (1.0 - c.moments.beta_1) * gi[j]) * k;
                }
            }
            local.push(mi);
        }
        let mut m = compressed_allreduce(&local, &mut self.we, &mut self.se);
        let v = self.v[0].clone();
        let x = &mut self.x[0];
        for (p, seg) in segments.iter().enumerate() {
            let wd = weight_decay(seg.decay, &c.moments);
            let mut scale = self.c_avg[p];
            if !basic {
                let mut r: f64 = 0.0;
                for j in seg.range() {
                    m[j] /= self.k[p];
                    let g_rec = (m[j] - c.moments.beta_1 * m_last[j]) / (1.0 - c.moments.beta_1);
                    self.v_fresh[j] = c.moments.beta_2 * self.v_fresh[j]
                        + (1.0 - c.moments.beta_2) * g_rec * g_rec;
                    let ratio = match c.ratio {
                        RatioKind::Sqrt => {
                            (v[j].sqrt() + c.moments.eps) / (self.v_fresh[j].sqrt() + c.moments.eps)
                        }
                        RatioKind::Variance => {
                            (v[j] + c.moments.eps) / (self.v_fresh[j] + c.moments.eps)
                        }
                    };
                    r = r.max(ratio);
                }
                let prev = self.r_prev[p];
                let r = r.clamp((1.0 - c.r_threshold) * prev, (1.0 + c.r_threshold) * prev);
                let r = r.clamp(c.r_min, c.r_max);
                self.r_prev[p] = r;
                scale *= r;
            }
            for j in seg.range() {
                let u = m[j] / (v[j].sqrt() + c.moments.eps) + wd * x[j];
                x[j] -= LR * scale * u;
            }
        }
        for i in 0..self.n {
            self.m[i] = m.clone();
            self.x[i] = self.x[0].clone();
        }
    }

    fn slamb(&mut self, c: &SlambConfig, t: u64) {
        let g = self.grads(t);
        let d = self.layout.len();
        let always: Vec<_> = self
            .layout
            .segments()
            .iter()
            .filter(|s| s.len < c.always_sync_below)
            .map(|s| s.range())
            .collect();
        let mask = Mask::Hash {
            seed: c.mask_seed,
            k: c.k,
        };
        let mut selected = vec![false; d];
        for j in Selection::new(&mask, t, d, &always).indices() {
            selected[j] = true;
        }
        for i in 0..self.n {
            for k in 0..d {
                self.m[i][k] = c.moments.beta_1 * self.m[i][k] + (1.0 - c.moments.beta_1) * g[i][k];
                self.v[i][k] =
                    c.moments.beta_2 * self.v[i][k] + (1.0 - c.moments.beta_2) * g[i][k] * g[i][k];
            }
        }
        for k in (0..d).filter(|&k| selected[k]) {
            let avg = (0..self.n).map(|i| self.m[i][k]).sum::<f64>() / self.n as f64;
            (0..self.n).for_each(|i| self.m[i][k] = avg);
        }
        let (bc1, bc2) = (
            1.0 - c.moments.beta_1.powi(t as i32),
            1.0 - c.moments.beta_2.powi(t as i32),
        );
        for i in 0..self.n {
            for k in 0..d {
                self.c[i][k] = if selected[k] {
                    1.0
                } else {
                    c.beta_3 * self.c[i][k]
                };
            }
            for seg in self.layout.segments() {
                let wd = weight_decay(seg.decay, &c.moments);
                let u: Vec<f64> = seg
                    .range()
                    .map(|k| {
                        (self.m[i][k] / bc1) / ((self.v[i][k] / bc2).sqrt() + c.moments.eps)
                            + wd * self.x[i][k]
                    })
                    .collect();
                let part = |want: bool| {
                    let xn = norm(
                        seg.range()
                            .filter(|&k| selected[k] == want)
                            .map(|k| self.x[i][k]),
                    );
                    let un = norm(
                        seg.range()
                            .zip(&u)
                            .filter(|(k, _)| selected[*k] == want)
                            .map(|(_, u)| *u),
                    );
                    let count = seg.range().filter(|&k| selected[k] == want).count();
                    (trust(xn, un, c.phi_min, c.phi_max), count)
                };
                let ((sel, n_sel), (rest, n_rest)) = (part(true), part(false));
                let (phi_max, phi_min) = match (n_sel, n_rest) {
                    (_, 0) => (sel, sel),
                    (0, _) => (rest, rest),
                    _ => (sel, rest),
                };
                for (o, k) in seg.range().enumerate() {
                    let f = self.c[i][k];
                    let phi = phi_max * f + phi_min * (1.0 - f);
                    let eta = LR * f + LR / (self.n as f64).sqrt() * (1.0 - f);
                    self.x[i][k] -= eta * phi * u[o];
                }
            }
        }
        if t.is_multiple_of(c.sync_every) {
            let avg = mean(&self.x);
            self.x.iter_mut().for_each(|x| *x = avg.clone());
        }
    }
}

fn check(config: OptimizerConfig, sparse: bool) {
    let name = config.name();
    for n in [1usize, 2, 4] {
        let (xs, stages) = run(&config, n);
        let mut reference = Reference::new(n);
        let mut worst_seen = 0.0f64;
        for t in 1..=STEPS {
            match &config {
                OptimizerConfig::OnebitAdam(c) => reference.onebit_adam(c, "onebit", t),
                OptimizerConfig::OnebitAdamFp32(c) => reference.onebit_adam(c, "fp32", t),
                OptimizerConfig::AdamOnebitNaive(c) => reference.onebit_adam(c, "naive", t),
                OptimizerConfig::OnebitLamb(c) => reference.onebit_lamb(c, false, t),
                OptimizerConfig::LambOnebitBasic(c) => reference.onebit_lamb(c, true, t),
                OptimizerConfig::Slamb(c) => reference.slamb(c, t),
                other => panic!("no reference for {}", other.name()),
            }
            let got = &xs[t as usize - 1];
            let err = worst(&reference.layout, got, &reference.x);
            assert!(
                err <= 1e-4,
                "{name}, n {n}, step {t}: relative error {err:e}"
            );
            worst_seen = worst_seen.max(err);
            let synced = match &config {
                OptimizerConfig::Slamb(c) => t.is_multiple_of(c.sync_every),
                _ => true,
            };
            if synced {
                assert!(
                    same_on_every_rank(got),
                    "{name}, n {n}, step {t}: a rank differs from rank 0"
                );
            }
        }
        let expected_stage = |t: u64| match &config {
            _ if sparse => Stage::Sparse,
            OptimizerConfig::AdamOnebitNaive(_) => Stage::Compression,
            _ if t <= FREEZE => Stage::Warmup,
            _ => Stage::Compression,
        };
        for (t, stage) in (1..=STEPS).zip(&stages) {
            assert_eq!(*stage, expected_stage(t), "{name} step {t}");
        }
        println!("{name}, {n} ranks: worst relative error {worst_seen:.2e} over {STEPS} steps");
    }
}

#[test]
fn onebit_adam_matches_the_float64_reference() {
    check(OptimizerConfig::OnebitAdam(adam_config()), false);
}

#[test]
fn onebit_adam_with_eps_inside_the_compression_stage_matches_the_float64_reference() {
    for eps_mode in [EpsMode::Inside, EpsMode::InsideCompressed] {
        let config = adam_config().with_eps_mode(eps_mode);
        check(OptimizerConfig::OnebitAdam(config), false);
    }
    // `inside_compressed` is Adam (ε outside) through the warmup, bit for
    // bit, and inside afterwards: it leaves the outside run after T_w.
    let bits = |eps_mode| {
        let config = OptimizerConfig::OnebitAdam(adam_config().with_eps_mode(eps_mode));
        let (xs, _) = run(&config, 2);
        xs.iter()
            .map(|ranks| ranks[0].iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
            .collect::<Vec<_>>()
    };
    let (outside, paper) = (bits(EpsMode::Outside), bits(EpsMode::InsideCompressed));
    for t in 0..FREEZE as usize {
        assert!(outside[t] == paper[t], "warmup step {} differs", t + 1);
    }
    assert_ne!(outside[FREEZE as usize], paper[FREEZE as usize]);
}

#[test]
fn onebit_adam_fp32_matches_the_float64_reference() {
    check(OptimizerConfig::OnebitAdamFp32(adam_config()), false);
}

#[test]
fn naive_onebit_adam_matches_the_float64_reference() {
    check(OptimizerConfig::AdamOnebitNaive(adam_config()), false);
}

#[test]
fn onebit_lamb_matches_the_float64_reference() {
    check(OptimizerConfig::OnebitLamb(lamb_config()), false);
    let variance = OneBitLambConfig {
        ratio: RatioKind::Variance,
        ..lamb_config()
    };
    check(OptimizerConfig::OnebitLamb(variance), false);
}

#[test]
fn basic_onebit_lamb_matches_the_float64_reference() {
    check(OptimizerConfig::LambOnebitBasic(lamb_config()), false);
}

#[test]
fn slamb_matches_the_float64_reference() {
    let config = SlambConfig {
        k: 0.2,
        sync_every: 8,
        always_sync_below: 30,
        mask_seed: 9,
        ..SlambConfig::default()
            .with_weight_decay(0.01)
            .with_eps(1e-6)
    };
    check(OptimizerConfig::Slamb(config), true);
}

#[test]
fn at_world_size_one_onebit_adam_is_adam_with_the_frozen_variance() {
    // Nothing to average on one rank: the compressed allreduce returns its
    // input, so 1-bit Adam equals the ablation that sends the momentum in
    // fp32 (Adam with v frozen at T_w) bit for bit, and the naive baseline
    // equals plain Adam.
    let onebit = bits_at_world_one(OptimizerConfig::OnebitAdam(adam_config()));
    let frozen = bits_at_world_one(OptimizerConfig::OnebitAdamFp32(adam_config()));
    assert_eq!(onebit.len(), STEPS as usize);
    // The first step (from 1) at which two runs' parameters differ.
    let first_difference =
        |a: &[Vec<u32>], b: &[Vec<u32>]| a.iter().zip(b).position(|(x, y)| x != y).map(|i| i + 1);
    assert_eq!(
        first_difference(&onebit, &frozen),
        None,
        "1-bit Adam vs frozen-v Adam"
    );
    let c = adam_config();
    let adam = terse_optim::AdamConfig {
        moments: c.moments.clone(),
        bias_correction: c.bias_correction,
        ..Default::default()
    };
    let naive = bits_at_world_one(OptimizerConfig::AdamOnebitNaive(adam_config()));
    let plain = bits_at_world_one(OptimizerConfig::Adam(adam));
    assert_eq!(
        first_difference(&naive, &plain),
        None,
        "naive 1-bit Adam vs Adam"
    );
    // And the frozen variance did change the trajectory after T_w.
    assert_ne!(onebit[STEPS as usize - 1], plain[STEPS as usize - 1]);
}
