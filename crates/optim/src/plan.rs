//! What an optimizer will send over the network in each part of a run,
//! printed before step 1 — so that a 1-bit run whose freeze lies beyond its
//! last step (plain Adam under another name, the silent no-op DeepSpeed's
//! 1-bit users report) is visible, and refused unless asked for.

use std::fmt;
use std::ops::RangeInclusive;

use crate::zero_one_adam::schedule::ZeroOneSchedule;
use crate::{FreezeConfig, FreezeRule, LrSchedule, ZeroOneAdamConfig};

/// The stages of a run of `steps` steps (each rule's arm of
/// `OptimizerConfig::plan` is in the registry).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Step ranges and what each sends.
    pub stages: Vec<(RangeInclusive<u64>, String)>,
    /// A freeze-based optimizer whose warmup outlasts the run: it never
    /// leaves its uncompressed stage.
    pub freeze_unreachable: bool,
}

impl Plan {
    /// One stage over the whole run of `steps` steps.
    pub(crate) fn whole(steps: u64, what: impl Into<String>) -> Self {
        Self {
            stages: vec![(1..=steps, what.into())],
            freeze_unreachable: false,
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (range, what)) in self.stages.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            if range.start() == range.end() {
                write!(f, "step {} {what}", range.start())?;
            } else {
                write!(f, "steps {}–{} {what}", range.start(), range.end())?;
            }
        }
        Ok(())
    }
}

/// 0/1 Adam's two stages, with the steps of each kind counted by running
/// its schedules: which steps allreduce the gradient in fp32, which send
/// it 1-bit compressed, which are local and which synchronise.
pub(crate) fn zero_one(c: &ZeroOneAdamConfig, steps: u64) -> Plan {
    let mut schedule = ZeroOneSchedule::new(
        c.var_update_scaler,
        c.local_step_scaler,
        c.local_step_clipper,
    );
    let last_variance = c.var_freeze_step.min(steps);
    let exact = (1..=last_variance)
        .filter(|&t| {
            let due = schedule.variance_due(t);
            schedule.after_variance_step(t);
            due
        })
        .count() as u64;
    let mut stages = vec![(
        1..=last_variance,
        format!(
            "variance stage: fp32 gradient allreduce on {exact} steps (v updated; the interval \
             doubles every {} of them), 1-bit compressed gradient on the other {}",
            c.var_update_scaler,
            last_variance - exact
        ),
    )];
    if c.var_freeze_step >= steps {
        stages[0].1 += &format!(
            "; var_freeze_step = {} is not before the last step, so this run takes no local step",
            c.var_freeze_step
        );
    } else {
        let syncs = (c.var_freeze_step + 1..=steps)
            .filter(|&t| {
                let due = schedule.sync_due(t);
                schedule.after_local_step();
                due
            })
            .count();
        let local = steps - c.var_freeze_step;
        stages.push((
            c.var_freeze_step + 1..=steps,
            format!(
                "local steps, v frozen: {syncs} of {local} end with a 1-bit compressed \
                 allreduce of the accumulated update (every step at first, the interval \
                 doubling every {} local steps up to {}; {} at the end), the others send \
                 nothing; the last pending steps are synchronised when the run ends",
                c.local_step_scaler,
                c.local_step_clipper,
                schedule.local_interval()
            ),
        ));
    }
    Plan {
        stages,
        freeze_unreachable: false,
    }
}

/// A warmup of fp32 allreduce, then `after` from the step after the freeze.
pub(crate) fn frozen(
    compression: &FreezeConfig,
    beta_2: f64,
    steps: u64,
    schedule: &LrSchedule,
    after: &str,
) -> Plan {
    let warmup = "fp32 gradient allreduce (warmup)".to_string();
    match compression.freeze {
        FreezeRule::Step => {
            let last_warmup = compression.freeze_step;
            if last_warmup >= steps {
                return Plan {
                    stages: vec![(
                        1..=steps,
                        format!(
                            "{warmup}; freeze_step = {last_warmup} is not before the last \
                             step, so this run never compresses"
                        ),
                    )],
                    freeze_unreachable: true,
                };
            }
            Plan {
                stages: vec![
                    (1..=last_warmup, warmup),
                    (last_warmup + 1..=steps, after.to_string()),
                ],
                freeze_unreachable: false,
            }
        }
        FreezeRule::Auto => {
            // The rule looks Δ steps back and waits for the LR warmup.
            let delta = ((1.0 / (1.0 - beta_2)).round() as u64).max(1);
            let earliest = schedule.warmup_steps().max(delta + 1);
            Plan {
                stages: vec![(
                    1..=steps,
                    format!(
                        "{warmup} until ‖v‖₁ settles (freeze = \"auto\", at step {earliest} \
                         at the earliest), then {after}"
                    ),
                )],
                freeze_unreachable: earliest >= steps,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OptimizerConfig;

    fn config(text: &str) -> OptimizerConfig {
        toml::from_str(text).unwrap()
    }

    const CONSTANT: LrSchedule = LrSchedule::Constant { lr: 1e-3 };

    #[test]
    fn a_reachable_freeze_splits_the_run() {
        let plan = config("name = \"onebit_lamb\"\nfreeze_step = 12\n").plan(30, &CONSTANT);
        assert!(!plan.freeze_unreachable);
        assert_eq!(
            plan.to_string(),
            "steps 1–12 fp32 gradient allreduce (warmup); steps 13–30 1-bit compressed momentum"
        );
    }

    #[test]
    fn a_freeze_at_or_after_the_last_step_is_unreachable() {
        for steps in [30, 1000] {
            let plan = config("name = \"onebit_adam\"\n").plan(steps, &CONSTANT);
            assert!(plan.freeze_unreachable, "{steps}: {plan}");
            assert!(plan.to_string().contains("never compresses"), "{plan}");
        }
        assert!(
            !config("name = \"onebit_adam\"\n")
                .plan(1001, &CONSTANT)
                .freeze_unreachable
        );
    }

    #[test]
    fn the_auto_rule_waits_for_its_window() {
        // β2 = 0.999: Δ = 1000, so the earliest freeze is step 1001.
        let auto = config("name = \"onebit_adam\"\nfreeze = \"auto\"\n");
        assert!(auto.plan(500, &CONSTANT).freeze_unreachable);
        assert!(!auto.plan(5000, &CONSTANT).freeze_unreachable);
    }

    /// κ = 2 over 40 variance steps: 9 exact (hand-derived in
    /// `zero_one_adam::schedule`'s tests); local steps 41–60 with scaler 4,
    /// clipper 4: interval 1 for 41–44 (4 syncs), 2 for 45–48 (t + 1 even:
    /// 45, 47), 4 from 49 (t + 1 ≡ 0 mod 4: 51, 55, 59).
    #[test]
    fn zero_one_adam_counts_each_kind_of_step() {
        let plan = config(
            "name = \"zero_one_adam\"\nvar_freeze_step = 40\nvar_update_scaler = 2\n\
             local_step_scaler = 4\nlocal_step_clipper = 4\n",
        )
        .plan(60, &CONSTANT);
        let text = plan.to_string();
        assert!(!plan.freeze_unreachable);
        assert!(
            text.starts_with("steps 1–40 variance stage: fp32 gradient allreduce on 9 steps"),
            "{text}"
        );
        assert!(
            text.contains("1-bit compressed gradient on the other 31"),
            "{text}"
        );
        assert!(
            text.contains("steps 41–60 local steps, v frozen: 9 of 20"),
            "{text}"
        );
        assert!(text.contains("4 at the end"), "{text}");
        let short = config("name = \"zero_one_adam\"\n").plan(100, &CONSTANT);
        assert!(short.to_string().contains("takes no local step"), "{short}");
    }

    #[test]
    fn uncompressed_optimizers_have_one_stage() {
        let plan = config("name = \"adam\"\n").plan(5, &CONSTANT);
        assert_eq!(plan.to_string(), "steps 1–5 fp32 gradient allreduce");
        assert!(!plan.freeze_unreachable);
    }
}
