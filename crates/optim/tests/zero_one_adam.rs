//! 0/1 Adam against a float64 re-implementation of ALGORITHMS.md "0/1
//! Adam" written here (its schedules and the compressed allreduce
//! included), on `local` worlds of 1, 2 and 4 ranks over 60 steps: a
//! variance stage of 20 steps (κ = 2: v updated at t = 1, 2, 3, 5, 7, 11,
//! 15, the 1-bit compressed gradient in between), then local steps whose
//! interval doubles every 4 of them up to 8, and the final
//! synchronisation `finish` adds. Parameters must stay within 1e-5 (worst
//! per-segment relative error) of the reference on every rank after every
//! step, and be bit-identical on every rank after every step that
//! synchronised them. A run saved in the middle of a local interval and
//! resumed is bit-identical to one never stopped.

// The reference indexes by rank and element to read like ALGORITHMS.md.
#![allow(clippy::needless_range_loop)]

use std::time::Duration;

use terse_comm::{Communicator, LocalComm};
use terse_optim::{
    LrSchedule, Optimizer, OptimizerConfig, ParamLayout, Stage, WithMoments, ZeroOneAdamConfig,
};

mod compressed_setup;
use compressed_setup::reference::{compressed_allreduce, mean, same_on_every_rank, worst};
use compressed_setup::{gradient, initial, layout, reload_through};

const STEPS: u64 = 60;
const VAR_FREEZE: u64 = 20;
const TOLERANCE: f64 = 1e-5;

fn config(bias_correction: bool) -> ZeroOneAdamConfig {
    ZeroOneAdamConfig {
        bias_correction,
        var_freeze_step: VAR_FREEZE,
        var_update_scaler: 2,
        local_step_scaler: 4,
        local_step_clipper: 8,
        ..ZeroOneAdamConfig::default()
            .with_weight_decay(0.01)
            .with_eps(1e-6)
    }
}

/// A decaying rate, so that the learning-rate sums of the
/// synchronisations are not just counts.
fn schedule() -> LrSchedule {
    LrSchedule::LinearWarmupPolyDecay {
        peak: 2e-3,
        warmup_steps: 5,
        total_steps: 80,
        power: 1.0,
        end_lr: 1e-4,
    }
}

// ---------------------------------------------------------------- reference

/// Per-rank state, as DeepSpeed keeps it; DeepSpeed's step count is t + 1.
struct Reference {
    n: usize,
    bias_correction: bool,
    /// v's updates so far.
    k: i32,
    layout: ParamLayout,
    x: Vec<Vec<f64>>,
    m: Vec<Vec<f64>>,
    u: Vec<Vec<f64>>,
    v: Vec<f64>,
    we: Vec<Vec<f64>>,
    se: Vec<Vec<f64>>,
    lr_sum: f64,
    var_interval: u64,
    var_counter: u64,
    local_interval: u64,
    local_counter: u64,
}

impl Reference {
    fn new(n: usize, bias_correction: bool) -> Reference {
        let layout = layout();
        let d = layout.len();
        let x0: Vec<f64> = initial(&layout).iter().map(|&v| f64::from(v)).collect();
        Reference {
            n,
            bias_correction,
            k: 0,
            x: vec![x0; n],
            m: vec![vec![0.0; d]; n],
            u: vec![vec![0.0; d]; n],
            v: vec![0.0; d],
            we: vec![vec![0.0; d]; n],
            se: vec![vec![0.0; d]; n],
            lr_sum: 0.0,
            var_interval: 1,
            var_counter: 0,
            local_interval: 1,
            local_counter: 0,
            layout,
        }
    }

    fn decay(&self, k: usize) -> f64 {
        let seg = self
            .layout
            .segments()
            .iter()
            .find(|s| s.range().contains(&k));
        if seg.unwrap().decay { 0.01 } else { 0.0 }
    }

    /// 1/(1−β1^t) and 1/(1−β2^k) with bias correction, else 1 and 1.
    fn corrections(&self, t: u64) -> (f64, f64) {
        match self.bias_correction {
            true => (
                1.0 / (1.0 - 0.9f64.powi(t as i32)),
                1.0 / (1.0 - 0.999f64.powi(self.k)),
            ),
            false => (1.0, 1.0),
        }
    }

    fn denom(&self, t: u64, k: usize) -> f64 {
        (self.v[k] * self.corrections(t).1).sqrt() + 1e-6
    }

    fn update(&self, t: u64, i: usize, k: usize) -> f64 {
        self.m[i][k] * self.corrections(t).0 / self.denom(t, k) + self.decay(k) * self.x[i][k]
    }

    /// Step `t` at rate `lr`; returns whether it synchronised the
    /// parameters and which stage it was.
    fn step(&mut self, t: u64, lr: f64) -> (bool, Stage) {
        let (b1, b2) = (0.9, 0.999);
        let d = self.layout.len();
        let g: Vec<Vec<f64>> = (0..self.n)
            .map(|i| {
                let g = gradient(&self.layout, i, t);
                g.iter().map(|&g| f64::from(g)).collect()
            })
            .collect();
        let s = t + 1;
        if t <= VAR_FREEZE {
            let exact = s.is_multiple_of(self.var_interval);
            let gbar = if exact {
                self.k += 1;
                let gbar = mean(&g);
                for k in 0..d {
                    self.v[k] = b2 * self.v[k] + (1.0 - b2) * gbar[k] * gbar[k];
                }
                gbar
            } else {
                compressed_allreduce(&g, &mut self.we, &mut self.se)
            };
            for i in 0..self.n {
                for k in 0..d {
                    self.m[i][k] = b1 * self.m[i][k] + (1.0 - b1) * gbar[k];
                    self.x[i][k] -= lr * self.update(t, i, k);
                }
            }
            if exact {
                self.var_counter += 1;
                if self.var_counter == 2 {
                    self.var_counter = 0;
                    self.var_interval *= 2;
                }
            }
            if t == VAR_FREEZE {
                self.we = vec![vec![0.0; d]; self.n];
                self.se = vec![vec![0.0; d]; self.n];
            }
            let stage = if exact {
                Stage::Warmup
            } else {
                Stage::Compression
            };
            return (true, stage);
        }
        for i in 0..self.n {
            for k in 0..d {
                self.m[i][k] = b1 * self.m[i][k] + (1.0 - b1) * g[i][k];
                let update = self.update(t, i, k);
                self.x[i][k] -= lr * update;
                self.u[i][k] -= lr * update;
            }
        }
        self.lr_sum += lr;
        let sync = s.is_multiple_of(self.local_interval);
        if sync {
            self.synchronise(t);
        }
        self.local_counter += 1;
        if self.local_counter == 4 {
            self.local_counter = 0;
            self.local_interval = (self.local_interval * 2).min(8);
        }
        (
            sync,
            if sync {
                Stage::Compression
            } else {
                Stage::Local
            },
        )
    }

    /// The synchronisation after step `t`: ū·denom/Σlr estimates m̂.
    fn synchronise(&mut self, t: u64) {
        let d = self.layout.len();
        for i in 0..self.n {
            for k in 0..d {
                self.x[i][k] -= self.u[i][k];
                self.u[i][k] *= self.denom(t, k);
            }
        }
        let ubar = compressed_allreduce(&self.u, &mut self.we, &mut self.se);
        let m_correction = self.corrections(t).0;
        for i in 0..self.n {
            for k in 0..d {
                self.m[i][k] = -ubar[k] / (self.lr_sum * m_correction);
                self.x[i][k] += ubar[k] / self.denom(t, k);
                self.u[i][k] = 0.0;
            }
        }
        self.lr_sum = 0.0;
    }
}

// ---------------------------------------------------------------- terse

/// x on every rank after every step (and after `finish`, last), and the
/// stage of every step; with `stop`, every rank saves after that step and
/// continues in a fresh optimizer loaded from the file.
fn run(
    n: usize,
    bias_correction: bool,
    stop: Option<u64>,
    dir: &std::path::Path,
) -> (Vec<Vec<Vec<f32>>>, Vec<Stage>) {
    let layout = layout();
    let config = OptimizerConfig::ZeroOneAdam(config(bias_correction));
    let results = LocalComm::run(n, Duration::from_secs(120), |comm| {
        let fresh = || Optimizer::new(config.clone(), schedule(), layout.clone(), comm).unwrap();
        let mut opt = fresh();
        let mut x = initial(&layout);
        let (mut xs, mut stages) = (Vec::new(), Vec::new());
        for t in 1..=STEPS {
            let mut g = gradient(&layout, comm.rank(), t);
            let report = opt.step_flat(&mut x, &mut g, comm).unwrap();
            xs.push(x.clone());
            stages.push(report.stage);
            if Some(t) == stop {
                reload_through(dir, &mut opt, comm, fresh);
            }
        }
        opt.finish_flat(&mut x, comm).unwrap();
        xs.push(x);
        (xs, stages)
    });
    let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    let stages = results[0].1.clone();
    let per_step = (0..=STEPS as usize)
        .map(|s| results.iter().map(|(xs, _)| xs[s].clone()).collect())
        .collect();
    (per_step, stages)
}

#[test]
fn zero_one_adam_matches_the_float64_reference() {
    check(false);
}

/// terse's option: m̂ = m/(1−β1^t), v̂ = v/(1−β2^k) with k v's updates.
#[test]
fn zero_one_adam_with_bias_correction_matches_the_float64_reference() {
    check(true);
}

fn check(bias_correction: bool) {
    let scratch = tempfile::tempdir().unwrap();
    for n in [1usize, 2, 4] {
        let (xs, stages) = run(n, bias_correction, None, scratch.path());
        let mut reference = Reference::new(n, bias_correction);
        let mut worst_seen = 0.0f64;
        let (mut syncs, mut local) = (0, 0);
        for t in 1..=STEPS {
            let (synced, stage) = reference.step(t, schedule().lr(t));
            let got = &xs[t as usize - 1];
            let err = worst(&reference.layout, got, &reference.x);
            assert!(err <= TOLERANCE, "n {n}, step {t}: relative error {err:e}");
            worst_seen = worst_seen.max(err);
            assert_eq!(stages[t as usize - 1], stage, "n {n}, step {t}");
            if synced {
                assert!(same_on_every_rank(got), "n {n}, step {t}: ranks differ");
            }
            syncs += usize::from(synced && t > VAR_FREEZE);
            local += usize::from(!synced);
        }
        // Local steps 21–60: interval 1 (21–24: 4 syncs), 2 (25–28: t + 1
        // even, 2), 4 (29–32: t + 1 ≡ 0 mod 4, 31), then 8 (39, 47, 55).
        assert_eq!((syncs, local), (10, 30), "n {n}");
        // `finish` synchronises the local steps 56–60.
        reference.synchronise(STEPS);
        let finished = &xs[STEPS as usize];
        let err = worst(&reference.layout, finished, &reference.x);
        assert!(err <= TOLERANCE, "n {n}, after finish: {err:e}");
        assert!(
            same_on_every_rank(finished),
            "n {n}: ranks differ after finish"
        );
        if n > 1 {
            let before = &xs[STEPS as usize - 1];
            assert!(
                !same_on_every_rank(before),
                "n {n}: local steps should diverge"
            );
        }
        println!(
            "zero_one_adam (bias correction {bias_correction}), {n} ranks: worst relative \
             error {worst_seen:.2e}"
        );
    }
}

#[test]
fn resuming_in_the_middle_of_a_local_interval_is_bit_identical() {
    let scratch = tempfile::tempdir().unwrap();
    // Step 35 lies inside the interval of 8 that synchronises at t = 39;
    // step 12 inside the variance stage, between two variance updates.
    for (n, stop) in [(2, 35), (4, 35), (2, 12)] {
        let (straight, _) = run(n, true, None, scratch.path());
        let (resumed, _) = run(n, true, Some(stop), scratch.path());
        for (t, (a, b)) in straight.iter().zip(&resumed).enumerate() {
            for (rank, (a, b)) in a.iter().zip(b).enumerate() {
                let same = a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "n {n}, stop {stop}: step {} rank {rank}", t + 1);
            }
        }
    }
}
