//! Adam with decoupled weight decay (AdamW), ALGORITHMS.md "Adam / AdamW";
//! Kingma & Ba, Algorithm 1, with Loshchilov & Hutter's decoupled decay.

use serde::{Deserialize, Serialize};

use crate::config_check::NoOtherFields;
use crate::eps_mode::check_has_compression_stage;
use crate::moments::Moments;
use crate::pass::{self, Direction};
use crate::span::{Span, SpanCache};
use crate::step::CommTime;
use crate::step::{FlatOptimizer, StepContext};
use crate::{Flat, FlatMut, MomentConfig, OptimError, WithMoments};
use terse_comm::Communicator;

/// `adam` (ALGORITHMS.md "Adam / AdamW").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdamConfig {
    /// β1, β2, ε, its placement and the weight decay.
    #[serde(flatten)]
    pub moments: MomentConfig,
    /// Divide m and v by `1-β^t`. The papers' BERT runs ("BertAdam") turn it off.
    pub bias_correction: bool,
    /// Refuses keys no field claims (must stay last).
    #[serde(flatten, skip_serializing)]
    pub no_other_fields: NoOtherFields,
}

impl Default for AdamConfig {
    fn default() -> Self {
        Self {
            moments: MomentConfig::default(),
            bias_correction: true,
            no_other_fields: NoOtherFields,
        }
    }
}

impl AdamConfig {
    pub(crate) fn validate(&self, name: &str) -> Result<(), OptimError> {
        self.moments.validate(name)?;
        check_has_compression_stage(format!("{name}.eps_mode"), self.moments.eps_mode)
    }
}

impl WithMoments for AdamConfig {
    fn moments_mut(&mut self) -> &mut MomentConfig {
        &mut self.moments
    }
}

/// Adam's state: first and second moments of the averaged gradient.
pub struct Adam {
    config: AdamConfig,
    m: Flat,
    v: Flat,
    spans: SpanCache,
    /// m and v are current only in this rank's part of a split step.
    partial: bool,
}

impl Adam {
    /// Zeroed state for `d` parameters.
    pub fn new(config: AdamConfig, d: usize) -> Self {
        Self {
            config,
            m: Flat::zeros(d),
            v: Flat::zeros(d),
            spans: SpanCache::default(),
            partial: false,
        }
    }
}

impl FlatOptimizer for Adam {
    fn step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        let c = &self.config;
        let span = self.spans.span(ctx, x, c.moments.weight_decay, true);
        let mut comm_time = span.mean_gradient(ctx.comm, g)?;
        adam_update(c, ctx, &span, x, (&mut self.m, &mut self.v), g);
        comm_time += span.share_back(ctx.comm, &mut [x])?;
        self.partial |= span.is_split();
        Ok(comm_time)
    }

    fn state(&mut self) -> Vec<(&'static str, &mut Flat)> {
        vec![("m", &mut self.m), ("v", &mut self.v)]
    }

    fn state_loaded(&mut self) {
        self.partial = false;
    }

    fn state_is_partial(&self) -> bool {
        self.partial
    }

    fn sync_state(&mut self, comm: &dyn Communicator) -> Result<(), OptimError> {
        let buffers = &mut [&mut self.m, &mut self.v];
        self.spans.gather_partial(comm, &mut self.partial, buffers)
    }

    fn params_replicated(&self) -> bool {
        true
    }
}

/// Adam's update of `x`, `m` and `v` from the averaged gradient `g` over
/// `span` (also 1-bit Adam's warmup and its naive baseline).
pub(crate) fn adam_update(
    c: &AdamConfig,
    ctx: &StepContext,
    span: &Span<'_>,
    x: &mut FlatMut,
    state: (&mut Flat, &mut Flat),
    g: &FlatMut<'_>,
) {
    let moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
    let direction = Direction {
        moments: &moments,
        eps_mode: c.moments.eps_mode,
        weight_decay: c.moments.weight_decay as f32,
    };
    pass::adam::adam(span, &direction, ctx.lr as f32, x, state, g);
}
