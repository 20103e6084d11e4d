//! Configs of the communication-efficient optimizers (ALGORITHMS.md "1-bit
//! Adam", "1-bit LAMB", "SLAMB") with every option and default listed there.

use serde::{Deserialize, Serialize};
use terse_comm::{CompressionOptions, SparseValues};
use terse_kernels::mask::Mask;
use terse_kernels::onebit::Scale;

use crate::config::{check_eps_mode, check_moments, invalid};
use crate::{EpsMode, OptimError};

/// How a compressed block's scale is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleKind {
    /// `mean(|y|)` (default).
    #[default]
    L1,
    /// `‖y‖/sqrt(len)` (DeepSpeed parity).
    L2,
}

/// When the warmup stage ends and v freezes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FreezeRule {
    /// At `freeze_step` (default).
    #[default]
    Step,
    /// The first step at or after the LR warmup where
    /// `‖v_t‖₁/‖v_{t-Δ}‖₁ ≥ freeze_threshold`, `Δ = round(1/(1-β2))`.
    Auto,
}

/// 1-bit LAMB's variance-ratio flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RatioKind {
    /// `max(denom_frozen / denom_fresh)` (the authors' implementation).
    #[default]
    Sqrt,
    /// `max((v_frozen + ε)/(v_fresh + ε))` (the paper's formula).
    Variance,
}

/// SLAMB's mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaskKind {
    /// A counter-based hash of (seed, t, j) below k (default).
    #[default]
    Hash,
    /// A fixed permutation cut into 1/k chunks, chunk `t mod 1/k` (authors' v1).
    Cyclic,
}

/// `onebit_adam`, `onebit_adam_fp32` and `adam_onebit_naive` (the naive
/// baseline ignores the freeze fields: it compresses from step 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OneBitAdamConfig {
    /// Momentum decay β1.
    pub beta_1: f64,
    /// Variance decay β2.
    pub beta_2: f64,
    /// ε of the denominator.
    pub eps: f64,
    /// Decoupled weight decay, decay group only.
    pub weight_decay: f64,
    /// Bias correction (off: the papers' "BertAdam").
    pub bias_correction: bool,
    /// Where ε enters the denominator (`inside_compressed`: the
    /// Tarasov–Ershov fix, from the compression stage on).
    pub eps_mode: EpsMode,
    /// How compression scales are computed.
    pub scale: ScaleKind,
    /// One scale per this many elements (multiple of 32); none: one per chunk.
    pub scale_block: Option<usize>,
    /// Parameters kept out of compression: in the compression stage their
    /// momentum is allreduced exactly in fp32 while the rest is 1-bit. Each
    /// entry is a parameter path or a prefix ending in `*`; one that names
    /// no parameter is an error listing the model's paths.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uncompressed: Vec<String>,
    /// How the freeze step is chosen.
    pub freeze: FreezeRule,
    /// The last warmup step `T_w` (with `freeze = "step"`).
    pub freeze_step: u64,
    /// The ratio of the auto rule.
    pub freeze_threshold: f64,
}

impl Default for OneBitAdamConfig {
    fn default() -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            bias_correction: false,
            eps_mode: EpsMode::Outside,
            scale: ScaleKind::L1,
            scale_block: None,
            uncompressed: Vec::new(),
            freeze: FreezeRule::Step,
            freeze_step: 1000,
            freeze_threshold: 0.96,
        }
    }
}

/// `onebit_lamb` and `lamb_onebit_basic`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OneBitLambConfig {
    /// Momentum decay β1.
    pub beta_1: f64,
    /// Variance decay β2.
    pub beta_2: f64,
    /// ε of the denominator.
    pub eps: f64,
    /// Decoupled weight decay, decay group only.
    pub weight_decay: f64,
    /// Bias correction (off, as in the paper's BERT runs).
    pub bias_correction: bool,
    /// Where ε enters the denominator.
    pub eps_mode: EpsMode,
    /// Lower clip of the trust ratio.
    pub c_min: f64,
    /// Upper clip of the trust ratio.
    pub c_max: f64,
    /// Decay of the running trust ratio `c_avg`.
    pub beta_3: f64,
    /// Lower clip of the variance ratio r.
    pub r_min: f64,
    /// Upper clip of the variance ratio r.
    pub r_max: f64,
    /// Largest relative change of r per step.
    pub r_threshold: f64,
    /// Which variance ratio.
    pub ratio: RatioKind,
    /// How compression scales are computed.
    pub scale: ScaleKind,
    /// One scale per this many elements (multiple of 32); none: one per chunk.
    pub scale_block: Option<usize>,
    /// Parameters kept out of compression: in the compression stage their
    /// momentum is allreduced exactly in fp32 while the rest is 1-bit. Each
    /// entry is a parameter path or a prefix ending in `*`; one that names
    /// no parameter is an error listing the model's paths.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uncompressed: Vec<String>,
    /// How the freeze step is chosen.
    pub freeze: FreezeRule,
    /// The last warmup step `T_w` (with `freeze = "step"`).
    pub freeze_step: u64,
    /// The ratio of the auto rule.
    pub freeze_threshold: f64,
}

impl Default for OneBitLambConfig {
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
            beta_3: 0.9,
            r_min: 0.5,
            r_max: 4.0,
            r_threshold: 0.1,
            ratio: RatioKind::Sqrt,
            scale: ScaleKind::L1,
            scale_block: None,
            uncompressed: Vec::new(),
            freeze: FreezeRule::Step,
            freeze_step: 1000,
            freeze_threshold: 0.96,
        }
    }
}

/// `slamb`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlambConfig {
    /// Momentum decay β1.
    pub beta_1: f64,
    /// Variance decay β2.
    pub beta_2: f64,
    /// ε of the denominator.
    pub eps: f64,
    /// Decoupled weight decay λ, decay group only.
    pub weight_decay: f64,
    /// Bias correction (on by default for SLAMB).
    pub bias_correction: bool,
    /// Where ε enters the denominator.
    pub eps_mode: EpsMode,
    /// Fraction of the elements synchronised per step.
    pub k: f64,
    /// Decay of the per-element freshness c.
    pub beta_3: f64,
    /// Average the parameters every `sync_every` steps (H).
    pub sync_every: u64,
    /// Lower clip `a` of the trust ratios.
    pub phi_min: f64,
    /// Upper clip `b` of the trust ratios.
    pub phi_max: f64,
    /// Which mask.
    pub mask: MaskKind,
    /// The mask's seed (the same on every rank).
    pub mask_seed: u64,
    /// Segments with fewer elements are synchronised every step.
    pub always_sync_below: usize,
    /// The precision the synchronised momentum values travel in (`f16`
    /// halves the sparse phase's bytes).
    pub values: SparseValues,
}

impl Default for SlambConfig {
    fn default() -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            bias_correction: true,
            eps_mode: EpsMode::Outside,
            k: 0.1,
            beta_3: 0.93,
            sync_every: 100,
            phi_min: 0.01,
            phi_max: 0.4,
            mask: MaskKind::Hash,
            mask_seed: 0,
            always_sync_below: 9000,
            values: SparseValues::F32,
        }
    }
}

pub(crate) fn compression_options(
    scale: ScaleKind,
    scale_block: Option<usize>,
) -> CompressionOptions {
    CompressionOptions {
        scale: match scale {
            ScaleKind::L1 => Scale::L1,
            ScaleKind::L2 => Scale::L2,
        },
        scale_block,
    }
}

fn check_block(field: &'static str, block: Option<usize>) -> Result<(), OptimError> {
    match block {
        Some(b) if b == 0 || !b.is_multiple_of(32) => Err(invalid(
            field,
            b.to_string(),
            "needs a positive multiple of 32",
        )),
        _ => Ok(()),
    }
}

fn check_unit(field: &'static str, value: f64) -> Result<(), OptimError> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(invalid(field, value.to_string(), "needs 0 <= value < 1"))
    }
}

fn check_freeze(
    fields: [&'static str; 2],
    rule: FreezeRule,
    step: u64,
    threshold: f64,
) -> Result<(), OptimError> {
    if rule == FreezeRule::Step && step == 0 {
        return Err(invalid(
            fields[0],
            "0".into(),
            "needs at least one warmup step (v must be estimated before it freezes)",
        ));
    }
    if !(threshold > 0.0 && threshold <= 1.0) {
        return Err(invalid(
            fields[1],
            threshold.to_string(),
            "needs 0 < threshold <= 1",
        ));
    }
    Ok(())
}

impl OneBitAdamConfig {
    pub(crate) fn validate(&self) -> Result<(), OptimError> {
        check_moments(
            [
                "onebit_adam.beta_1",
                "onebit_adam.beta_2",
                "onebit_adam.eps",
                "onebit_adam.weight_decay",
            ],
            self.beta_1,
            self.beta_2,
            self.eps,
            self.weight_decay,
        )?;
        check_block("onebit_adam.scale_block", self.scale_block)?;
        check_freeze(
            ["onebit_adam.freeze_step", "onebit_adam.freeze_threshold"],
            self.freeze,
            self.freeze_step,
            self.freeze_threshold,
        )
    }

    pub(crate) fn compression(&self) -> CompressionOptions {
        compression_options(self.scale, self.scale_block)
    }
}

impl OneBitLambConfig {
    pub(crate) fn validate(&self) -> Result<(), OptimError> {
        check_moments(
            [
                "onebit_lamb.beta_1",
                "onebit_lamb.beta_2",
                "onebit_lamb.eps",
                "onebit_lamb.weight_decay",
            ],
            self.beta_1,
            self.beta_2,
            self.eps,
            self.weight_decay,
        )?;
        if !(self.c_min > 0.0 && self.c_min <= self.c_max && self.c_max.is_finite()) {
            return Err(invalid(
                "onebit_lamb.c_min",
                format!("{} (c_max = {})", self.c_min, self.c_max),
                "needs 0 < c_min <= c_max < inf",
            ));
        }
        check_unit("onebit_lamb.beta_3", self.beta_3)?;
        if !(self.r_min > 0.0 && self.r_min <= self.r_max && self.r_max.is_finite()) {
            return Err(invalid(
                "onebit_lamb.r_min",
                format!("{} (r_max = {})", self.r_min, self.r_max),
                "needs 0 < r_min <= r_max < inf",
            ));
        }
        check_unit("onebit_lamb.r_threshold", self.r_threshold)?;
        check_block("onebit_lamb.scale_block", self.scale_block)?;
        check_freeze(
            ["onebit_lamb.freeze_step", "onebit_lamb.freeze_threshold"],
            self.freeze,
            self.freeze_step,
            self.freeze_threshold,
        )
    }

    pub(crate) fn compression(&self) -> CompressionOptions {
        compression_options(self.scale, self.scale_block)
    }
}

impl SlambConfig {
    pub(crate) fn validate(&self) -> Result<(), OptimError> {
        check_moments(
            [
                "slamb.beta_1",
                "slamb.beta_2",
                "slamb.eps",
                "slamb.weight_decay",
            ],
            self.beta_1,
            self.beta_2,
            self.eps,
            self.weight_decay,
        )?;
        check_eps_mode("slamb.eps_mode", self.eps_mode)?;
        if !(self.k > 0.0 && self.k <= 1.0) {
            return Err(invalid("slamb.k", self.k.to_string(), "needs 0 < k <= 1"));
        }
        check_unit("slamb.beta_3", self.beta_3)?;
        if self.sync_every == 0 {
            return Err(invalid("slamb.sync_every", "0".into(), "needs H >= 1"));
        }
        if !(self.phi_min > 0.0 && self.phi_min <= self.phi_max && self.phi_max.is_finite()) {
            return Err(invalid(
                "slamb.phi_min",
                format!("{} (phi_max = {})", self.phi_min, self.phi_max),
                "needs 0 < phi_min <= phi_max < inf",
            ));
        }
        Ok(())
    }

    /// The mask over a buffer of `len` elements.
    pub(crate) fn mask(&self, len: usize) -> Mask {
        match self.mask {
            MaskKind::Hash => Mask::Hash {
                seed: self.mask_seed,
                k: self.k,
            },
            MaskKind::Cyclic => Mask::Cyclic {
                seed: self.mask_seed,
                k: self.k,
                len,
            },
        }
    }
}
