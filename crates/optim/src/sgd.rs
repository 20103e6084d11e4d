//! Momentum SGD (ALGORITHMS.md "Momentum SGD"), PyTorch's formulation:
//! `m = μ·m + (ḡ + wd·x)`, step along `m`, or along `ḡ + wd·x + μ·m` with
//! Nesterov momentum.

use std::time::Duration;

use rayon::prelude::*;

use serde::{Deserialize, Serialize};
use terse_kernels::resident::filled;

use crate::config_check::{check_decay, invalid};
use crate::device_flat::{DeviceState, allreduce_mean_device};
use crate::parallel::{CHUNK, split_segments, split_segments_mut, with_avx};
use crate::step::{FlatOptimizer, StepContext, allreduce_mean_gradient};
use crate::{DeviceFlat, OptimError};

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
    m: Vec<f32>,
    /// m on the device, between device steps.
    device: Option<DeviceState>,
}

impl Sgd {
    /// Zeroed state for `d` parameters.
    pub fn new(config: SgdConfig, d: usize) -> Self {
        Self {
            config,
            m: filled(d, 0.0),
            device: None,
        }
    }
}

impl FlatOptimizer for Sgd {
    fn step(
        &mut self,
        ctx: &StepContext<'_>,
        x: &mut [f32],
        g: &mut [f32],
    ) -> Result<Duration, OptimError> {
        let comm_time = allreduce_mean_gradient(ctx.comm, g)?;
        let mu = self.config.momentum as f32;
        let weight_decay = self.config.weight_decay as f32;
        let nesterov = self.config.nesterov;
        let lr = ctx.lr as f32;

        let xs = split_segments_mut(ctx.layout, x);
        let ms = split_segments_mut(ctx.layout, &mut self.m);
        let gs = split_segments(ctx.layout, g);
        ctx.layout
            .segments()
            .par_iter()
            .zip(xs)
            .zip(ms)
            .zip(gs)
            .for_each(|(((segment, x), m), g)| {
                let wd = if segment.decay { weight_decay } else { 0.0 };
                x.par_chunks_mut(CHUNK)
                    .zip(m.par_chunks_mut(CHUNK))
                    .zip(g.par_chunks(CHUNK))
                    .for_each(|((x, m), g)| {
                        with_avx(|| {
                            if nesterov {
                                sgd_update::<true>(mu, lr, wd, x, m, g)
                            } else {
                                sgd_update::<false>(mu, lr, wd, x, m, g)
                            }
                        })
                    });
            });
        Ok(comm_time)
    }

    fn state(&self) -> Vec<(&'static str, &[f32])> {
        vec![("m", &self.m)]
    }

    fn state_mut(&mut self) -> Vec<(&'static str, &mut [f32])> {
        vec![("m", &mut self.m)]
    }

    fn params_replicated(&self) -> bool {
        true
    }

    fn step_device(
        &mut self,
        ctx: &StepContext<'_>,
        x: &mut DeviceFlat,
        g: &mut DeviceFlat,
    ) -> Result<Duration, OptimError> {
        let comm_time = allreduce_mean_device(ctx.comm, g)?;
        let wd = self.config.weight_decay as f32;
        let state = self
            .device
            .get_or_insert_with(|| DeviceState::upload(x, ctx.layout, wd, &[&self.m]));
        terse_kernels::device::optim::sgd_step(
            &state.client,
            &state.chunks,
            x.handle(),
            &state.buffers[0],
            g.handle(),
            self.config.momentum as f32,
            ctx.lr as f32,
            self.config.nesterov,
        );
        Ok(comm_time)
    }

    fn state_to_host(&mut self) {
        if let Some(state) = &self.device {
            state.download(vec![&mut self.m]);
        }
    }

    fn forget_device_state(&mut self) {
        self.device = None;
    }
}

#[inline(always)]
fn sgd_update<const NESTEROV: bool>(
    mu: f32,
    lr: f32,
    wd: f32,
    x: &mut [f32],
    m: &mut [f32],
    g: &[f32],
) {
    for ((x, m), &g) in x.iter_mut().zip(m).zip(g) {
        let d = g + wd * *x;
        *m = mu * *m + d;
        let step = if NESTEROV { d + mu * *m } else { *m };
        *x -= lr * step;
    }
}
