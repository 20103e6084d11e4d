//! Adam with decoupled weight decay (AdamW), ALGORITHMS.md "Adam / AdamW";
//! Kingma & Ba, Algorithm 1, with Loshchilov & Hutter's decoupled decay.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config_check::NoOtherFields;
use crate::eps_mode::check_has_compression_stage;
use crate::moments::Moments;
use crate::pass::{self, Direction};
use crate::span::Span;
use crate::step::{CommTime, StepContext};
use crate::two_moments::{MomentRule, MomentUpdate, TwoMoments};
use crate::{Flat, FlatMut, MomentConfig, OptimError, WithMoments};

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

crate::config_check::flattens!(AdamConfig {
    moments: MomentConfig => WithMoments, moments_mut;
});

/// Adam's state: first and second moments of the averaged gradient.
pub type Adam = TwoMoments<AdamConfig>;

impl MomentRule for AdamConfig {
    const UPDATE: MomentUpdate<Self> = adam_update;

    fn weight_decay(&self) -> f64 {
        self.moments.weight_decay
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
) -> CommTime {
    let moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
    let direction = Direction {
        moments: &moments,
        eps_mode: c.moments.eps_mode,
        weight_decay: c.moments.weight_decay as f32,
    };
    pass::adam::adam(span, &direction, ctx.lr as f32, x, state, g);
    // Adam gathers nothing.
    Ok(Duration::ZERO)
}
