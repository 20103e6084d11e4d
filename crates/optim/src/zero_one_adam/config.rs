//! `zero_one_adam`'s settings, under DeepSpeed's `ZeroOneAdam` names and
//! defaults (deepspeed 0.19.6, `runtime/fp16/onebit/zoadam.py`).

use serde::{Deserialize, Serialize};

use crate::config_check::{NoOtherFields, invalid};
use crate::eps_mode::check_has_compression_stage;
use crate::{MomentConfig, OneBitAllreduceConfig, OptimError, WithMoments};

/// `zero_one_adam` (ALGORITHMS.md "0/1 Adam").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ZeroOneAdamConfig {
    /// β1, β2, ε, its placement (`outside`, DeepSpeed's only one, or
    /// `inside`) and the weight decay.
    #[serde(flatten)]
    pub moments: MomentConfig,
    /// Divide m by `1−β1^t` and v by `1−β2^k`, k its updates so far. Off
    /// by default, as in the paper and DeepSpeed (which accepts the flag
    /// and ignores it): a terse option for runs whose variance stage is
    /// too short for an uncorrected v (far below `1/(1−β2)` updates).
    pub bias_correction: bool,
    /// The last step of the variance stage: v is updated on its schedule
    /// up to here and frozen after, where the local steps begin.
    pub var_freeze_step: u64,
    /// κ: the interval between variance updates doubles after this many.
    pub var_update_scaler: u64,
    /// The interval between synchronisations doubles every this many
    /// local steps…
    pub local_step_scaler: u64,
    /// …up to this many steps (H).
    pub local_step_clipper: u64,
    /// The 1-bit allreduce's scales and the parameters kept out of it.
    #[serde(flatten)]
    pub allreduce: OneBitAllreduceConfig,
    /// Refuses keys no field claims (must stay last).
    #[serde(flatten, skip_serializing)]
    pub no_other_fields: NoOtherFields,
}

impl Default for ZeroOneAdamConfig {
    fn default() -> Self {
        Self {
            moments: MomentConfig::default(),
            bias_correction: false,
            var_freeze_step: 100_000,
            var_update_scaler: 16,
            local_step_scaler: 32_678,
            local_step_clipper: 16,
            allreduce: OneBitAllreduceConfig::default(),
            no_other_fields: NoOtherFields,
        }
    }
}

impl ZeroOneAdamConfig {
    pub(crate) fn validate(&self, name: &str) -> Result<(), OptimError> {
        self.moments.validate(name)?;
        // Its stages are the variance stage and local steps; ε's placement
        // is one setting for both.
        check_has_compression_stage(format!("{name}.eps_mode"), self.moments.eps_mode)?;
        self.allreduce.validate(name)?;
        for (field, value) in [
            ("var_update_scaler", self.var_update_scaler),
            ("local_step_scaler", self.local_step_scaler),
            ("local_step_clipper", self.local_step_clipper),
        ] {
            if value == 0 {
                return Err(invalid(
                    format!("{name}.{field}"),
                    "0".into(),
                    "needs at least 1",
                ));
            }
        }
        if self.var_freeze_step == 0 {
            return Err(invalid(
                format!("{name}.var_freeze_step"),
                "0".into(),
                "needs at least one variance step (v must be estimated before it freezes)",
            ));
        }
        Ok(())
    }
}

crate::config_check::flattens!(ZeroOneAdamConfig {
    moments: MomentConfig => WithMoments, moments_mut;
    allreduce: crate::OneBitAllreduceConfig => crate::WithOneBitAllreduce, allreduce_mut;
});
