//! Learning-rate schedules of the papers (ALGORITHMS.md "Learning-rate schedules").
//!
//! A schedule is a pure function of the optimizer step `t` (counted from 1), so
//! resuming needs only `t`: the "schedule position" of a checkpoint.

use serde::{Deserialize, Serialize};

use crate::OptimError;
use crate::config_check::invalid;

/// A learning rate as a function of the step, chosen by `kind` in a config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LrSchedule {
    /// The same rate at every step.
    Constant {
        /// The rate.
        lr: f64,
    },
    /// Linear 0 → `peak` over `warmup_steps`, then `peak·gamma^⌊(t-W)/decay_every⌋`
    /// (1-bit Adam BERT: 4e-4, W = 12.5k, γ = 0.99 every 520).
    LinearWarmupStepDecay {
        /// Rate at the end of warmup.
        peak: f64,
        /// W.
        warmup_steps: u64,
        /// γ.
        gamma: f64,
        /// Steps between two decays.
        decay_every: u64,
    },
    /// `lr0·(peak/lr0)^(t/W)` over W steps, then `peak·gamma^⌊(t-W)/decay_every⌋`
    /// (1-bit LAMB seq128: 1e-3 → 12e-3 over 450, ×0.9 every 250).
    ExpWarmupStepDecay {
        /// Rate at t = 0.
        lr0: f64,
        /// Rate at the end of warmup.
        peak: f64,
        /// W.
        warmup_steps: u64,
        /// γ.
        gamma: f64,
        /// Steps between two decays.
        decay_every: u64,
    },
    /// Linear warmup, then `(peak-end)·(1-(t-W)/(T-W))^power + end`
    /// (SLAMB and NVIDIA LAMB: power 0.5).
    LinearWarmupPolyDecay {
        /// Rate at the end of warmup.
        peak: f64,
        /// W.
        warmup_steps: u64,
        /// T: the step at which the rate reaches `end_lr`.
        total_steps: u64,
        /// Exponent of the decay.
        #[serde(default = "half")]
        power: f64,
        /// Rate from step T on.
        #[serde(default)]
        end_lr: f64,
    },
    /// Linear warmup, then linear decay to 0 at `total_steps` (fine-tuning).
    LinearWarmupLinearDecay {
        /// Rate at the end of warmup.
        peak: f64,
        /// W.
        warmup_steps: u64,
        /// T.
        total_steps: u64,
    },
    /// Linear warmup, then half a cosine from `peak` to `min_lr` at `total_steps`.
    Cosine {
        /// Rate at the end of warmup.
        peak: f64,
        /// W.
        #[serde(default)]
        warmup_steps: u64,
        /// T.
        total_steps: u64,
        /// Rate from step T on.
        #[serde(default)]
        min_lr: f64,
    },
}

fn half() -> f64 {
    0.5
}

impl LrSchedule {
    /// The learning rate of step `t` (t ≥ 1; t = 0 is treated as 0 progress).
    pub fn lr(&self, t: u64) -> f64 {
        match *self {
            Self::Constant { lr } => lr,
            Self::LinearWarmupStepDecay {
                peak,
                warmup_steps,
                gamma,
                decay_every,
            } => match warmup(peak, warmup_steps, t) {
                Some(lr) => lr,
                None => peak * gamma.powi(decays(t - warmup_steps, decay_every)),
            },
            Self::ExpWarmupStepDecay {
                lr0,
                peak,
                warmup_steps,
                gamma,
                decay_every,
            } => {
                if t < warmup_steps {
                    lr0 * (peak / lr0).powf(t as f64 / warmup_steps as f64)
                } else {
                    peak * gamma.powi(decays(t - warmup_steps, decay_every))
                }
            }
            Self::LinearWarmupPolyDecay {
                peak,
                warmup_steps,
                total_steps,
                power,
                end_lr,
            } => match warmup(peak, warmup_steps, t) {
                Some(lr) => lr,
                None => {
                    let left = 1.0 - progress(t, warmup_steps, total_steps);
                    (peak - end_lr) * left.powf(power) + end_lr
                }
            },
            Self::LinearWarmupLinearDecay {
                peak,
                warmup_steps,
                total_steps,
            } => match warmup(peak, warmup_steps, t) {
                Some(lr) => lr,
                None => peak * (1.0 - progress(t, warmup_steps, total_steps)),
            },
            Self::Cosine {
                peak,
                warmup_steps,
                total_steps,
                min_lr,
            } => match warmup(peak, warmup_steps, t) {
                Some(lr) => lr,
                None => {
                    let p = progress(t, warmup_steps, total_steps);
                    min_lr + (peak - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
                }
            },
        }
    }

    /// The step at which the schedule ends (`total_steps`), for the
    /// schedules that have one.
    pub fn total_steps(&self) -> Option<u64> {
        match *self {
            Self::LinearWarmupPolyDecay { total_steps, .. }
            | Self::LinearWarmupLinearDecay { total_steps, .. }
            | Self::Cosine { total_steps, .. } => Some(total_steps),
            _ => None,
        }
    }

    /// The step at which warmup ends (0 for schedules without one).
    pub fn warmup_steps(&self) -> u64 {
        match *self {
            Self::Constant { .. } => 0,
            Self::LinearWarmupStepDecay { warmup_steps, .. }
            | Self::ExpWarmupStepDecay { warmup_steps, .. }
            | Self::LinearWarmupPolyDecay { warmup_steps, .. }
            | Self::LinearWarmupLinearDecay { warmup_steps, .. }
            | Self::Cosine { warmup_steps, .. } => warmup_steps,
        }
    }

    /// Checks the ranges that the formulas need.
    pub fn validate(&self) -> Result<(), OptimError> {
        let rates: &[(&'static str, f64)] = match *self {
            Self::Constant { lr } => &[("schedule.lr", lr)],
            Self::LinearWarmupStepDecay { peak, gamma, .. } => {
                &[("schedule.peak", peak), ("schedule.gamma", gamma)]
            }
            Self::ExpWarmupStepDecay {
                lr0, peak, gamma, ..
            } => &[
                ("schedule.lr0", lr0),
                ("schedule.peak", peak),
                ("schedule.gamma", gamma),
            ],
            Self::LinearWarmupPolyDecay {
                peak,
                power,
                end_lr,
                ..
            } => &[
                ("schedule.peak", peak),
                ("schedule.power", power),
                ("schedule.end_lr", end_lr),
            ],
            Self::LinearWarmupLinearDecay { peak, .. } => &[("schedule.peak", peak)],
            Self::Cosine { peak, min_lr, .. } => {
                &[("schedule.peak", peak), ("schedule.min_lr", min_lr)]
            }
        };
        for &(field, value) in rates {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(invalid(
                    field,
                    value.to_string(),
                    "needs a finite value >= 0",
                ));
            }
        }
        match *self {
            Self::ExpWarmupStepDecay { lr0: 0.0, .. } => Err(invalid(
                "schedule.lr0",
                "0".into(),
                "an exponential warmup needs lr0 > 0",
            )),
            Self::LinearWarmupStepDecay { decay_every: 0, .. }
            | Self::ExpWarmupStepDecay { decay_every: 0, .. } => Err(invalid(
                "schedule.decay_every",
                "0".into(),
                "needs at least 1 step between decays",
            )),
            Self::LinearWarmupPolyDecay {
                warmup_steps,
                total_steps,
                ..
            }
            | Self::LinearWarmupLinearDecay {
                warmup_steps,
                total_steps,
                ..
            }
            | Self::Cosine {
                warmup_steps,
                total_steps,
                ..
            } if total_steps <= warmup_steps => Err(invalid(
                "schedule.total_steps",
                format!("{total_steps} (warmup_steps = {warmup_steps})"),
                "needs total_steps > warmup_steps",
            )),
            _ => Ok(()),
        }
    }
}

/// The linear-warmup rate while `t < W`; `None` once warmup is over.
fn warmup(peak: f64, warmup_steps: u64, t: u64) -> Option<f64> {
    (t < warmup_steps).then(|| peak * t as f64 / warmup_steps as f64)
}

/// Fraction of the decay phase `W..T` done at step t, clamped to [0, 1].
fn progress(t: u64, warmup_steps: u64, total_steps: u64) -> f64 {
    let span = total_steps.saturating_sub(warmup_steps).max(1) as f64;
    ((t.saturating_sub(warmup_steps)) as f64 / span).min(1.0)
}

fn decays(steps_after_warmup: u64, every: u64) -> i32 {
    i32::try_from(steps_after_warmup / every.max(1)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-12 * b.abs().max(1e-30), "{a} != {b}");
    }

    // Expected values below are worked out by hand from the formulas in
    // ALGORITHMS.md, with the papers' own settings where they exist.

    #[test]
    fn linear_warmup_step_decay_matches_onebit_adam_bert() {
        let s = LrSchedule::LinearWarmupStepDecay {
            peak: 4e-4,
            warmup_steps: 12_500,
            gamma: 0.99,
            decay_every: 520,
        };
        close(s.lr(1), 4e-4 / 12_500.0);
        close(s.lr(6_250), 2e-4);
        close(s.lr(12_500), 4e-4);
        close(s.lr(13_019), 4e-4);
        close(s.lr(13_020), 4e-4 * 0.99);
        close(s.lr(12_500 + 5 * 520 + 3), 4e-4 * 0.99f64.powi(5));
    }

    #[test]
    fn exp_warmup_step_decay_matches_onebit_lamb_seq128() {
        let s = LrSchedule::ExpWarmupStepDecay {
            lr0: 1e-3,
            peak: 12e-3,
            warmup_steps: 450,
            gamma: 0.9,
            decay_every: 250,
        };
        close(s.lr(0), 1e-3);
        // Half-way the rate is the geometric mean: sqrt(1e-3 * 12e-3).
        close(s.lr(225), (1e-3f64 * 12e-3).sqrt());
        close(s.lr(450), 12e-3);
        close(s.lr(700), 12e-3 * 0.9);
        close(s.lr(949), 12e-3 * 0.9);
        close(s.lr(950), 12e-3 * 0.81);
    }

    #[test]
    fn poly_linear_and_cosine_decays() {
        let poly = LrSchedule::LinearWarmupPolyDecay {
            peak: 6e-3,
            warmup_steps: 2000,
            total_steps: 7038,
            power: 0.5,
            end_lr: 0.0,
        };
        close(poly.lr(1000), 3e-3);
        close(poly.lr(2000), 6e-3);
        // (1 - 2519/5038)^0.5 = 0.5^0.5
        close(poly.lr(2000 + 2519), 6e-3 * 0.5f64.sqrt());
        assert_eq!(poly.lr(7038), 0.0);
        assert_eq!(poly.lr(9000), 0.0);

        let linear = LrSchedule::LinearWarmupLinearDecay {
            peak: 3e-5,
            warmup_steps: 100,
            total_steps: 1100,
        };
        close(linear.lr(50), 1.5e-5);
        close(linear.lr(600), 1.5e-5);
        close(linear.lr(850), 3e-5 * 0.25);

        let cosine = LrSchedule::Cosine {
            peak: 1.0,
            warmup_steps: 0,
            total_steps: 100,
            min_lr: 0.1,
        };
        close(cosine.lr(0), 1.0);
        close(cosine.lr(50), 0.55);
        close(cosine.lr(100), 0.1);
        close(cosine.lr(25), 0.1 + 0.9 * 0.5 * (1.0 + 0.5f64.sqrt()));
    }

    #[test]
    fn validation_and_toml() {
        let s: LrSchedule = toml::from_str(
            "kind = \"linear_warmup_poly_decay\"\npeak = 6e-3\nwarmup_steps = 200\ntotal_steps = 1563\n",
        )
        .unwrap();
        assert!(matches!(s, LrSchedule::LinearWarmupPolyDecay { power, .. } if power == 0.5));
        s.validate().unwrap();
        assert!(
            toml::from_str::<LrSchedule>("kind = \"constant\"\nlr = 1.0\nwarmup = 3\n").is_err()
        );
        let bad = LrSchedule::Cosine {
            peak: 1.0,
            warmup_steps: 10,
            total_steps: 10,
            min_lr: 0.0,
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("schedule.total_steps")
        );
    }
}
