//! Optimizer configuration: serde structs with the defaults of ALGORITHMS.md
//! on every field, and validation of the ranges the update rules need.

use serde::{Deserialize, Serialize};

use crate::OptimError;
use crate::compressed_config::{OneBitAdamConfig, OneBitLambConfig, SlambConfig};

/// Where ε enters Adam's denominator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EpsMode {
    /// `m̂ / (sqrt(v̂) + ε)`: Adam as published.
    #[default]
    Outside,
    /// `m̂ / sqrt(v̂ + ε)` at every step, warmup included: bounds the update
    /// of coordinates whose frozen variance is tiny, but also changes the
    /// warmup, so a run differs from Adam's before compression starts.
    Inside,
    /// Outside during the warmup, inside from the compression stage on:
    /// Tarasov & Ershov's placement, whose warmup is exactly Adam's. Only for
    /// optimizers with a compression stage.
    #[serde(rename = "inside_compressed")]
    InsideCompressed,
}

impl EpsMode {
    /// The placement in force in a stage: `inside_compressed` resolves to
    /// `inside` while compressing and `outside` before.
    pub fn in_stage(self, compressing: bool) -> EpsMode {
        match self {
            EpsMode::InsideCompressed if compressing => EpsMode::Inside,
            EpsMode::InsideCompressed => EpsMode::Outside,
            other => other,
        }
    }
}

/// Refuses `inside_compressed` for an optimizer without a compression stage,
/// where it would silently mean `outside`.
pub(crate) fn check_eps_mode(field: &'static str, mode: EpsMode) -> Result<(), OptimError> {
    if mode == EpsMode::InsideCompressed {
        return Err(invalid(
            field,
            "\"inside_compressed\"".into(),
            "this optimizer has no compression stage; use \"inside\" or \"outside\"",
        ));
    }
    Ok(())
}

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
}

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
        }
    }

    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), OptimError> {
        match self {
            Self::Adam(c) => c.validate(),
            Self::Lamb(c) => c.validate(),
            Self::Sgd(c) => c.validate(),
            Self::OnebitAdam(c) | Self::OnebitAdamFp32(c) | Self::AdamOnebitNaive(c) => {
                c.validate()
            }
            Self::OnebitLamb(c) | Self::LambOnebitBasic(c) => c.validate(),
            Self::Slamb(c) => c.validate(),
        }
    }
}

/// `adam` (ALGORITHMS.md "Adam / AdamW").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdamConfig {
    /// Momentum decay β1.
    pub beta_1: f64,
    /// Variance decay β2.
    pub beta_2: f64,
    /// ε of the denominator.
    pub eps: f64,
    /// Decoupled weight decay, applied to the decay group only.
    pub weight_decay: f64,
    /// Divide m and v by `1-β^t`. The papers' BERT runs ("BertAdam") turn it off.
    pub bias_correction: bool,
    /// Where ε enters the denominator.
    pub eps_mode: EpsMode,
}

impl Default for AdamConfig {
    fn default() -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            bias_correction: true,
            eps_mode: EpsMode::Outside,
        }
    }
}

impl AdamConfig {
    fn validate(&self) -> Result<(), OptimError> {
        check_moments(
            ADAM_FIELDS,
            self.beta_1,
            self.beta_2,
            self.eps,
            self.weight_decay,
        )?;
        check_eps_mode("adam.eps_mode", self.eps_mode)
    }
}

/// `lamb` (ALGORITHMS.md "LAMB").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LambConfig {
    /// Momentum decay β1.
    pub beta_1: f64,
    /// Variance decay β2.
    pub beta_2: f64,
    /// ε of the denominator.
    pub eps: f64,
    /// Decoupled weight decay, applied to the decay group only.
    pub weight_decay: f64,
    /// Divide m and v by `1-β^t` (off by default, as in both LAMB papers' BERT runs).
    pub bias_correction: bool,
    /// Where ε enters the denominator.
    pub eps_mode: EpsMode,
    /// Lower clip of the trust ratio.
    pub c_min: f64,
    /// Upper clip of the trust ratio.
    pub c_max: f64,
    /// Divide ḡ by `max(‖ḡ‖, 1)` before the moments (NVIDIA FusedLAMB).
    pub grad_prenorm: bool,
    /// Use a trust ratio of 1 for the no-decay group (NVIDIA FusedLAMB).
    pub trust_decay_only: bool,
}

impl Default for LambConfig {
    fn default() -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            bias_correction: false,
            eps_mode: EpsMode::Outside,
            c_min: 0.01,
            c_max: 0.3,
            grad_prenorm: false,
            trust_decay_only: false,
        }
    }
}

impl LambConfig {
    fn validate(&self) -> Result<(), OptimError> {
        check_moments(
            LAMB_FIELDS,
            self.beta_1,
            self.beta_2,
            self.eps,
            self.weight_decay,
        )?;
        check_eps_mode("lamb.eps_mode", self.eps_mode)?;
        if !(self.c_min > 0.0 && self.c_min <= self.c_max && self.c_max.is_finite()) {
            return Err(invalid(
                "lamb.c_min",
                format!("{} (c_max = {})", self.c_min, self.c_max),
                "needs 0 < c_min <= c_max < inf",
            ));
        }
        Ok(())
    }
}

/// `sgd` (ALGORITHMS.md "Momentum SGD").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SgdConfig {
    /// Momentum μ (0 gives plain SGD).
    pub momentum: f64,
    /// L2 weight decay added to the gradient, decay group only.
    pub weight_decay: f64,
    /// Nesterov momentum: step along `ḡ + μ·m` instead of `m`.
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            momentum: 0.9,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

impl SgdConfig {
    fn validate(&self) -> Result<(), OptimError> {
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(invalid(
                "sgd.momentum",
                self.momentum.to_string(),
                "needs 0 <= momentum < 1",
            ));
        }
        if self.nesterov && self.momentum == 0.0 {
            return Err(invalid(
                "sgd.nesterov",
                "true".into(),
                "Nesterov momentum needs momentum > 0",
            ));
        }
        check_decay("sgd.weight_decay", self.weight_decay)
    }
}

/// Field names of the shared Adam/LAMB moment settings, for error messages.
const ADAM_FIELDS: [&str; 4] = [
    "adam.beta_1",
    "adam.beta_2",
    "adam.eps",
    "adam.weight_decay",
];
const LAMB_FIELDS: [&str; 4] = [
    "lamb.beta_1",
    "lamb.beta_2",
    "lamb.eps",
    "lamb.weight_decay",
];

pub(crate) fn check_moments(
    [beta_1_field, beta_2_field, eps_field, decay_field]: [&'static str; 4],
    beta_1: f64,
    beta_2: f64,
    eps: f64,
    weight_decay: f64,
) -> Result<(), OptimError> {
    if !(0.0..1.0).contains(&beta_1) {
        return Err(invalid(
            beta_1_field,
            beta_1.to_string(),
            "needs 0 <= beta_1 < 1",
        ));
    }
    if !(0.0..1.0).contains(&beta_2) {
        return Err(invalid(
            beta_2_field,
            beta_2.to_string(),
            "needs 0 <= beta_2 < 1",
        ));
    }
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(invalid(eps_field, eps.to_string(), "needs 0 < eps < inf"));
    }
    check_decay(decay_field, weight_decay)
}

fn check_decay(field: &'static str, weight_decay: f64) -> Result<(), OptimError> {
    if weight_decay >= 0.0 && weight_decay.is_finite() {
        Ok(())
    } else {
        Err(invalid(
            field,
            weight_decay.to_string(),
            "needs 0 <= weight_decay < inf",
        ))
    }
}

pub(crate) fn invalid(field: &'static str, value: String, reason: &'static str) -> OptimError {
    OptimError::InvalidConfig {
        field,
        value,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(lamb.weight_decay, 0.01);
        assert_eq!(lamb.eps_mode, EpsMode::Inside);
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
    fn validation_names_the_field() {
        let bad = OptimizerConfig::Adam(AdamConfig {
            beta_2: 1.0,
            ..Default::default()
        });
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("adam.beta_2")
        );
        let bad = OptimizerConfig::Lamb(LambConfig {
            c_min: 0.5,
            c_max: 0.3,
            ..Default::default()
        });
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("lamb.c_min")
        );
        let bad = OptimizerConfig::Sgd(SgdConfig {
            momentum: 0.0,
            nesterov: true,
            ..Default::default()
        });
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("sgd.nesterov")
        );
    }

    #[test]
    fn eps_inside_the_compression_stage_needs_a_compression_stage() {
        let config: OptimizerConfig =
            toml::from_str("name = \"onebit_adam\"\neps_mode = \"inside_compressed\"\n").unwrap();
        let OptimizerConfig::OnebitAdam(c) = &config else {
            panic!("expected onebit_adam, got {config:?}")
        };
        assert_eq!(c.eps_mode, EpsMode::InsideCompressed);
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
