//! fp16's dynamic loss scaling, as DeepSpeed's `FP16_Optimizer` (the
//! wrapper its 1-bit Adam and 1-bit LAMB train under, 0.19.6's
//! `runtime/fp16/fused_optimizer.py`, `_update_scale`) does it: the loss is
//! multiplied by the scale before the backward; a step whose gradient has
//! an inf or a NaN on any rank is skipped on every rank and halves the
//! scale (down to `min_scale`); after `scale_window` clean steps since the
//! last overflow the scale doubles. DeepSpeed's `hysteresis` belongs to its
//! other scaler (ZeRO's) and `FP16_Optimizer` ignores it, as terse does.
//!
//! One difference, on purpose: where DeepSpeed's fused wrapper would go on
//! skipping every step at the floor (its issue #753: a wrong freeze makes
//! every step overflow, and the scale halves to the floor and stays), terse
//! stops the run with an error that says so.

use serde::{Deserialize, Serialize};
use terse_comm::{Communicator, ReduceOp};

use crate::TrainError;

/// `[train.loss_scaling]`: DeepSpeed's `fp16` block (`initial_scale_power`,
/// `loss_scale_window`, `min_loss_scale`, `loss_scale`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossScaling {
    /// The first scale is 2^this (DeepSpeed's `initial_scale_power`).
    #[serde(default = "default_power")]
    pub initial_scale_power: u32,
    /// Clean steps since the last overflow before the scale doubles
    /// (DeepSpeed's `loss_scale_window`).
    #[serde(default = "default_window")]
    pub scale_window: u64,
    /// The scale never halves below this (DeepSpeed's `min_loss_scale`); an
    /// overflow at it stops the run.
    #[serde(default = "default_min")]
    pub min_scale: f64,
    /// A fixed scale instead of the dynamic one (DeepSpeed's `loss_scale`
    /// when it is not 0): overflowing steps are still skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_scale: Option<f64>,
}

fn default_power() -> u32 {
    16
}
fn default_window() -> u64 {
    1000
}
fn default_min() -> f64 {
    1.0
}

impl Default for LossScaling {
    fn default() -> Self {
        Self {
            initial_scale_power: default_power(),
            scale_window: default_window(),
            min_scale: default_min(),
            static_scale: None,
        }
    }
}

impl LossScaling {
    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.initial_scale_power > 126 {
            return Err(format!(
                "train.loss_scaling.initial_scale_power = {}: 2^power must be a finite fp32 \
                 (at most 126)",
                self.initial_scale_power
            ));
        }
        if self.scale_window == 0 {
            return Err("train.loss_scaling.scale_window: must be at least 1".into());
        }
        if !(self.min_scale.is_finite() && self.min_scale > 0.0) {
            return Err(format!(
                "train.loss_scaling.min_scale = {}: must be a positive number",
                self.min_scale
            ));
        }
        if let Some(scale) = self.static_scale
            && !(scale.is_finite() && scale > 0.0)
        {
            return Err(format!(
                "train.loss_scaling.static_scale = {scale}: must be a positive number"
            ));
        }
        Ok(())
    }
}

/// The scaler's state, kept in every checkpoint (`trainer.json`); the
/// ranks agree on every overflow, so it is the same on all of them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// The scale the next step's loss is multiplied by.
    pub scale: f64,
    /// Steps seen (DeepSpeed's `cur_iter`).
    pub iteration: u64,
    /// The step of the last overflow (DeepSpeed's `last_overflow_iter`;
    /// -1 before the first).
    pub last_overflow: i64,
    /// Steps skipped so far.
    pub skipped: u64,
}

/// What an overflow did to the scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Overflow {
    /// The step is skipped; the scale went from `from` to `to`.
    Skipped {
        /// The scale the step tried.
        from: f64,
        /// The scale of the next step.
        to: f64,
    },
    /// The scale was already at its floor: the run cannot go on.
    AtFloor {
        /// The floor (`min_scale`).
        scale: f64,
    },
}

impl LossScaler {
    /// The scaler at the start of a run.
    pub fn new(config: &LossScaling) -> Self {
        Self {
            scale: config
                .static_scale
                .unwrap_or_else(|| 2f64.powi(config.initial_scale_power as i32)),
            iteration: 0,
            last_overflow: -1,
            skipped: 0,
        }
    }

    /// A checkpoint's scaler continued under `config`, which a resume may
    /// change: a static scale it names is the scale from now on (the
    /// checkpoint's would otherwise stay, never updated), and a dynamic
    /// scale below a raised `min_scale` starts at that floor (an overflow
    /// would otherwise end the run at once, at a scale never halved to it).
    pub fn resumed_under(self, config: &LossScaling) -> Self {
        let scale = match config.static_scale {
            Some(scale) => scale,
            None => self.scale.max(config.min_scale),
        };
        Self { scale, ..self }
    }

    /// Records a step: `overflow` when any rank's gradient had an inf or a
    /// NaN (the step is then skipped). Returns what happened on an
    /// overflow, `None` on a clean step.
    pub fn update(&mut self, overflow: bool, config: &LossScaling) -> Option<Overflow> {
        let dynamic = config.static_scale.is_none();
        let iteration = self.iteration as i64;
        self.iteration += 1;
        if overflow {
            self.skipped += 1;
            let from = self.scale;
            if dynamic {
                self.last_overflow = iteration;
                if from <= config.min_scale {
                    return Some(Overflow::AtFloor { scale: from });
                }
                self.scale = (from / 2.0).max(config.min_scale);
            }
            return Some(Overflow::Skipped {
                from,
                to: self.scale,
            });
        }
        let stable = iteration - self.last_overflow - 1;
        if dynamic && stable > 0 && (stable as u64).is_multiple_of(config.scale_window) {
            self.scale *= 2.0;
        }
        None
    }
}

/// The verdict on an fp16 step, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Verdict {
    /// The gradients are finite everywhere: multiply them by `unscale`
    /// (1 / the scale the step tried) and step.
    Step {
        /// 1 / the step's scale.
        unscale: f32,
    },
    /// Some rank overflowed: every rank skips the step.
    Skip,
}

/// Judges step `t` from this rank's gradient's sum of squares (inf or NaN
/// after an overflow anywhere in it): the ranks agree in one allreduce of
/// a flag, so one rank's overflow skips the step on all, and the scaler
/// moves the same way on all. An overflow at the floor is an error.
pub(crate) fn judge(
    scaler: &mut LossScaler,
    config: &LossScaling,
    squares: f32,
    t: u64,
    comm: &dyn Communicator,
) -> Result<Verdict, TrainError> {
    let local = !squares.is_finite() || injected_overflow(t, comm.rank());
    let mut flag = [f32::from(u8::from(local))];
    if comm.world_size() > 1 {
        comm.allreduce_f32(&mut flag, ReduceOp::Sum)?;
    }
    let tried = scaler.scale;
    match scaler.update(flag[0] > 0.0, config) {
        None => Ok(Verdict::Step {
            unscale: (1.0 / tried) as f32,
        }),
        Some(Overflow::Skipped { from, to }) => {
            if comm.rank() == 0 {
                tracing::warn!(
                    "step {t}: fp16 gradient overflow on {} rank(s): step skipped, loss scale \
                     {from} -> {to}",
                    flag[0]
                );
            }
            Ok(Verdict::Skip)
        }
        Some(Overflow::AtFloor { scale }) => Err(TrainError::LossScaleFloor { step: t, scale }),
    }
}

/// The fault-injection hook of the fp16 tests (`TERSE_INJECT_OVERFLOW =
/// "STEP:RANK,…"`): that rank's gradient counts as overflowed at that step,
/// as an inf in it would; `STEP:RANK:loss` overflows its forward pass too
/// (its loss inf, [`injected_loss_overflow`]). Unset in normal runs.
fn injected_overflow(t: u64, rank: usize) -> bool {
    injected().iter().any(|&(s, r, _)| (s, r) == (t, rank))
}

/// Whether the hook overflows rank `rank`'s loss at step `t`.
pub(crate) fn injected_loss_overflow(t: u64, rank: usize) -> bool {
    injected().contains(&(t, rank, true))
}

/// The hook's (step, rank, loss too) entries.
fn injected() -> &'static [(u64, usize, bool)] {
    static AT: std::sync::OnceLock<Vec<(u64, usize, bool)>> = std::sync::OnceLock::new();
    AT.get_or_init(|| {
        std::env::var("TERSE_INJECT_OVERFLOW")
            .unwrap_or_default()
            .split(',')
            .filter_map(|item| {
                let mut fields = item.trim().split(':');
                let (step, rank) = (fields.next()?.parse().ok()?, fields.next()?.parse().ok()?);
                Some((step, rank, fields.next() == Some("loss")))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resume under changed loss scaling: its static scale, or the
    /// dynamic scale raised to a new floor; otherwise the checkpoint's.
    #[test]
    fn a_resumed_scaler_follows_the_resumed_run_s_settings() {
        let saved = LossScaler {
            scale: 4096.0,
            iteration: 90,
            last_overflow: 40,
            skipped: 3,
        };
        let dynamic = LossScaling::default();
        assert_eq!(saved.resumed_under(&dynamic), saved);
        let fixed = LossScaling {
            static_scale: Some(256.0),
            ..LossScaling::default()
        };
        assert_eq!(saved.resumed_under(&fixed).scale, 256.0);
        let floor = LossScaling {
            min_scale: 8192.0,
            ..LossScaling::default()
        };
        let raised = saved.resumed_under(&floor);
        assert_eq!(
            (raised.scale, raised.iteration, raised.skipped),
            (8192.0, 90, 3)
        );
    }

    #[test]
    fn an_overflow_halves_and_a_window_of_clean_steps_doubles() {
        let config = LossScaling {
            initial_scale_power: 4,
            scale_window: 3,
            ..LossScaling::default()
        };
        let mut s = LossScaler::new(&config);
        assert_eq!(s.scale, 16.0);
        assert_eq!(
            s.update(true, &config),
            Some(Overflow::Skipped {
                from: 16.0,
                to: 8.0
            })
        );
        // Stable intervals 0, 1, 2, 3: the third clean step after the
        // overflow (stable interval 3) doubles.
        let scales: Vec<f64> = (0..4)
            .map(|_| {
                assert_eq!(s.update(false, &config), None);
                s.scale
            })
            .collect();
        assert_eq!(scales, [8.0, 8.0, 8.0, 16.0]);
        assert_eq!(s.skipped, 1);
    }

    #[test]
    fn an_overflow_at_the_floor_is_reported() {
        let config = LossScaling {
            initial_scale_power: 1,
            min_scale: 1.0,
            ..LossScaling::default()
        };
        let mut s = LossScaler::new(&config);
        assert!(matches!(
            s.update(true, &config),
            Some(Overflow::Skipped { .. })
        ));
        assert_eq!(s.scale, 1.0);
        assert_eq!(
            s.update(true, &config),
            Some(Overflow::AtFloor { scale: 1.0 })
        );
    }

    #[test]
    fn a_static_scale_never_moves_but_still_skips() {
        let config = LossScaling {
            static_scale: Some(128.0),
            scale_window: 1,
            ..LossScaling::default()
        };
        let mut s = LossScaler::new(&config);
        assert!(matches!(
            s.update(true, &config),
            Some(Overflow::Skipped { .. })
        ));
        for _ in 0..3 {
            s.update(false, &config);
        }
        assert_eq!((s.scale, s.skipped), (128.0, 1));
    }
}
