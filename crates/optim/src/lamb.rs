//! LAMB (ALGORITHMS.md "LAMB"; You et al. 2020, Algorithm 2): Adam's
//! direction scaled per segment by the clipped trust ratio `‖x‖/‖u‖`.
//!
//! Two passes (`pass/lamb.rs`): the first updates m and v and accumulates
//! ‖x‖² and ‖u‖² per chunk; the second recomputes u from the stored moments
//! (cheaper than keeping a d-sized buffer of u between the passes) and
//! applies `x -= lr·c·u`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config_check::{NoOtherFields, check_clip};
use crate::eps_mode::check_has_compression_stage;
use crate::moments::Moments;
use crate::pass::lamb::{TrustRule, Trusts, lamb_passes};
use crate::pass::{Direction, sums::squared_norm};
use crate::span::Span;
use crate::step::StepContext;
use crate::two_moments::{MomentRule, MomentUpdate, TwoMoments};
use crate::{Flat, FlatMut, MomentConfig, OptimError, WithMoments};

/// `lamb` (ALGORITHMS.md "LAMB").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LambConfig {
    /// β1, β2, ε, its placement and the weight decay.
    #[serde(flatten)]
    pub moments: MomentConfig,
    /// Divide m and v by `1-β^t` (off by default, as in both LAMB papers' BERT runs).
    pub bias_correction: bool,
    /// Lower clip of the trust ratio.
    pub c_min: f64,
    /// Upper clip of the trust ratio.
    pub c_max: f64,
    /// Divide ḡ by `max(‖ḡ‖, 1)` before the moments (NVIDIA FusedLAMB).
    pub grad_prenorm: bool,
    /// Use a trust ratio of 1 for the no-decay group (NVIDIA FusedLAMB).
    pub trust_decay_only: bool,
    /// Refuses keys no field claims (must stay last).
    #[serde(flatten, skip_serializing)]
    pub no_other_fields: NoOtherFields,
}

impl Default for LambConfig {
    fn default() -> Self {
        Self {
            moments: MomentConfig::default(),
            bias_correction: false,
            c_min: 0.01,
            c_max: 0.3,
            grad_prenorm: false,
            trust_decay_only: false,
            no_other_fields: NoOtherFields,
        }
    }
}

impl LambConfig {
    pub(crate) fn validate(&self, name: &str) -> Result<(), OptimError> {
        self.moments.validate(name)?;
        check_has_compression_stage(format!("{name}.eps_mode"), self.moments.eps_mode)?;
        check_trust_clip(name, self.c_min, self.c_max)
    }
}

crate::config_check::flattens!(LambConfig {
    moments: MomentConfig => WithMoments, moments_mut;
});

/// LAMB's state: first and second moments of the averaged gradient.
pub type Lamb = TwoMoments<LambConfig>;

impl MomentRule for LambConfig {
    const UPDATE: MomentUpdate<Self> = |c, ctx, span, x, m_v, g| {
        let (_, gather_time) = lamb_update(c, ctx, span, x, m_v, g)?;
        Ok(gather_time)
    };

    fn weight_decay(&self) -> f64 {
        self.moments.weight_decay
    }

    /// The gradient's pre-normalisation reads all of it.
    fn splits(&self) -> bool {
        !self.grad_prenorm
    }
}

/// The trust ratio's clip range `[c_min, c_max]`, shared by LAMB and 1-bit
/// LAMB.
pub(crate) fn check_trust_clip(name: &str, c_min: f64, c_max: f64) -> Result<(), OptimError> {
    check_clip(
        format!("{name}.c_min"),
        "c_max",
        (c_min, c_max),
        "needs 0 < c_min <= c_max < inf",
    )
}

/// LAMB's update of `x`, `m` and `v` from the averaged gradient `g` over
/// `span` (also 1-bit LAMB's warmup): the moments and each chunk's norms,
/// the segments' trust coefficients (on the host from f64 sums, this
/// rank's chunks gathered from the others when the step is split; on a
/// device there, [`lamb_passes`]), the update. Returns the
/// coefficients and the time spent gathering.
pub(crate) fn lamb_update(
    c: &LambConfig,
    ctx: &StepContext,
    span: &Span<'_>,
    x: &mut FlatMut,
    (m, v): (&mut Flat, &mut Flat),
    g: &FlatMut<'_>,
) -> Result<(Trusts, Duration), OptimError> {
    let mut moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
    if c.grad_prenorm {
        let norm = squared_norm(span, g).sqrt();
        moments.grad_scale = (1.0 / norm.max(1.0)) as f32;
    }
    let direction = Direction {
        moments: &moments,
        eps_mode: c.moments.eps_mode,
        weight_decay: c.moments.weight_decay as f32,
    };
    let rule = TrustRule {
        lr: ctx.lr,
        c_min: c.c_min,
        c_max: c.c_max,
        decay_only: c.trust_decay_only,
    };
    lamb_passes(span, &direction, &rule, ctx.comm, x, (m, v), g)
}
