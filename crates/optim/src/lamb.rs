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
use crate::pass::{self, Direction, sums::squared_norm};
use crate::span::Span;
use crate::step::StepContext;
use crate::two_moments::{MomentRule, MomentUpdate, TwoMoments};
use crate::{Flat, FlatMut, MomentConfig, OptimError, Segment, WithMoments};
use terse_kernels::device::optim::QueuedTrusts;

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

/// LAMB's layer-wise coefficient from the two norms.
///
/// When either norm is 0 (a freshly zeroed bias, a segment without gradient)
/// the ratio is meaningless and the coefficient is exactly 1, unclipped, as in
/// the authors' implementation; 1-bit LAMB relies on that value to skip such
/// segments when averaging coefficients.
pub(crate) fn trust_coefficient(x_norm: f64, u_norm: f64, c_min: f64, c_max: f64) -> f64 {
    if x_norm == 0.0 || u_norm == 0.0 {
        1.0
    } else {
        (x_norm / u_norm).clamp(c_min, c_max)
    }
}

/// LAMB's update of `x`, `m` and `v` from the averaged gradient `g` over
/// `span` (also 1-bit LAMB's warmup): the moments and each chunk's norms,
/// the segments' trust coefficients (on the host from f64 sums, this
/// rank's chunks gathered from the others when the step is split; on a
/// device there, [`pass::lamb::lamb_passes`]), the update. Returns the
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
    pass::lamb::lamb_passes(span, &direction, &rule, ctx.comm, x, (m, v), g)
}

/// How LAMB turns a segment's norms into its coefficient and rate.
pub(crate) struct TrustRule {
    /// The step's learning rate (the rate is `lr·c`).
    pub(crate) lr: f64,
    /// The coefficient's clip range.
    pub(crate) c_min: f64,
    pub(crate) c_max: f64,
    /// A coefficient of exactly 1 for segments without decay
    /// (`trust_decay_only`).
    pub(crate) decay_only: bool,
}

impl TrustRule {
    /// Whether `segment` takes a trust ratio at all.
    pub(crate) fn applies_to(&self, segment: &Segment) -> bool {
        !self.decay_only || segment.decay
    }

    /// The coefficient of `segment` from its `Σx²` and `Σu²`.
    pub(crate) fn of_segment(&self, segment: &Segment, xx: f64, uu: f64) -> Trust {
        if self.applies_to(segment) {
            Trust {
                coefficient: trust_coefficient(xx.sqrt(), uu.sqrt(), self.c_min, self.c_max),
                degenerate: xx == 0.0 || uu == 0.0,
            }
        } else {
            Trust {
                coefficient: 1.0,
                degenerate: false,
            }
        }
    }
}

/// A segment's trust coefficient, and whether a norm was 0 (coefficient 1
/// by that rule, which 1-bit LAMB leaves out of its running average).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Trust {
    pub(crate) coefficient: f64,
    pub(crate) degenerate: bool,
}

/// The segments' coefficients of a step: computed on the host, or on the
/// device and read only when asked for ([`Trusts::read`]), so that LAMB,
/// which does not keep them, never waits for them.
pub(crate) enum Trusts {
    Ready(Vec<Trust>),
    Queued(QueuedTrusts),
}

impl Trusts {
    /// The coefficients, one per segment (a device's: waits for it).
    pub(crate) fn read(self) -> Vec<Trust> {
        match self {
            Trusts::Ready(trusts) => trusts,
            Trusts::Queued(queued) => queued
                .read()
                .into_iter()
                .map(|(coefficient, degenerate)| Trust {
                    coefficient: f64::from(coefficient),
                    degenerate,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::trust_coefficient;

    #[test]
    fn trust_is_one_when_a_norm_vanishes_and_clipped_otherwise() {
        assert_eq!(trust_coefficient(0.0, 3.0, 0.01, 0.3), 1.0);
        assert_eq!(trust_coefficient(2.0, 0.0, 0.01, 0.3), 1.0);
        assert_eq!(trust_coefficient(1.0, 10.0, 0.01, 0.3), 0.1);
        assert_eq!(trust_coefficient(10.0, 1.0, 0.01, 0.3), 0.3);
        assert_eq!(trust_coefficient(1.0, 1000.0, 0.01, 0.3), 0.01);
    }
}
