//! 1-bit Adam (ALGORITHMS.md "1-bit Adam"; Tang et al., Algorithm 1) and its
//! two ablation baselines: Adam with an fp32 gradient allreduce until the
//! freeze step, then v frozen and only the momentum synchronised, 1-bit
//! compressed with two-level error feedback (one fused buffer for all
//! segments).

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::adam::adam_update;
use crate::config_check::{NoOtherFields, invalid};
use crate::freeze::FreezePoint;
use crate::kept_out::{ErrorFeedback, KeptOutAllreduce};
use crate::moments::Moments;
use crate::non_freeze::NonFreeze;
use crate::pass::Direction;
use crate::pass::frozen::{accumulate_momentum, frozen_apply};
use crate::pass::sums::sum_of_abs;
use crate::span::SpanCache;
use crate::step::CommTime;
use crate::step::{FlatOptimizer, StepContext};
use crate::{
    AdamConfig, Flat, FlatMut, FreezeConfig, MomentConfig, OneBitAllreduceConfig, OptimError,
    ParamLayout, Stage, WithCompression, WithMoments, WithOneBitAllreduce,
};

/// `onebit_adam`, `onebit_adam_fp32` and `adam_onebit_naive` (the naive
/// baseline ignores the freeze fields: it compresses from step 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OneBitAdamConfig {
    /// β1, β2, ε, its placement (`inside_compressed`: the Tarasov–Ershov
    /// fix, from the compression stage on) and the weight decay.
    #[serde(flatten)]
    pub moments: MomentConfig,
    /// Bias correction (off: the papers' "BertAdam").
    pub bias_correction: bool,
    /// The 1-bit allreduce's scales and the parameters kept out of it.
    #[serde(flatten)]
    pub allreduce: OneBitAllreduceConfig,
    /// The freeze.
    #[serde(flatten)]
    pub compression: FreezeConfig,
    /// Parameters that never freeze (DeepSpeed's `non_freeze` groups,
    /// `onebit_adam` only): after the freeze their gradient is averaged
    /// exactly and their m and v stay Adam's (v keeps updating); the
    /// compressed allreduce leaves them out. Parameter paths, or prefixes
    /// ending in `*`. Needs `bias_correction = false`, as DeepSpeed has it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub non_freeze: Vec<String>,
    /// Refuses keys no field claims (must stay last).
    #[serde(flatten, skip_serializing)]
    pub no_other_fields: NoOtherFields,
}

impl Default for OneBitAdamConfig {
    fn default() -> Self {
        Self {
            moments: MomentConfig::default(),
            bias_correction: false,
            allreduce: OneBitAllreduceConfig::default(),
            compression: FreezeConfig::default(),
            non_freeze: Vec::new(),
            no_other_fields: NoOtherFields,
        }
    }
}

impl OneBitAdamConfig {
    pub(crate) fn validate(&self, name: &str) -> Result<(), OptimError> {
        self.moments.validate(name)?;
        self.allreduce.validate(name)?;
        if !self.non_freeze.is_empty() && name != "onebit_adam" {
            return Err(invalid(
                format!("{name}.non_freeze"),
                format!("{:?}", self.non_freeze),
                "applies to onebit_adam only (the ablations have no compressed momentum to \
                 leave parameters out of)",
            ));
        }
        if !self.non_freeze.is_empty() && self.bias_correction {
            return Err(invalid(
                format!("{name}.non_freeze"),
                format!("{:?}", self.non_freeze),
                "needs bias_correction = false (DeepSpeed's non_freeze groups correct no bias, \
                 and the frozen and the updating v would need two corrections)",
            ));
        }
        self.compression.validate(name)
    }
}

crate::config_check::flattens!(OneBitAdamConfig {
    moments: MomentConfig => WithMoments, moments_mut;
    compression: FreezeConfig => WithCompression, compression_mut;
    allreduce: OneBitAllreduceConfig => WithOneBitAllreduce, allreduce_mut;
});

/// Which member of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdamVariant {
    /// `onebit_adam`.
    OneBit,
    /// `onebit_adam_fp32`: the momentum allreduced uncompressed after the freeze.
    Fp32Momentum,
    /// `adam_onebit_naive`: Adam on the 1-bit compressed gradient from step 1.
    Naive,
}

/// The state of the family: m, v (frozen after `T_w`), the compressed
/// allreduce's two errors and the freeze decision.
pub struct OneBitAdam {
    config: OneBitAdamConfig,
    variant: AdamVariant,
    m: Flat,
    v: Flat,
    allreduce: KeptOutAllreduce,
    errors: ErrorFeedback,
    /// The parameters that never freeze.
    non_freeze: NonFreeze,
    freeze: FreezePoint,
    spans: SpanCache,
    /// m and v are current only in this rank's part of a split warmup step.
    partial: bool,
}

impl OneBitAdam {
    /// Zeroed state for `layout`'s parameters on `comm`'s rank; `name` is
    /// the config's, for errors.
    pub fn new(
        config: OneBitAdamConfig,
        name: &str,
        variant: AdamVariant,
        layout: &ParamLayout,
        comm: &dyn terse_comm::Communicator,
    ) -> Result<Self, OptimError> {
        let d = layout.len();
        let field = format!("{name}.non_freeze");
        let non_freeze = NonFreeze::new(&config.non_freeze, &field, layout)?;
        let allreduce =
            KeptOutAllreduce::skipping(&config.allreduce, name, layout, non_freeze.ranges(), comm)?;
        let freeze = FreezePoint::new(&config.compression, config.moments.beta_2);
        Ok(Self {
            m: Flat::zeros(d),
            v: Flat::zeros(d),
            errors: allreduce.zeroed_errors(),
            allreduce,
            non_freeze,
            freeze,
            config,
            variant,
            spans: SpanCache::default(),
            partial: false,
        })
    }

    /// The Adam of this config's warmup, or of its compression stage (the
    /// ε placement of `inside_compressed`; the naive baseline compresses
    /// from step 1).
    fn adam_config(&self, compressing: bool) -> AdamConfig {
        let c = &self.config;
        AdamConfig {
            moments: MomentConfig {
                eps_mode: c.moments.eps_mode.in_stage(compressing),
                ..c.moments.clone()
            },
            bias_correction: c.bias_correction,
            no_other_fields: NoOtherFields,
        }
    }

    /// The naive baseline: Adam on the 1-bit compressed gradient.
    fn naive_step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        let adam = self.adam_config(true);
        let comm_time = self
            .allreduce
            .mean_of_whole(ctx.comm, g, &mut self.errors)?;
        let span = self.spans.span(ctx, x, adam.moments.weight_decay, false);
        adam_update(&adam, ctx, &span, x, (&mut self.m, &mut self.v), g)?;
        Ok(comm_time)
    }

    /// Adam on the averaged gradient, and the freeze when it comes. Split
    /// between ranks that share cores, unless the freeze step is found from
    /// the whole v after each step.
    fn warmup_step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        let adam = self.adam_config(false);
        let splittable = !self.freeze.is_auto();
        let span = self
            .spans
            .span(ctx, x, adam.moments.weight_decay, splittable);
        let mut comm_time = span.mean_gradient(ctx.comm, g)?;
        adam_update(&adam, ctx, &span, x, (&mut self.m, &mut self.v), g)?;
        comm_time += span.share_back(ctx.comm, &mut [x])?;
        self.partial |= span.is_split();
        let v = &self.v;
        let ends = self
            .freeze
            .ends_warmup(ctx.t, || sum_of_abs(&span, v), ctx.lr_warmup);
        if ends {
            // The compression stage reads m and v whole.
            self.sync_state(ctx.comm)?;
        }
        Ok(comm_time)
    }

    /// The compression stage: the momentum from the local gradient,
    /// synchronised (1-bit, or in fp32 for the ablation), the update with
    /// v frozen at the end of step `t_w`. Ranks that share cores split the
    /// update (m is the same on every rank after the allreduce, which each
    /// of them dequantises only in its own part), then share m and x back.
    fn compression_step(
        &mut self,
        ctx: &StepContext,
        x: &mut FlatMut,
        g: &mut FlatMut,
        t_w: u64,
    ) -> CommTime {
        let c = &self.config;
        let span = self.spans.span(ctx, x, c.moments.weight_decay, true);
        let fresh = Moments::new(&c.moments, c.bias_correction, ctx.t);
        // The parameters that never freeze: Adam's m and v from the
        // exactly averaged gradient (the same on every rank).
        let mut comm_time = self.non_freeze.mean_gradient(ctx.comm, g)?;
        self.non_freeze
            .update_variance(c.moments.beta_2, &mut self.v, g);
        accumulate_momentum(&span, &fresh, &mut self.m, g);
        let start = Instant::now();
        match self.variant {
            AdamVariant::Fp32Momentum => span.mean_of_state(ctx.comm, &mut self.m)?,
            _ => self.allreduce.mean_of(
                ctx.comm,
                &span,
                x.device(),
                &mut self.m,
                &mut self.errors,
            )?,
        }
        comm_time += start.elapsed();
        let moments = Moments::frozen(&c.moments, c.bias_correction, ctx.t, t_w);
        let rates = vec![ctx.lr as f32; ctx.layout.segments().len()];
        let direction = Direction {
            moments: &moments,
            eps_mode: c.moments.eps_mode.in_stage(true),
            weight_decay: c.moments.weight_decay as f32,
        };
        let hold = c.allreduce.hold_zero_variance;
        frozen_apply(&span, &direction, &rates, x, &mut self.m, &self.v, hold);
        comm_time += span.share_back(ctx.comm, &mut [&mut self.m, x])?;
        Ok(comm_time)
    }
}

impl FlatOptimizer for OneBitAdam {
    fn step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        match (self.variant, self.freeze.step()) {
            (AdamVariant::Naive, _) => self.naive_step(ctx, x, g),
            (_, Some(t_w)) if ctx.t > t_w => self.compression_step(ctx, x, g, t_w),
            _ => self.warmup_step(ctx, x, g),
        }
    }

    fn state(&mut self) -> Vec<(&'static str, &mut Flat)> {
        vec![
            ("m", &mut self.m),
            ("v", &mut self.v),
            ("worker_error", &mut self.errors.worker),
            ("server_error", &mut self.errors.server),
        ]
    }

    fn state_loaded(&mut self) {
        self.partial = false;
    }

    fn state_is_partial(&self) -> bool {
        self.partial
    }

    fn sync_state(&mut self, comm: &dyn terse_comm::Communicator) -> Result<(), OptimError> {
        let buffers = &mut [&mut self.m, &mut self.v];
        self.spans.gather_partial(comm, &mut self.partial, buffers)
    }

    fn scalars(&self) -> Vec<(&'static str, Vec<f64>)> {
        self.freeze.scalars()
    }

    fn own_state(&self) -> crate::OwnState {
        crate::kept_out::ErrorFeedback::ROLES
    }

    fn params_replicated(&self) -> bool {
        true
    }

    fn set_scalars(&mut self, role: &str, values: Vec<f64>) -> Result<(), String> {
        self.freeze.set_scalars(role, values)
    }

    fn stage(&self, t: u64) -> Stage {
        match self.variant {
            AdamVariant::Naive => Stage::Compression,
            _ => self.freeze.stage(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{OneBitAdamConfig, OptimizerConfig};

    /// `non_freeze` is refused where it cannot be what DeepSpeed's is: on
    /// the ablations, and with bias correction (two v's, two corrections).
    #[test]
    fn non_freeze_needs_onebit_adam_without_bias_correction() {
        let with = |bias_correction| OneBitAdamConfig {
            non_freeze: vec!["embeddings.*".into()],
            bias_correction,
            ..OneBitAdamConfig::default()
        };
        assert!(OptimizerConfig::OnebitAdam(with(false)).validate().is_ok());
        for (config, says) in [
            (
                OptimizerConfig::OnebitAdam(with(true)),
                "bias_correction = false",
            ),
            (
                OptimizerConfig::OnebitAdamFp32(with(false)),
                "onebit_adam only",
            ),
            (
                OptimizerConfig::AdamOnebitNaive(with(false)),
                "onebit_adam only",
            ),
        ] {
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains("non_freeze") && e.contains(says), "{e}");
        }
    }
}
