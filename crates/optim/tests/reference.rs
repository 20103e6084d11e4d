//! Every optimizer of terse-optim against a float64 re-implementation of
//! ALGORITHMS.md written here, independently of the crate's fused f32 loops.
//!
//! 24 steps on random gradients, segments whose magnitudes differ by 10^6,
//! every option. Error measure: per segment, `max|x - x_ref| / max|x_ref|`
//! (a segment's own scale, since magnitudes differ by 10^6 across segments);
//! bound 1e-5, i.e. a few hundred f32 roundings.

mod common;

use common::{SplitMix, gradient, initial_params, layout};
use terse_comm::SingleRank;
use terse_optim::WithMoments;
use terse_optim::{
    AdamConfig, EpsMode, LambConfig, LrSchedule, MomentConfig, Optimizer, OptimizerConfig,
    ParamLayout, SgdConfig,
};

const STEPS: u64 = 24;
const TOLERANCE: f64 = 1e-5;

/// The float64 reference: state and one step per algorithm, straight from the
/// formulas in ALGORITHMS.md.
struct Reference {
    m: Vec<f64>,
    v: Vec<f64>,
}

impl Reference {
    fn new(d: usize) -> Self {
        Self {
            m: vec![0.0; d],
            v: vec![0.0; d],
        }
    }

    /// Adam's m, v update and direction u (with decoupled decay) for all
    /// elements, with the coefficients of `moments`.
    fn adam_direction(
        &mut self,
        layout: &ParamLayout,
        x: &[f64],
        g: &[f64],
        t: u64,
        moments: &MomentConfig,
        bias_correction: bool,
    ) -> Vec<f64> {
        let MomentConfig {
            beta_1,
            beta_2,
            eps,
            weight_decay: wd,
            eps_mode,
        } = *moments;
        let mut u = vec![0.0; x.len()];
        for seg in layout.segments() {
            for i in seg.range() {
                self.m[i] = beta_1 * self.m[i] + (1.0 - beta_1) * g[i];
                self.v[i] = beta_2 * self.v[i] + (1.0 - beta_2) * g[i] * g[i];
                let (m_hat, v_hat) = if bias_correction {
                    (
                        self.m[i] / (1.0 - beta_1.powi(t as i32)),
                        self.v[i] / (1.0 - beta_2.powi(t as i32)),
                    )
                } else {
                    (self.m[i], self.v[i])
                };
                u[i] = match eps_mode {
                    EpsMode::Outside => m_hat / (v_hat.sqrt() + eps),
                    EpsMode::Inside => m_hat / (v_hat + eps).sqrt(),
                    EpsMode::InsideCompressed => unreachable!("refused for Adam and LAMB"),
                };
                if seg.decay {
                    u[i] += wd * x[i];
                }
            }
        }
        u
    }

    fn step(
        &mut self,
        config: &OptimizerConfig,
        layout: &ParamLayout,
        lr: f64,
        t: u64,
        x: &mut [f64],
        g: &[f64],
    ) {
        match config {
            OptimizerConfig::Adam(c) => {
                let u = self.adam_direction(layout, x, g, t, &c.moments, c.bias_correction);
                for (x, u) in x.iter_mut().zip(u) {
                    *x -= lr * u;
                }
            }
            OptimizerConfig::Lamb(c) => {
                let g: Vec<f64> = if c.grad_prenorm {
                    let norm = g.iter().map(|g| g * g).sum::<f64>().sqrt();
                    g.iter().map(|g| g / norm.max(1.0)).collect()
                } else {
                    g.to_vec()
                };
                let u = self.adam_direction(layout, x, &g, t, &c.moments, c.bias_correction);
                for seg in layout.segments() {
                    let r = seg.range();
                    let x_norm = x[r.clone()].iter().map(|x| x * x).sum::<f64>().sqrt();
                    let u_norm = u[r.clone()].iter().map(|u| u * u).sum::<f64>().sqrt();
                    // trust_decay_only: no ratio for the no-decay group; a
                    // zero norm: the ratio is meaningless, coefficient 1.
                    let unscaled =
                        (c.trust_decay_only && !seg.decay) || x_norm == 0.0 || u_norm == 0.0;
                    let coefficient = if unscaled {
                        1.0
                    } else {
                        (x_norm / u_norm).clamp(c.c_min, c.c_max)
                    };
                    for i in r {
                        x[i] -= lr * coefficient * u[i];
                    }
                }
            }
            OptimizerConfig::Sgd(c) => {
                for seg in layout.segments() {
                    for i in seg.range() {
                        let wd = if seg.decay { c.weight_decay } else { 0.0 };
                        let d = g[i] + wd * x[i];
                        self.m[i] = c.momentum * self.m[i] + d;
                        let step = if c.nesterov {
                            d + c.momentum * self.m[i]
                        } else {
                            self.m[i]
                        };
                        x[i] -= lr * step;
                    }
                }
            }
            other => panic!(
                "{} has its own reference (compressed_reference.rs)",
                other.name()
            ),
        }
    }
}

/// Runs the crate's optimizer and the reference side by side; returns the
/// worst per-segment relative error over all steps.
fn worst_error(config: OptimizerConfig, schedule: LrSchedule) -> f64 {
    let layout = layout();
    let mut rng = SplitMix::new(0x7e55e);
    let mut x = initial_params(&mut rng);
    let mut x_ref: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let mut optimizer = Optimizer::new(
        config.clone(),
        schedule.clone(),
        layout.clone(),
        &SingleRank::new(),
    )
    .unwrap();
    let mut reference = Reference::new(layout.len());
    let mut worst = 0.0f64;
    for t in 1..=STEPS {
        let mut g = gradient(&mut rng);
        let g_ref: Vec<f64> = g.iter().map(|&v| f64::from(v)).collect();
        let report = optimizer
            .step_flat(&mut x, &mut g, &SingleRank::new())
            .unwrap();
        assert_eq!(report.t, t);
        reference.step(&config, &layout, schedule.lr(t), t, &mut x_ref, &g_ref);
        for seg in layout.segments() {
            let r = seg.range();
            let scale = x_ref[r.clone()].iter().fold(0.0f64, |a, v| a.max(v.abs()));
            let diff = x[r.clone()]
                .iter()
                .zip(&x_ref[r])
                .fold(0.0f64, |a, (&x, &y)| a.max((f64::from(x) - y).abs()));
            let error = if scale == 0.0 { diff } else { diff / scale };
            assert!(
                error.is_finite(),
                "{config:?}: step {t} `{}` not finite",
                seg.path
            );
            worst = worst.max(error);
        }
    }
    worst
}

fn warmup_then_decay(peak: f64) -> LrSchedule {
    LrSchedule::LinearWarmupLinearDecay {
        peak,
        warmup_steps: 5,
        total_steps: 40,
    }
}

fn check(name: &str, config: OptimizerConfig, schedule: LrSchedule) {
    let error = worst_error(config, schedule);
    println!("{name}: worst relative error {error:.3e}");
    assert!(
        error <= TOLERANCE,
        "{name}: relative error {error:.3e} > {TOLERANCE:e}"
    );
}

#[test]
fn adam_matches_float64_reference_for_every_option() {
    let base = AdamConfig::default();
    let variants = [
        ("adam default", base.clone()),
        (
            "adam eps inside",
            base.clone().with_eps_mode(EpsMode::Inside).with_eps(1e-6),
        ),
        (
            "adam no bias correction",
            AdamConfig {
                bias_correction: false,
                ..base.clone()
            },
        ),
        (
            "adamw",
            base.clone()
                .with_weight_decay(0.1)
                .with_beta_1(0.8)
                .with_beta_2(0.99),
        ),
    ];
    for (name, config) in variants {
        check(name, OptimizerConfig::Adam(config), warmup_then_decay(1e-2));
    }
}

#[test]
fn lamb_matches_float64_reference_for_every_option() {
    let base = LambConfig::default().with_weight_decay(0.01);
    let variants = [
        ("lamb default", base.clone()),
        (
            "lamb grad_prenorm",
            LambConfig {
                grad_prenorm: true,
                ..base.clone()
            },
        ),
        (
            "lamb trust_decay_only",
            LambConfig {
                trust_decay_only: true,
                ..base.clone()
            },
        ),
        (
            "lamb eps inside + bias correction",
            LambConfig {
                bias_correction: true,
                ..base.clone().with_eps_mode(EpsMode::Inside).with_eps(1e-6)
            },
        ),
        (
            "lamb wide clip",
            LambConfig {
                c_min: 1e-4,
                c_max: 10.0,
                ..base.clone()
            },
        ),
    ];
    for (name, config) in variants {
        check(name, OptimizerConfig::Lamb(config), warmup_then_decay(2e-2));
    }
}

#[test]
fn sgd_matches_float64_reference_for_every_option() {
    let variants = [
        ("sgd momentum", SgdConfig::default()),
        (
            "sgd nesterov",
            SgdConfig {
                nesterov: true,
                ..Default::default()
            },
        ),
        (
            "sgd weight decay",
            SgdConfig {
                weight_decay: 0.05,
                ..Default::default()
            },
        ),
        (
            "sgd plain",
            SgdConfig {
                momentum: 0.0,
                ..Default::default()
            },
        ),
    ];
    for (name, config) in variants {
        check(
            name,
            OptimizerConfig::Sgd(config),
            LrSchedule::Constant { lr: 1e-3 },
        );
    }
}
