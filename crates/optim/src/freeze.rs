//! `freeze = "auto"` (ALGORITHMS.md "1-bit Adam"; Tang et al. §7.1): v has
//! settled once `‖v_t‖₁ / ‖v_{t-Δ}‖₁ ≥ threshold` with `Δ = round(1/(1-β2))`,
//! and the warmup stage ends at the first such step at or after the LR
//! warmup.

use std::collections::VecDeque;

use crate::{FreezeConfig, FreezeRule, Stage};

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

/// Where a 1-bit optimizer's warmup ends: `freeze_step` from the config, or
/// the step [`AutoFreeze`] picks, with what a checkpoint must carry of it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FreezePoint {
    rule: FreezeRule,
    step: Option<u64>,
    auto: Option<AutoFreeze>,
}

impl FreezePoint {
    /// The freeze `config` asks for; the auto rule's window follows β2.
    pub(crate) fn new(config: &FreezeConfig, beta_2: f64) -> Self {
        let rule = config.freeze;
        match rule {
            FreezeRule::Step => FreezePoint {
                rule,
                step: Some(config.freeze_step),
                auto: None,
            },
            FreezeRule::Auto => FreezePoint {
                rule,
                step: None,
                auto: Some(AutoFreeze::new(beta_2, config.freeze_threshold)),
            },
        }
    }

    /// `T_w`, once known.
    pub(crate) fn step(&self) -> Option<u64> {
        self.step
    }

    /// After warmup step `t`: whether `t` is the freeze step. The auto rule
    /// reads `‖v_t‖₁` from `v_l1` (computed only when it is needed).
    pub(crate) fn ends_warmup(
        &mut self,
        t: u64,
        v_l1: impl FnOnce() -> f64,
        lr_warmup: u64,
    ) -> bool {
        if let Some(auto) = &mut self.auto {
            if !auto.observe(t, v_l1(), lr_warmup) {
                return false;
            }
            self.step = Some(t);
            self.auto = None;
        }
        self.step == Some(t)
    }

    /// Whether the freeze step is still to be found from ‖v‖₁ (which then
    /// has to be read whole after every warmup step).
    pub(crate) fn is_auto(&self) -> bool {
        self.auto.is_some()
    }

    /// Warmup up to and including `T_w`, compression after.
    pub(crate) fn stage(&self, t: u64) -> Stage {
        match self.step {
            Some(t_w) if t > t_w => Stage::Compression,
            _ => Stage::Warmup,
        }
    }

    /// `freeze_step` (empty until known) and `freeze_history` (the auto
    /// rule's norms, empty once frozen).
    pub(crate) fn scalars(&self) -> Vec<(&'static str, Vec<f64>)> {
        vec![
            (
                "freeze_step",
                self.step.map(|t| t as f64).into_iter().collect(),
            ),
            (
                "freeze_history",
                self.auto
                    .as_ref()
                    .map(AutoFreeze::history)
                    .unwrap_or_default(),
            ),
        ]
    }

    /// Whether `role` is one of [`FreezePoint::scalars`].
    pub(crate) fn owns(role: &str) -> bool {
        matches!(role, "freeze_step" | "freeze_history")
    }

    /// Restores one of [`FreezePoint::scalars`].
    pub(crate) fn set_scalars(&mut self, role: &str, values: Vec<f64>) -> Result<(), String> {
        match role {
            "freeze_step" => match values.as_slice() {
                [] if self.rule == FreezeRule::Auto => {
                    self.step = None;
                    Ok(())
                }
                [t] => {
                    self.step = Some(*t as u64);
                    self.auto = None;
                    Ok(())
                }
                other => Err(format!("freeze_step {other:?}")),
            },
            "freeze_history" => match &mut self.auto {
                Some(auto) => auto.restore(values),
                None if values.is_empty() => Ok(()),
                None => Err("a freeze history for a run that has frozen".into()),
            },
            _ => Err(format!("unknown scalar state `{role}`")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AutoFreeze;

    /// ‖v_t‖₁ = 1 + 10·0.9^t (a variance settling after an early peak): the
    /// ratio to Δ = 10 steps back, (1+10·0.9^t)/(1+10·0.9^(t-10)), first
    /// reaches 0.96 at t = 58 (hand-computed: 0.95699 at 57, 0.96104 at 58).
    #[test]
    fn freezes_where_the_rule_says_and_not_before_the_lr_warmup() {
        let trace = |t: u64| 1.0 + 10.0 * 0.9f64.powi(t as i32);
        let first = |lr_warmup: u64| {
            let mut rule = AutoFreeze::new(0.9, 0.96);
            assert_eq!(rule.delta(), 10);
            (1..200).find(|&t| rule.observe(t, trace(t), lr_warmup))
        };
        assert_eq!(first(0), Some(58));
        assert_eq!(first(58), Some(58));
        assert_eq!(first(70), Some(70), "never before the LR warmup ends");
        // β2 = 0.999 looks 1000 steps back: nothing before step 1001.
        let mut rule = AutoFreeze::new(0.999, 0.96);
        assert!((1..=1000).all(|t| !rule.observe(t, 1.0, 0)));
        assert!(rule.observe(1001, 1.0, 0));
    }

    #[test]
    fn a_restored_history_continues_the_same_decision() {
        let mut a = AutoFreeze::new(0.9, 0.96);
        let trace = |t: u64| 1.0 + 10.0 * 0.9f64.powi(t as i32);
        for t in 1..=15 {
            assert!(!a.observe(t, trace(t), 0));
        }
        let mut b = AutoFreeze::new(0.9, 0.96);
        b.restore(a.history()).unwrap();
        for t in 16..=30 {
            assert_eq!(
                a.observe(t, trace(t), 0),
                b.observe(t, trace(t), 0),
                "step {t}"
            );
        }
        assert!(b.restore(vec![1.0; 12]).is_err());
    }
}
