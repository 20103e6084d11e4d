//! `freeze = "auto"` (ALGORITHMS.md "1-bit Adam"; Tang et al. §7.1): v has
//! settled once `‖v_t‖₁ / ‖v_{t-Δ}‖₁ ≥ threshold` with `Δ = round(1/(1-β2))`,
//! and the warmup stage ends at the first such step at or after the LR
//! warmup.

use std::collections::VecDeque;

/// The norm history the rule needs: `‖v‖₁` of the last `Δ + 1` steps.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoFreeze {
    delta: usize,
    threshold: f64,
    history: VecDeque<f64>,
}

impl AutoFreeze {
    /// The rule for variance decay `beta_2`.
    pub fn new(beta_2: f64, threshold: f64) -> AutoFreeze {
        let delta = ((1.0 / (1.0 - beta_2)).round() as usize).max(1);
        AutoFreeze {
            delta,
            threshold,
            history: VecDeque::with_capacity(delta + 1),
        }
    }

    /// Δ: how many steps back the ratio looks.
    pub fn delta(&self) -> usize {
        self.delta
    }

    /// Records `‖v_t‖₁` after step `t`; true when `t` is the freeze step:
    /// `t ≥ lr_warmup`, `t - Δ ≥ 1` and the ratio reaches the threshold.
    pub fn observe(&mut self, t: u64, v_l1: f64, lr_warmup: u64) -> bool {
        if self.history.len() == self.delta + 1 {
            self.history.pop_front();
        }
        self.history.push_back(v_l1);
        if t < lr_warmup || self.history.len() < self.delta + 1 {
            return false;
        }
        let then = self.history[0];
        then > 0.0 && v_l1 / then >= self.threshold
    }

    /// The history, oldest first (for checkpoints).
    pub fn history(&self) -> Vec<f64> {
        self.history.iter().copied().collect()
    }

    /// Restores a saved history.
    pub fn restore(&mut self, history: Vec<f64>) -> Result<(), String> {
        if history.len() > self.delta + 1 {
            return Err(format!(
                "auto-freeze history of {} norms, at most {} for Δ = {}",
                history.len(),
                self.delta + 1,
                self.delta
            ));
        }
        self.history = history.into();
        Ok(())
    }
}
