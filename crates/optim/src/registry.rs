//! The registry of optimizers: the `name` a config file gives, its config
//! type, the rule built from it, the plan it prints and the short run every
//! parity check steps it in. Adding an optimizer touches four files: its
//! own (config and rule, from the element-wise passes of `pass/`, which
//! give it a host loop and a device kernel), one variant here with its
//! arms, its `mod`/`pub use` in `lib.rs`, and its name in
//! `optimizer-names.txt` (the list tools outside the workspace's crates
//! read; a test here keeps the two equal). docs/ARCHITECTURE.md says how.

use serde::{Deserialize, Serialize};
use terse_comm::Communicator;

use crate::onebit_adam::{AdamVariant, OneBitAdam};
use crate::onebit_lamb::OneBitLamb;
use crate::plan::{self, Plan};
use crate::slamb::Slamb;
use crate::step::FlatOptimizer;
use crate::zero_one_adam::ZeroOneAdam;
use crate::{
    Adam, AdamConfig, Lamb, LambConfig, LrSchedule, OneBitAdamConfig, OneBitLambConfig, OptimError,
    ParamLayout, Sgd, SgdConfig, SlambConfig, ZeroOneAdamConfig,
};
use crate::{WithCompression, WithMoments};

/// One optimizer, chosen by `name` in a config file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum OptimizerConfig {
    /// Adam with decoupled weight decay (AdamW).
    Adam(AdamConfig),
    /// LAMB: Adam's direction with a per-segment trust ratio.
    Lamb(LambConfig),
    /// Momentum SGD.
    Sgd(SgdConfig),
    /// 1-bit Adam: Adam warmup, then frozen v and 1-bit compressed momentum.
    OnebitAdam(OneBitAdamConfig),
    /// Ablation: 1-bit Adam with the momentum allreduced in fp32.
    OnebitAdamFp32(OneBitAdamConfig),
    /// Ablation: Adam on a 1-bit compressed gradient from step 1 (diverges).
    AdamOnebitNaive(OneBitAdamConfig),
    /// 1-bit LAMB: LAMB warmup, then compressed momentum with scaling and a
    /// fresh variance.
    OnebitLamb(OneBitLambConfig),
    /// Ablation: LAMB with v and c frozen and compressed momentum.
    LambOnebitBasic(OneBitLambConfig),
    /// SLAMB: random-k sparse momentum synchronisation.
    Slamb(SlambConfig),
    /// 0/1 Adam: variance updates on a doubling schedule, then local steps
    /// synchronised by a 1-bit allreduce on a second one.
    ZeroOneAdam(ZeroOneAdamConfig),
}

/// Every optimizer's `name`, one per line, in the registry's order: the list
/// `cargo xtask` (which links no workspace crate) offers as `--optimizer`.
pub const OPTIMIZER_NAMES: &str = include_str!("../optimizer-names.txt");

impl OptimizerConfig {
    /// The optimizer's name as written in configs and state files.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Adam(_) => "adam",
            Self::Lamb(_) => "lamb",
            Self::Sgd(_) => "sgd",
            Self::OnebitAdam(_) => "onebit_adam",
            Self::OnebitAdamFp32(_) => "onebit_adam_fp32",
            Self::AdamOnebitNaive(_) => "adam_onebit_naive",
            Self::OnebitLamb(_) => "onebit_lamb",
            Self::LambOnebitBasic(_) => "lamb_onebit_basic",
            Self::Slamb(_) => "slamb",
            Self::ZeroOneAdam(_) => "zero_one_adam",
        }
    }

    /// Checks every field's range; errors name the field as
    /// `{name}.{field}`.
    pub fn validate(&self) -> Result<(), OptimError> {
        let name = self.name();
        match self {
            Self::Adam(c) => c.validate(name),
            Self::Lamb(c) => c.validate(name),
            Self::Sgd(c) => c.validate(name),
            Self::OnebitAdam(c) | Self::OnebitAdamFp32(c) | Self::AdamOnebitNaive(c) => {
                c.validate(name)
            }
            Self::OnebitLamb(c) | Self::LambOnebitBasic(c) => c.validate(name),
            Self::Slamb(c) => c.validate(name),
            Self::ZeroOneAdam(c) => c.validate(name),
        }
    }

    /// The update rule with zeroed state for `layout` on `comm`'s rank (the
    /// compressed optimizers size their server error by the world).
    pub(crate) fn build(
        &self,
        layout: &ParamLayout,
        comm: &dyn Communicator,
    ) -> Result<Box<dyn FlatOptimizer>, OptimError> {
        let name = self.name();
        let d = layout.len();
        Ok(match self {
            Self::Adam(c) => Box::new(Adam::new(c.clone(), d)),
            Self::Lamb(c) => Box::new(Lamb::new(c.clone(), d)),
            Self::Sgd(c) => Box::new(Sgd::new(c.clone(), d)),
            Self::OnebitAdam(c) => Box::new(OneBitAdam::new(
                c.clone(),
                name,
                AdamVariant::OneBit,
                layout,
                comm,
            )?),
            Self::OnebitAdamFp32(c) => Box::new(OneBitAdam::new(
                c.clone(),
                name,
                AdamVariant::Fp32Momentum,
                layout,
                comm,
            )?),
            Self::AdamOnebitNaive(c) => Box::new(OneBitAdam::new(
                c.clone(),
                name,
                AdamVariant::Naive,
                layout,
                comm,
            )?),
            Self::OnebitLamb(c) => Box::new(OneBitLamb::new(c.clone(), name, false, layout, comm)?),
            Self::LambOnebitBasic(c) => {
                Box::new(OneBitLamb::new(c.clone(), name, true, layout, comm)?)
            }
            Self::Slamb(c) => Box::new(Slamb::new(c.clone(), layout, comm)),
            Self::ZeroOneAdam(c) => Box::new(ZeroOneAdam::new(c.clone(), name, layout, comm)?),
        })
    }
}

impl OptimizerConfig {
    /// The plan of a run of `steps` steps under `schedule` (what each part
    /// of the run sends, printed before step 1).
    pub fn plan(&self, steps: u64, schedule: &LrSchedule) -> Plan {
        let whole = |what: String| Plan::whole(steps, what);
        let fp32 = "fp32 gradient allreduce".to_string();
        match self {
            Self::Adam(_) | Self::Lamb(_) | Self::Sgd(_) => whole(fp32),
            Self::AdamOnebitNaive(_) => whole("1-bit compressed gradient (ablation)".into()),
            Self::Slamb(c) => whole(format!(
                "sparse momentum (k = {}), parameters averaged every {} steps",
                c.k, c.sync_every
            )),
            Self::OnebitAdam(c) => plan::frozen(
                &c.compression,
                c.moments.beta_2,
                steps,
                schedule,
                "1-bit compressed momentum",
            ),
            Self::OnebitAdamFp32(c) => plan::frozen(
                &c.compression,
                c.moments.beta_2,
                steps,
                schedule,
                "fp32 momentum allreduce, variance frozen (ablation)",
            ),
            Self::OnebitLamb(c) | Self::LambOnebitBasic(c) => plan::frozen(
                &c.compression,
                c.moments.beta_2,
                steps,
                schedule,
                "1-bit compressed momentum",
            ),
            Self::ZeroOneAdam(c) => plan::zero_one(c, steps),
        }
    }
}

impl OptimizerConfig {
    /// Every registered optimizer, in the registry's order, set to reach
    /// each of its stages in a short run: weight decay 0.01, a freeze (or
    /// 0/1 Adam's variance freeze, SLAMB's first model average) after
    /// `warmup` steps, and SLAMB's mask sparse on segments of 1000 elements
    /// and more. The parity checks (device against host, `mpirun` against
    /// local ranks, `terse-optim-check`) run every rule in this form, so a
    /// variant added here is covered by all of them; a test keeps this
    /// list equal to the names.
    pub fn short_runs(warmup: u64) -> Vec<Self> {
        let onebit_adam = OneBitAdamConfig::default()
            .with_weight_decay(0.01)
            .with_freeze_step(warmup);
        let onebit_lamb = OneBitLambConfig::default()
            .with_weight_decay(0.01)
            .with_freeze_step(warmup);
        vec![
            Self::Adam(AdamConfig::default().with_weight_decay(0.01)),
            Self::Lamb(LambConfig::default().with_weight_decay(0.01)),
            Self::Sgd(SgdConfig::default()),
            Self::OnebitAdam(onebit_adam.clone()),
            Self::OnebitAdamFp32(onebit_adam.clone()),
            Self::AdamOnebitNaive(onebit_adam),
            Self::OnebitLamb(onebit_lamb.clone()),
            Self::LambOnebitBasic(onebit_lamb),
            Self::Slamb(SlambConfig {
                k: 0.25,
                sync_every: warmup.max(1),
                always_sync_below: 1000,
                mask_seed: 5,
                ..SlambConfig::default().with_weight_decay(0.01)
            }),
            Self::ZeroOneAdam(ZeroOneAdamConfig {
                var_freeze_step: warmup,
                var_update_scaler: 2,
                local_step_scaler: 2,
                local_step_clipper: 4,
                ..ZeroOneAdamConfig::default().with_weight_decay(0.01)
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EpsMode;

    #[test]
    fn the_names_file_lists_every_variant_in_order() {
        // serde names every variant when it refuses an unknown one:
        // "unknown variant `nope`, expected one of `adam`, `lamb`, …".
        let error = toml::from_str::<OptimizerConfig>("name = \"nope\"")
            .unwrap_err()
            .to_string();
        let expected = error
            .split("expected one of ")
            .nth(1)
            .unwrap_or_else(|| panic!("{error}"));
        let variants: Vec<&str> = expected
            .lines()
            .next()
            .unwrap()
            .split(", ")
            .map(|name| name.trim_matches('`'))
            .collect();
        let listed: Vec<&str> = OPTIMIZER_NAMES.lines().collect();
        assert_eq!(listed, variants);
        for name in listed {
            let config: OptimizerConfig = toml::from_str(&format!("name = \"{name}\"")).unwrap();
            assert_eq!(config.name(), name);
        }
    }

    #[test]
    fn short_runs_cover_every_name_once_and_validate() {
        let runs = OptimizerConfig::short_runs(3);
        let names: Vec<&str> = runs.iter().map(OptimizerConfig::name).collect();
        assert_eq!(names, OPTIMIZER_NAMES.lines().collect::<Vec<_>>());
        for run in &runs {
            run.validate().unwrap();
        }
    }

    #[test]
    fn toml_names_the_optimizer_and_fills_defaults() {
        let config: OptimizerConfig = toml::from_str(
            r#"
            name = "lamb"
            weight_decay = 0.01
            eps_mode = "inside"
            "#,
        )
        .unwrap();
        let OptimizerConfig::Lamb(lamb) = &config else {
            panic!("expected lamb, got {config:?}")
        };
        assert_eq!(lamb.moments.weight_decay, 0.01);
        assert_eq!(lamb.moments.eps_mode, EpsMode::Inside);
        assert_eq!((lamb.c_min, lamb.c_max), (0.01, 0.3));
        assert!(!lamb.bias_correction);
        config.validate().unwrap();
    }

    #[test]
    fn slamb_options_parse_from_toml() {
        let config: OptimizerConfig =
            toml::from_str("name = \"slamb\"\nk = 0.05\nmask = \"cyclic\"\nvalues = \"f16\"\n")
                .unwrap();
        let OptimizerConfig::Slamb(slamb) = &config else {
            panic!("expected slamb, got {config:?}")
        };
        assert_eq!(slamb.k, 0.05);
        assert_eq!(slamb.mask, crate::MaskKind::Cyclic);
        assert_eq!(slamb.values, terse_comm::SparseValues::F16);
        assert_eq!((slamb.beta_3, slamb.sync_every), (0.93, 100));
        let bad = toml::from_str::<OptimizerConfig>("name = \"slamb\"\nvalues = \"f8\"\n");
        assert!(bad.unwrap_err().to_string().contains("f8"));
    }

    #[test]
    fn unknown_fields_and_names_are_rejected() {
        let typo = toml::from_str::<OptimizerConfig>("name = \"adam\"\nbeta1 = 0.8\n");
        let message = typo.unwrap_err().to_string();
        assert!(message.contains("beta1"), "{message}");
        assert!(toml::from_str::<OptimizerConfig>("name = \"adamax\"\n").is_err());
    }

    #[test]
    fn every_optimizer_refuses_a_key_no_field_claims() {
        for name in OPTIMIZER_NAMES.lines() {
            let typo = toml::from_str::<OptimizerConfig>(&format!(
                "name = \"{name}\"\nweight_decay = 0.01\nfreeze_stp = 3\n"
            ));
            let message = typo.unwrap_err().to_string();
            assert!(message.contains("freeze_stp"), "{name}: {message}");
        }
    }

    #[test]
    fn shared_fields_stay_top_level_keys_and_round_trip() {
        let text = "name = \"onebit_lamb\"\nbeta_2 = 0.99\nfreeze_step = 7\nc_max = 0.5\nbias_correction = true\n";
        let config: OptimizerConfig = toml::from_str(text).unwrap();
        let OptimizerConfig::OnebitLamb(c) = &config else {
            panic!("expected onebit_lamb, got {config:?}")
        };
        assert_eq!(c.moments.beta_2, 0.99);
        assert_eq!(c.compression.freeze_step, 7);
        assert_eq!(c.c_max, 0.5);
        assert!(c.bias_correction);
        // Per-optimizer defaults survive flattening: 1-bit LAMB keeps its
        // own bias-correction default, Adam its own.
        let adam: OptimizerConfig = toml::from_str("name = \"adam\"\n").unwrap();
        let OptimizerConfig::Adam(a) = &adam else {
            panic!("expected adam")
        };
        assert!(a.bias_correction);
        let written = toml::to_string(&config).unwrap();
        assert!(written.contains("freeze_step = 7"), "{written}");
        assert!(!written.contains("moments"), "{written}");
        assert_eq!(toml::from_str::<OptimizerConfig>(&written).unwrap(), config);
    }

    #[test]
    fn validation_names_the_field() {
        // The scale-block rule is the compressed allreduce's own check,
        // reported under the config's field.
        let bad: OptimizerConfig =
            toml::from_str("name = \"onebit_lamb\"\nscale_block = 48\n").unwrap();
        let message = bad.validate().unwrap_err().to_string();
        assert!(
            message.contains("onebit_lamb.scale_block") && message.contains("multiple of 32"),
            "{message}"
        );
        let lamb = LambConfig {
            c_min: 0.5,
            c_max: 0.3,
            ..Default::default()
        };
        let sgd = SgdConfig {
            momentum: 0.0,
            nesterov: true,
            ..Default::default()
        };
        for (bad, field) in [
            (
                OptimizerConfig::Adam(AdamConfig::default().with_beta_2(1.0)),
                "adam.beta_2",
            ),
            (OptimizerConfig::Lamb(lamb), "lamb.c_min"),
            (OptimizerConfig::Sgd(sgd), "sgd.nesterov"),
        ] {
            let message = bad.validate().unwrap_err().to_string();
            assert!(message.contains(field), "{message}");
        }
    }

    #[test]
    fn eps_inside_the_compression_stage_needs_a_compression_stage() {
        let config: OptimizerConfig =
            toml::from_str("name = \"onebit_adam\"\neps_mode = \"inside_compressed\"\n").unwrap();
        let OptimizerConfig::OnebitAdam(c) = &config else {
            panic!("expected onebit_adam, got {config:?}")
        };
        assert_eq!(c.moments.eps_mode, EpsMode::InsideCompressed);
        config.validate().unwrap();
        assert_eq!(EpsMode::InsideCompressed.in_stage(false), EpsMode::Outside);
        assert_eq!(EpsMode::InsideCompressed.in_stage(true), EpsMode::Inside);
        assert_eq!(EpsMode::Inside.in_stage(false), EpsMode::Inside);
        for name in ["adam", "lamb", "slamb"] {
            let config: OptimizerConfig = toml::from_str(&format!(
                "name = \"{name}\"\neps_mode = \"inside_compressed\"\n"
            ))
            .unwrap();
            let message = config.validate().unwrap_err().to_string();
            assert!(message.contains(&format!("{name}.eps_mode")), "{message}");
        }
    }
}
