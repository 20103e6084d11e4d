//! Momentum SGD (ALGORITHMS.md "Momentum SGD"), PyTorch's formulation:
//! `m = μ·m + (ḡ + wd·x)`, step along `m`, or along `ḡ + wd·x + μ·m` with
//! Nesterov momentum.

use serde::{Deserialize, Serialize};

use crate::config_check::{check_decay, invalid};
use crate::pass::sgd::{SgdStep, sgd};
use crate::span::SpanCache;
use crate::step::CommTime;
use crate::step::{FlatOptimizer, StepContext};
use crate::{Flat, FlatMut, OptimError};

/// `sgd` (ALGORITHMS.md "Momentum SGD"). No Adam moments, so no shared
/// fields to flatten and serde's own `deny_unknown_fields` applies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SgdConfig {
    /// Momentum μ (0 gives plain SGD).
    pub momentum: f64,
    /// L2 weight decay added to the gradient, decay group only.
    pub weight_decay: f64,
    /// Nesterov momentum: step along `ḡ + μ·m` instead of `m`.
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            momentum: 0.9,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

impl SgdConfig {
    pub(crate) fn validate(&self, name: &str) -> Result<(), OptimError> {
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(invalid(
                format!("{name}.momentum"),
                self.momentum.to_string(),
                "needs 0 <= momentum < 1",
            ));
        }
        if self.nesterov && self.momentum == 0.0 {
            return Err(invalid(
                format!("{name}.nesterov"),
                "true".into(),
                "Nesterov momentum needs momentum > 0",
            ));
        }
        check_decay(format!("{name}.weight_decay"), self.weight_decay)
    }
}

/// SGD's state: the momentum buffer.
pub struct Sgd {
    config: SgdConfig,
    m: Flat,
    spans: SpanCache,
}

impl Sgd {
    /// Zeroed state for `d` parameters.
    pub fn new(config: SgdConfig, d: usize) -> Self {
        Self {
            config,
            m: Flat::zeros(d),
            spans: SpanCache::default(),
        }
    }
}

impl FlatOptimizer for Sgd {
    fn step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        let c = &self.config;
        let span = self.spans.span(ctx, x, c.weight_decay, false);
        let comm_time = span.mean_gradient(ctx.comm, g)?;
        let constants = SgdStep {
            mu: c.momentum as f32,
            lr: ctx.lr as f32,
            weight_decay: c.weight_decay as f32,
            nesterov: c.nesterov,
        };
        sgd(&span, &constants, x, &mut self.m, g);
        Ok(comm_time)
    }

    fn state(&mut self) -> Vec<(&'static str, &mut Flat)> {
        vec![("m", &mut self.m)]
    }

    fn params_replicated(&self) -> bool {
        true
    }

    fn own_state(&self) -> crate::OwnState {
        crate::OwnState::Nothing
    }
}
