//! Momentum SGD (ALGORITHMS.md "Momentum SGD"), PyTorch's formulation:
//! `m = μ·m + (ḡ + wd·x)`, step along `m`, or along `ḡ + wd·x + μ·m` with
//! Nesterov momentum.

use std::time::Duration;

use rayon::prelude::*;

use serde::{Deserialize, Serialize};

use crate::config_check::{check_decay, invalid};
use crate::device_flat::{allreduce_mean_device, chunk_table};
use crate::parallel::{CHUNK, split_segments, split_segments_mut, with_avx};
use crate::step::{FlatOptimizer, StepContext, allreduce_mean_gradient};
use crate::{DeviceFlat, Flat, OptimError};
use terse_kernels::device::optim::DeviceChunks;

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
    /// The device kernels' chunk table (device runs).
    chunks: Option<DeviceChunks>,
}

impl Sgd {
    /// Zeroed state for `d` parameters.
    pub fn new(config: SgdConfig, d: usize) -> Self {
        Self {
            config,
            m: Flat::zeros(d),
            chunks: None,
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
        let ms = split_segments_mut(ctx.layout, self.m.host_mut());
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

    fn state(&mut self) -> Vec<(&'static str, &mut Flat)> {
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
        let chunks = chunk_table(&mut self.chunks, x, ctx.layout, self.config.weight_decay);
        terse_kernels::device::optim::sgd_step(
            x.client(),
            chunks,
            x.handle(),
            self.m.handle(),
            g.handle(),
            self.config.momentum as f32,
            ctx.lr as f32,
            self.config.nesterov,
        );
        Ok(comm_time)
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
