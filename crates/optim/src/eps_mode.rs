//! Where ε enters Adam's denominator (ALGORITHMS.md "ε placement").

use serde::{Deserialize, Serialize};

use crate::OptimError;
use crate::config_check::invalid;

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
pub(crate) fn check_has_compression_stage(field: String, mode: EpsMode) -> Result<(), OptimError> {
    if mode == EpsMode::InsideCompressed {
        return Err(invalid(
            field,
            "\"inside_compressed\"".into(),
            "this optimizer has no compression stage; use \"inside\" or \"outside\"",
        ));
    }
    Ok(())
}
