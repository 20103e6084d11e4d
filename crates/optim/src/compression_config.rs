//! The settings of 1-bit compression, flattened into the optimizers'
//! configs (the TOML keys stay top-level): the compressed allreduce's
//! (1-bit Adam, 1-bit LAMB, their ablations and 0/1 Adam) and the freeze
//! that starts the compression stage (the first four; the config field
//! holding it is still named `compression`). ALGORITHMS.md "1-bit Adam", "Compressed
//! allreduce", "Zero-gradient coordinates".

use serde::{Deserialize, Serialize};
use terse_comm::{CommError, CompressionOptions, Geometry};
use terse_kernels::onebit::Scale;

use crate::OptimError;
use crate::config_check::invalid;

/// How a compressed block's scale is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleKind {
    /// `mean(|y|)` (default).
    #[default]
    L1,
    /// `‖y‖/sqrt(len)`.
    L2,
    /// DeepSpeed's compressed allreduce (its `NcclBackend`): one L2 scale
    /// over the worker's whole buffer zero-padded to a multiple of
    /// `n·lcm(n, 8)` (the padding kept in the error feedback), one L2 scale
    /// per server chunk of `padded/n`. No `scale_block`. On a device the
    /// buffer goes through the host.
    #[serde(rename = "deepspeed")]
    DeepSpeed,
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

/// The 1-bit compressed allreduce's settings: how its scales are computed,
/// which parameters it leaves to an exact fp32 allreduce, and what happens
/// to the coordinates it cannot send (shared by every 1-bit optimizer, 0/1
/// Adam included).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OneBitAllreduceConfig {
    /// How compression scales are computed.
    pub scale: ScaleKind,
    /// One scale per this many elements (multiple of 32); none: one per chunk.
    pub scale_block: Option<usize>,
    /// Parameters kept out of compression: their part is allreduced
    /// exactly in fp32 while the rest is 1-bit. Each entry is a parameter
    /// path or a prefix ending in `*`; one that names no parameter is an
    /// error listing the model's paths.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uncompressed: Vec<String>,
    /// Hold every coordinate whose frozen v is exactly zero still in the
    /// compression stage: its momentum zeroed, no step, no decay (terse's
    /// default; `pass/frozen.rs`). Off: such a coordinate steps by its
    /// compressed momentum over ε, as in DeepSpeed, where only
    /// `momentum_mask` masks.
    pub hold_zero_variance: bool,
    /// DeepSpeed's `exp_avg_mask` (1-bit Adam and 0/1 Adam): coordinates
    /// whose synchronised momentum is set to zero after each compressed
    /// allreduce; they still decay. Entries are parameter paths (or
    /// prefixes ending in `*`) with an optional range of rows,
    /// `bert.embeddings.position_embeddings.weight[128:]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub momentum_mask: Vec<String>,
}

impl Default for OneBitAllreduceConfig {
    fn default() -> Self {
        Self {
            scale: ScaleKind::default(),
            scale_block: None,
            uncompressed: Vec::new(),
            hold_zero_variance: true,
            momentum_mask: Vec::new(),
        }
    }
}

impl OneBitAllreduceConfig {
    /// Checks the scales against the compressed allreduce's rules; errors
    /// name the field as `{optimizer}.{option}`.
    pub(crate) fn validate(&self, optimizer: &str) -> Result<(), OptimError> {
        if let Err(CommError::BadOption {
            option,
            value,
            reason,
        }) = self.options().check()
        {
            return Err(invalid(format!("{optimizer}.{option}"), value, reason));
        }
        Ok(())
    }

    /// The compressed allreduce's options.
    pub(crate) fn options(&self) -> CompressionOptions {
        CompressionOptions {
            scale: match self.scale {
                ScaleKind::L1 => Scale::L1,
                ScaleKind::L2 | ScaleKind::DeepSpeed => Scale::L2,
            },
            scale_block: self.scale_block,
            geometry: match self.scale {
                ScaleKind::DeepSpeed => Geometry::DeepSpeed,
                ScaleKind::L1 | ScaleKind::L2 => Geometry::Chunks,
            },
        }
    }
}

/// Where a 1-bit optimizer's warmup ends: its freeze. (A struct beside
/// [`OneBitAllreduceConfig`], not holding it: serde hands a flattened
/// struct that flattens another every key without consuming any, and the
/// configs' [`crate::NoOtherFields`] would then refuse them all.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FreezeConfig {
    /// How the freeze step is chosen.
    pub freeze: FreezeRule,
    /// The last warmup step `T_w` (with `freeze = "step"`).
    pub freeze_step: u64,
    /// The ratio of the auto rule.
    pub freeze_threshold: f64,
}

impl Default for FreezeConfig {
    fn default() -> Self {
        Self {
            freeze: FreezeRule::Step,
            freeze_step: 1000,
            freeze_threshold: 0.96,
        }
    }
}

impl FreezeConfig {
    /// Checks the ranges; errors name the field as `{optimizer}.{field}`.
    pub(crate) fn validate(&self, optimizer: &str) -> Result<(), OptimError> {
        let field = |name: &str| format!("{optimizer}.{name}");
        if self.freeze == FreezeRule::Step && self.freeze_step == 0 {
            return Err(invalid(
                field("freeze_step"),
                "0".into(),
                "needs at least one warmup step (v must be estimated before it freezes)",
            ));
        }
        if !(self.freeze_threshold > 0.0 && self.freeze_threshold <= 1.0) {
            return Err(invalid(
                field("freeze_threshold"),
                self.freeze_threshold.to_string(),
                "needs 0 < threshold <= 1",
            ));
        }
        Ok(())
    }
}

/// burn-style builder methods (`with_scale(ScaleKind::L2)`) for the
/// compressed-allreduce settings of any config that flattens a
/// [`OneBitAllreduceConfig`] (1-bit Adam, 1-bit LAMB, 0/1 Adam).
pub trait WithOneBitAllreduce: Sized {
    /// The config's compressed-allreduce settings.
    fn allreduce_mut(&mut self) -> &mut OneBitAllreduceConfig;

    crate::config_check::with_setters!(allreduce_mut;
        /// Sets how scales are computed.
        with_scale(scale: ScaleKind),
        /// Sets one scale per this many elements (`None`: one per chunk).
        with_scale_block(scale_block: Option<usize>),
        /// Sets the parameters kept out of compression.
        with_uncompressed(uncompressed: Vec<String>),
        /// Sets whether coordinates with a frozen v of zero are held still.
        with_hold_zero_variance(hold_zero_variance: bool),
        /// Sets DeepSpeed's `exp_avg_mask`, as parameter paths and rows.
        with_momentum_mask(momentum_mask: Vec<String>),
    );
}

/// burn-style builder methods (`with_freeze_step(10)`) for the freeze of
/// any config that flattens a [`FreezeConfig`] (1-bit Adam, 1-bit LAMB).
pub trait WithCompression: Sized {
    /// The config's compression settings.
    fn compression_mut(&mut self) -> &mut FreezeConfig;

    crate::config_check::with_setters!(compression_mut;
        /// Sets how the freeze step is chosen.
        with_freeze(freeze: FreezeRule),
        /// Sets the last warmup step `T_w`.
        with_freeze_step(freeze_step: u64),
        /// Sets the auto rule's ratio.
        with_freeze_threshold(freeze_threshold: f64),
    );
}
