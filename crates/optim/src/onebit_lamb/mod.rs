//! 1-bit LAMB (ALGORITHMS.md "1-bit LAMB"; Li et al., Algorithm 1 with
//! §A.5) and the `lamb_onebit_basic` ablation. Warmup is LAMB with a running
//! average of each segment's trust coefficient; after the freeze the momentum
//! is scaled per segment so one compressed buffer carries every layer,
//! synchronised 1-bit with error feedback, and a fresh variance rebuilt from
//! the momentum difference adapts the frozen coefficient through `r`.

use serde::{Deserialize, Serialize};

use crate::config_check::{NoOtherFields, check_clip, check_unit};
use crate::freeze::FreezePoint;
use crate::kept_out::{ErrorFeedback, KeptOutAllreduce};
use crate::lamb::check_trust_clip;
use crate::span::SpanCache;
use crate::step::CommTime;
use crate::step::{FlatOptimizer, StepContext};
use crate::{
    Flat, FlatMut, FreezeConfig, LambConfig, MomentConfig, OneBitAllreduceConfig, OptimError,
    ParamLayout, Stage, WithCompression, WithMoments, WithOneBitAllreduce,
};

mod scalars;
mod steps;

use scalars::SegmentScalars;

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

/// `onebit_lamb` and `lamb_onebit_basic`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OneBitLambConfig {
    /// β1, β2, ε, its placement and the weight decay.
    #[serde(flatten)]
    pub moments: MomentConfig,
    /// Bias correction (off, as in the paper's BERT runs).
    pub bias_correction: bool,
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
    /// Blend each decaying segment's variance ratio with the share of its
    /// update that is not weight decay, `r·ρ + (1 − ρ)` with
    /// `ρ = min(1, ‖m̂/denom‖/‖m̂/denom + wd·x‖)`, before it is clipped
    /// (DeepSpeed's `OnebitLamb`; off: the paper's r).
    pub decay_blend: bool,
    /// The 1-bit allreduce's scales and the parameters kept out of it.
    #[serde(flatten)]
    pub allreduce: OneBitAllreduceConfig,
    /// The freeze.
    #[serde(flatten)]
    pub compression: FreezeConfig,
    /// Refuses keys no field claims (must stay last).
    #[serde(flatten, skip_serializing)]
    pub no_other_fields: NoOtherFields,
}

impl Default for OneBitLambConfig {
    /// LAMB's defaults for what the warmup shares with LAMB (the warmup is
    /// LAMB), the paper's for the rest.
    fn default() -> Self {
        let lamb = LambConfig::default();
        Self {
            moments: lamb.moments,
            bias_correction: lamb.bias_correction,
            c_min: lamb.c_min,
            c_max: lamb.c_max,
            beta_3: 0.9,
            r_min: 0.5,
            r_max: 4.0,
            r_threshold: 0.1,
            ratio: RatioKind::Sqrt,
            decay_blend: false,
            allreduce: OneBitAllreduceConfig::default(),
            compression: FreezeConfig::default(),
            no_other_fields: NoOtherFields,
        }
    }
}

impl OneBitLambConfig {
    /// Whether the variance ratios take DeepSpeed's decay blend (asked for
    /// and with a weight decay to blend).
    fn blends_decay(&self) -> bool {
        self.decay_blend && self.moments.weight_decay > 0.0
    }

    pub(crate) fn validate(&self, name: &str) -> Result<(), OptimError> {
        self.moments.validate(name)?;
        check_trust_clip(name, self.c_min, self.c_max)?;
        check_unit(format!("{name}.beta_3"), self.beta_3)?;
        check_clip(
            format!("{name}.r_min"),
            "r_max",
            (self.r_min, self.r_max),
            "needs 0 < r_min <= r_max < inf",
        )?;
        check_unit(format!("{name}.r_threshold"), self.r_threshold)?;
        self.allreduce.validate(name)?;
        self.compression.validate(name)
    }
}

crate::config_check::flattens!(OneBitLambConfig {
    moments: MomentConfig => WithMoments, moments_mut;
    compression: FreezeConfig => WithCompression, compression_mut;
    allreduce: OneBitAllreduceConfig => WithOneBitAllreduce, allreduce_mut;
});

/// The state of 1-bit LAMB: m, v (v_frozen after `T_w`), v_fresh, the
/// errors, and per segment c_avg, the momentum scale k and r_prev.
pub struct OneBitLamb {
    config: OneBitLambConfig,
    basic: bool,
    m: Flat,
    v: Flat,
    v_fresh: Flat,
    /// Scratch: the momentum before this step's (not saved: written before
    /// it is read in every compression step).
    m_last: Flat,
    allreduce: KeptOutAllreduce,
    errors: ErrorFeedback,
    segments: SegmentScalars,
    freeze: FreezePoint,
    spans: SpanCache,
    /// m and v (warmup) or v_fresh (compression) are current only in this
    /// rank's part of a split step.
    partial: bool,
}

impl OneBitLamb {
    /// Zeroed state for `layout` on `comm`'s rank (`name`: the config's, for
    /// errors); `basic` selects the ablation (v and c frozen, no momentum scaling, no fresh variance).
    pub fn new(
        config: OneBitLambConfig,
        name: &str,
        basic: bool,
        layout: &ParamLayout,
        comm: &dyn terse_comm::Communicator,
    ) -> Result<Self, OptimError> {
        let d = layout.len();
        let p = layout.segments().len();
        let allreduce = KeptOutAllreduce::new(&config.allreduce, name, layout, comm)?;
        let freeze = FreezePoint::new(&config.compression, config.moments.beta_2);
        Ok(Self {
            basic,
            m: Flat::zeros(d),
            v: Flat::zeros(d),
            v_fresh: Flat::zeros(if basic { 0 } else { d }),
            m_last: Flat::zeros(if basic { 0 } else { d }),
            errors: allreduce.zeroed_errors(),
            allreduce,
            segments: SegmentScalars::new(p),
            freeze,
            config,
            spans: SpanCache::default(),
            partial: false,
        })
    }

    fn lamb_config(&self) -> LambConfig {
        let c = &self.config;
        LambConfig {
            moments: MomentConfig {
                eps_mode: c.moments.eps_mode.in_stage(false),
                ..c.moments.clone()
            },
            bias_correction: c.bias_correction,
            c_min: c.c_min,
            c_max: c.c_max,
            grad_prenorm: false,
            trust_decay_only: false,
            no_other_fields: NoOtherFields,
        }
    }
}

impl FlatOptimizer for OneBitLamb {
    fn step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        // Scratch follows the parameters too.
        match x.device() {
            Some(x) => self.m_last.move_to_device(x),
            None => self.m_last.move_to_host(),
        }
        match self.freeze.step() {
            Some(t_w) if ctx.t > t_w => self.compression_step(ctx, x, g, t_w),
            _ => self.warmup_step(ctx, x, g),
        }
    }

    fn state(&mut self) -> Vec<(&'static str, &mut Flat)> {
        let mut state = vec![
            ("m", &mut self.m),
            ("v", &mut self.v),
            ("worker_error", &mut self.errors.worker),
            ("server_error", &mut self.errors.server),
        ];
        if !self.basic {
            state.push(("v_fresh", &mut self.v_fresh));
        }
        state
    }

    fn state_loaded(&mut self) {
        self.partial = false;
    }

    fn state_is_partial(&self) -> bool {
        self.partial
    }

    fn sync_state(&mut self, comm: &dyn terse_comm::Communicator) -> Result<(), OptimError> {
        // Warmup leaves m and v partial, compression v_fresh (which the
        // basic ablation does not have).
        let mut buffers = vec![&mut self.m, &mut self.v];
        if !self.basic {
            buffers.push(&mut self.v_fresh);
        }
        self.spans
            .gather_partial(comm, &mut self.partial, &mut buffers)
    }

    fn scalars(&self) -> Vec<(&'static str, Vec<f64>)> {
        let mut scalars = self.freeze.scalars();
        let (c_avg, r_prev) = self.segments.values();
        scalars.extend([
            ("c_avg", c_avg),
            ("k", self.segments.k.clone()),
            ("r_prev", r_prev),
        ]);
        scalars
    }

    fn set_scalars(&mut self, role: &str, values: Vec<f64>) -> Result<(), String> {
        let per_segment = |target: &mut Vec<f64>, values: Vec<f64>| {
            if values.len() == target.len() {
                *target = values;
                Ok(())
            } else {
                Err(format!(
                    "{} values, expected {} (one per segment)",
                    values.len(),
                    target.len()
                ))
            }
        };
        if FreezePoint::owns(role) {
            return self.freeze.set_scalars(role, values);
        }
        let [c_avg, k, r_prev] = self.segments.host_mut();
        match role {
            "c_avg" => per_segment(c_avg, values),
            "k" => per_segment(k, values),
            "r_prev" => per_segment(r_prev, values),
            _ => Err(format!("unknown scalar state `{role}`")),
        }
    }

    fn stage(&self, t: u64) -> Stage {
        self.freeze.stage(t)
    }

    fn own_state(&self) -> crate::OwnState {
        crate::kept_out::ErrorFeedback::ROLES
    }

    fn params_replicated(&self) -> bool {
        true
    }
}
