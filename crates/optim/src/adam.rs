//! Adam with decoupled weight decay (AdamW), ALGORITHMS.md "Adam / AdamW";
//! Kingma & Ba, Algorithm 1, with Loshchilov & Hutter's decoupled decay.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use serde::{Deserialize, Serialize};

use crate::config_check::NoOtherFields;
use crate::device_flat::{allreduce_mean_device, chunk_table};
use crate::eps_mode::check_has_compression_stage;
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{CHUNK, split_segments, split_segments_mut, with_avx};
use terse_comm::Communicator;
use terse_kernels::device::optim::DeviceChunks;

use crate::shard::{Shard, gather_partial_state, unit_slices, unit_slices_mut};
use crate::step::{FlatOptimizer, StepContext, allreduce_mean_gradient};
use crate::{DeviceFlat, Flat, MomentConfig, OptimError, WithMoments};

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
    /// The device kernels' chunk table (device runs).
    chunks: Option<DeviceChunks>,
    /// The split of the step between ranks that share cores.
    shard: Option<Arc<Shard>>,
    /// m and v are current only in this rank's part of `shard`.
    partial: bool,
}

impl Adam {
    /// Zeroed state for `d` parameters.
    pub fn new(config: AdamConfig, d: usize) -> Self {
        Self {
            config,
            m: Flat::zeros(d),
            v: Flat::zeros(d),
            chunks: None,
            shard: None,
            partial: false,
        }
    }
}

impl FlatOptimizer for Adam {
    fn step(
        &mut self,
        ctx: &StepContext<'_>,
        x: &mut [f32],
        g: &mut [f32],
    ) -> Result<Duration, OptimError> {
        let shard = Shard::for_step(&mut self.shard, ctx);
        if shard.is_split() {
            self.partial = true;
            let (m, v) = (self.m.host_mut(), self.v.host_mut());
            return adam_step_sharded(&self.config, ctx, &shard, x, m, v, g);
        }
        let comm_time = allreduce_mean_gradient(ctx.comm, g)?;
        adam_step(
            &self.config,
            ctx,
            x,
            self.m.host_mut(),
            self.v.host_mut(),
            g,
        );
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
        let buffers: &mut [&mut [f32]] = &mut [self.m.host_mut(), self.v.host_mut()];
        gather_partial_state(comm, self.shard.as_deref(), &mut self.partial, buffers)
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
        let chunks = chunk_table(
            &mut self.chunks,
            x,
            ctx.layout,
            self.config.moments.weight_decay,
        );
        adam_step_device(&self.config, ctx, chunks, x, &self.m, &self.v, g);
        Ok(comm_time)
    }
}

/// [`adam_step`] on the device, over `chunks`.
pub(crate) fn adam_step_device(
    c: &AdamConfig,
    ctx: &StepContext<'_>,
    chunks: &DeviceChunks,
    x: &DeviceFlat,
    m: &Flat,
    v: &Flat,
    g: &DeviceFlat,
) {
    let moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
    terse_kernels::device::optim::adam_step(
        x.client(),
        chunks,
        x.handle(),
        m.handle(),
        v.handle(),
        g.handle(),
        &moments.coefficients(),
        ctx.lr as f32,
        c.moments.eps_mode == crate::EpsMode::Inside,
    );
}

/// One Adam step on the synchronised gradient `g` (also 1-bit Adam's
/// warmup and its naive baseline).
pub(crate) fn adam_step(
    c: &AdamConfig,
    ctx: &StepContext<'_>,
    x: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
) {
    let moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
    let lr = ctx.lr as f32;
    let weight_decay = c.moments.weight_decay as f32;

    let xs = split_segments_mut(ctx.layout, x);
    let ms = split_segments_mut(ctx.layout, m);
    let vs = split_segments_mut(ctx.layout, v);
    let gs = split_segments(ctx.layout, g);
    with_eps_mode!(c.moments.eps_mode, INSIDE => {
        ctx.layout
            .segments()
            .par_iter()
            .zip(xs)
            .zip(ms)
            .zip(vs)
            .zip(gs)
            .for_each(|((((segment, x), m), v), g)| {
                let wd = if segment.decay { weight_decay } else { 0.0 };
                x.par_chunks_mut(CHUNK)
                    .zip(m.par_chunks_mut(CHUNK))
                    .zip(v.par_chunks_mut(CHUNK))
                    .zip(g.par_chunks(CHUNK))
                    .for_each(|(((x, m), v), g)| {
                        with_avx(|| adam_update::<INSIDE>(&moments, lr, wd, x, m, v, g))
                    });
            })
    });
}

/// [`adam_step`] split between ranks that share cores (see
/// [`crate::shard`]): the gradient reduce-scattered, the update applied to
/// this rank's chunks, the parameters shared back. The same bits as the
/// allreduce and [`adam_step`] (the update is element-wise); `m` and `v` are
/// current only in this rank's chunks afterwards. `g` is this rank's local
/// gradient. Returns the time spent in collectives.
pub(crate) fn adam_step_sharded(
    c: &AdamConfig,
    ctx: &StepContext<'_>,
    shard: &Shard,
    x: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &mut [f32],
) -> Result<Duration, OptimError> {
    let ranges = shard.ranges();
    let clock = Instant::now();
    ctx.comm.reduce_scatter_mean_f32(g, &ranges)?;
    let mut comm_time = clock.elapsed();
    let moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
    let lr = ctx.lr as f32;
    let weight_decay = c.moments.weight_decay as f32;
    let segments = ctx.layout.segments();
    let mine = shard.mine();
    with_eps_mode!(c.moments.eps_mode, INSIDE => {
        mine.par_iter()
            .zip(unit_slices_mut(x, mine))
            .zip(unit_slices_mut(m, mine))
            .zip(unit_slices_mut(v, mine))
            .zip(unit_slices(g, mine))
            .for_each(|((((unit, x), m), v), g)| {
                let wd = if segments[unit.segment].decay { weight_decay } else { 0.0 };
                with_avx(|| adam_update::<INSIDE>(&moments, lr, wd, x, m, v, g))
            })
    });
    let clock = Instant::now();
    ctx.comm.share_ranges_f32(x, &ranges)?;
    comm_time += clock.elapsed();
    Ok(comm_time)
}

/// The fused Adam update of one chunk: moments, direction and parameter in a
/// single pass over x, m, v and g.
#[inline(always)]
fn adam_update<const INSIDE: bool>(
    moments: &Moments,
    lr: f32,
    wd: f32,
    x: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
) {
    for (((x, m), v), &g) in x.iter_mut().zip(m).zip(v).zip(g) {
        moments.accumulate(m, v, g);
        *x -= lr * moments.direction::<INSIDE>(*m, *v, *x, wd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use terse_kernels::{SimdTier, with_tier};

    /// The update is the same bits in every vector tier the CPU has as in
    /// portable code (the optimizers' results must not depend on the
    /// machine), for both ε placements, with weight decay, at steps 1 and 7.
    #[test]
    fn every_tier_gives_the_same_bits() {
        let n = 4099;
        let wave = |k: f32| (0..n).map(move |i| (i as f32 * k).sin());
        for t in [1, 7] {
            let moments = Moments::new(&MomentConfig::default(), true, t);
            let step = |tier, inside: bool| {
                let mut x: Vec<f32> = wave(0.37).collect();
                let mut m: Vec<f32> = wave(0.11).map(|v| v * 1e-3).collect();
                let mut v: Vec<f32> = wave(0.05).map(|v| v * v * 1e-6).collect();
                let g: Vec<f32> = wave(0.91).map(|v| v * 1e-2).collect();
                with_tier(tier, || {
                    if inside {
                        adam_update::<true>(&moments, 1e-3, 0.01, &mut x, &mut m, &mut v, &g)
                    } else {
                        adam_update::<false>(&moments, 1e-3, 0.01, &mut x, &mut m, &mut v, &g)
                    }
                });
                [x, m, v].map(|b| b.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
            };
            for inside in [false, true] {
                let portable = step(SimdTier::Portable, inside);
                for tier in SimdTier::available() {
                    assert_eq!(
                        step(tier, inside),
                        portable,
                        "{tier:?}, t {t}, inside {inside}"
                    );
                }
            }
        }
    }
}
