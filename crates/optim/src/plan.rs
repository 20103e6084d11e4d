//! What an optimizer will send over the network in each part of a run,
//! printed before step 1 — so that a 1-bit run whose freeze lies beyond its
//! last step (plain Adam under another name, the silent no-op DeepSpeed's
//! 1-bit users report) is visible, and refused unless asked for.

use std::fmt;
use std::ops::RangeInclusive;

use crate::{CompressionConfig, FreezeRule, LrSchedule, OptimizerConfig};

/// The stages of a run of `steps` steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Step ranges and what each sends.
    pub stages: Vec<(RangeInclusive<u64>, String)>,
    /// A freeze-based optimizer whose warmup outlasts the run: it never
    /// leaves its uncompressed stage.
    pub freeze_unreachable: bool,
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

impl OptimizerConfig {
    /// The plan of a run of `steps` steps under `schedule`.
    pub fn plan(&self, steps: u64, schedule: &LrSchedule) -> Plan {
        let whole = |what: String| Plan {
            stages: vec![(1..=steps, what)],
            freeze_unreachable: false,
        };
        let fp32 = "fp32 gradient allreduce".to_string();
        match self {
            Self::Adam(_) | Self::Lamb(_) | Self::Sgd(_) => whole(fp32),
            Self::AdamOnebitNaive(_) => whole("1-bit compressed gradient (ablation)".into()),
            Self::Slamb(c) => whole(format!(
                "sparse momentum (k = {}), parameters averaged every {} steps",
                c.k, c.sync_every
            )),
            Self::OnebitAdam(c) => frozen(
                &c.compression,
                c.moments.beta_2,
                steps,
                schedule,
                "1-bit compressed momentum",
            ),
            Self::OnebitAdamFp32(c) => frozen(
                &c.compression,
                c.moments.beta_2,
                steps,
                schedule,
                "fp32 momentum allreduce, variance frozen (ablation)",
            ),
            Self::OnebitLamb(c) | Self::LambOnebitBasic(c) => frozen(
                &c.compression,
                c.moments.beta_2,
                steps,
                schedule,
                "1-bit compressed momentum",
            ),
        }
    }
}

/// A warmup of fp32 allreduce, then `after` from the step after the freeze.
fn frozen(
    compression: &CompressionConfig,
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

    #[test]
    fn uncompressed_optimizers_have_one_stage() {
        let plan = config("name = \"adam\"\n").plan(5, &CONSTANT);
        assert_eq!(plan.to_string(), "steps 1–5 fp32 gradient allreduce");
        assert!(!plan.freeze_unreachable);
    }
}
