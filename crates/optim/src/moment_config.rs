//! The settings of Adam's moments, shared by every Adam- and LAMB-family
//! optimizer's config (flattened into it: the TOML keys stay top-level).

use serde::{Deserialize, Serialize};

use crate::config_check::{check_decay, invalid};
use crate::{EpsMode, OptimError};

/// β1, β2, ε, its placement and the decoupled weight decay.
///
/// Bias correction is not here: its default differs between optimizers
/// (on for Adam and SLAMB, off for the LAMB family and 1-bit Adam, as in
/// the papers' runs), and a flattened struct has one default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MomentConfig {
    /// Momentum decay β1.
    pub beta_1: f64,
    /// Variance decay β2.
    pub beta_2: f64,
    /// ε of the denominator.
    pub eps: f64,
    /// Decoupled weight decay, applied to the decay group only.
    pub weight_decay: f64,
    /// Where ε enters the denominator (`inside_compressed` only for the
    /// optimizers with a compression stage).
    pub eps_mode: EpsMode,
}

impl Default for MomentConfig {
    fn default() -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            eps_mode: EpsMode::Outside,
        }
    }
}

impl MomentConfig {
    /// Checks the ranges; errors name the field as `{optimizer}.{field}`.
    pub(crate) fn validate(&self, optimizer: &str) -> Result<(), OptimError> {
        let field = |name: &str| format!("{optimizer}.{name}");
        if !(0.0..1.0).contains(&self.beta_1) {
            return Err(invalid(
                field("beta_1"),
                self.beta_1.to_string(),
                "needs 0 <= beta_1 < 1",
            ));
        }
        if !(0.0..1.0).contains(&self.beta_2) {
            return Err(invalid(
                field("beta_2"),
                self.beta_2.to_string(),
                "needs 0 <= beta_2 < 1",
            ));
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            return Err(invalid(
                field("eps"),
                self.eps.to_string(),
                "needs 0 < eps < inf",
            ));
        }
        check_decay(field("weight_decay"), self.weight_decay)
    }
}

/// burn-style builder methods (`with_weight_decay(0.01)`) for the shared
/// moment settings of any config that flattens a [`MomentConfig`], so a
/// caller changes one of them without spelling out the nested struct.
pub trait WithMoments: Sized {
    /// The config's moment settings.
    fn moments_mut(&mut self) -> &mut MomentConfig;

    crate::config_check::with_setters!(moments_mut;
        /// Sets β1.
        with_beta_1(beta_1: f64),
        /// Sets β2.
        with_beta_2(beta_2: f64),
        /// Sets ε.
        with_eps(eps: f64),
        /// Sets the decoupled weight decay.
        with_weight_decay(weight_decay: f64),
        /// Sets where ε enters the denominator.
        with_eps_mode(eps_mode: EpsMode),
    );
}
