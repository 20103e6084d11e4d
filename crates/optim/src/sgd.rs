//! Momentum SGD (ALGORITHMS.md "Momentum SGD"), PyTorch's formulation:
//! `m = μ·m + (ḡ + wd·x)`, step along `m`, or along `ḡ + wd·x + μ·m` with
//! Nesterov momentum.

use std::time::Duration;

use rayon::prelude::*;

use crate::optimizer::allreduce_mean_gradient;
use crate::parallel::{CHUNK, split_segments, split_segments_mut, with_avx};
use crate::{FlatOptimizer, OptimError, SgdConfig, StepContext};

/// SGD's state: the momentum buffer.
pub struct Sgd {
    config: SgdConfig,
    m: Vec<f32>,
}

impl Sgd {
    /// Zeroed state for `d` parameters.
    pub fn new(config: SgdConfig, d: usize) -> Self {
        Self {
            config,
            m: vec![0.0; d],
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
