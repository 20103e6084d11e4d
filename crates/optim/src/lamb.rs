//! LAMB (ALGORITHMS.md "LAMB"; You et al. 2020, Algorithm 2): Adam's
//! direction scaled per segment by the clipped trust ratio `‖x‖/‖u‖`.
//!
//! Two passes per segment: the first updates m and v and accumulates ‖x‖² and
//! ‖u‖²; the second recomputes u from the stored moments (cheaper than keeping a
//! d-sized buffer of u between the passes) and applies `x -= lr·c·u`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use serde::{Deserialize, Serialize};

use crate::config_check::{NoOtherFields, check_clip};
use crate::device_flat::{allreduce_mean_device, chunk_table};
use crate::eps_mode::check_has_compression_stage;
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{
    CHUNK, chunk_sum_of_squares, split_segments, split_segments_mut, sum_of_squares, with_avx,
};
use terse_comm::Communicator;
use terse_kernels::device::optim::DeviceChunks;

use crate::shard::{Shard, gather_partial_state, share_unit_words, unit_slices, unit_slices_mut};
use crate::step::{FlatOptimizer, StepContext, allreduce_mean_gradient};
use crate::{DeviceFlat, Flat, MomentConfig, OptimError, Segment, WithMoments};

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

impl WithMoments for LambConfig {
    fn moments_mut(&mut self) -> &mut MomentConfig {
        &mut self.moments
    }
}

/// LAMB's state: first and second moments of the averaged gradient.
pub struct Lamb {
    config: LambConfig,
    m: Flat,
    v: Flat,
    /// The device kernels' chunk table (device runs).
    chunks: Option<DeviceChunks>,
    /// The split of the step between ranks that share cores.
    shard: Option<Arc<Shard>>,
    /// m and v are current only in this rank's part of `shard`.
    partial: bool,
}

impl Lamb {
    /// Zeroed state for `d` parameters.
    pub fn new(config: LambConfig, d: usize) -> Self {
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

impl FlatOptimizer for Lamb {
    fn step(
        &mut self,
        ctx: &StepContext<'_>,
        x: &mut [f32],
        g: &mut [f32],
    ) -> Result<Duration, OptimError> {
        let shard = Shard::for_step(&mut self.shard, ctx);
        if !self.config.grad_prenorm && shard.is_split() {
            let c = &self.config;
            let (m, v) = (self.m.host_mut(), self.v.host_mut());
            let (_, comm_time) = lamb_step_sharded(c, ctx, &shard, x, m, v, g)?;
            self.partial = true;
            return Ok(comm_time);
        }
        let comm_time = allreduce_mean_gradient(ctx.comm, g)?;
        lamb_step(
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
        lamb_step_device(&self.config, ctx, chunks, x, (&self.m, &self.v), g);
        Ok(comm_time)
    }
}

/// [`lamb_step`] on the device, over `chunks`: the moments and the
/// chunks' partial norms in one launch, the trust coefficients on the host
/// from the segments' f64 sums, the update in a second launch.
pub(crate) fn lamb_step_device(
    c: &LambConfig,
    ctx: &StepContext<'_>,
    chunks: &DeviceChunks,
    x: &DeviceFlat,
    (m, v): (&Flat, &Flat),
    g: &DeviceFlat,
) -> Vec<Trust> {
    use terse_kernels::device::optim;
    let client = x.client();
    let (m, v) = (m.handle(), v.handle());
    let mut moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
    if c.grad_prenorm {
        let norm = optim::sum_of_squares(client, chunks, g.handle())
            .iter()
            .sum::<f64>()
            .sqrt();
        moments.grad_scale = (1.0 / norm.max(1.0)) as f32;
    }
    let inside = c.moments.eps_mode == crate::EpsMode::Inside;
    let coefficients = moments.coefficients();
    let norms = optim::lamb_norms(
        client,
        chunks,
        x.handle(),
        m,
        v,
        g.handle(),
        &coefficients,
        inside,
    );
    let trusts: Vec<Trust> = ctx
        .layout
        .segments()
        .iter()
        .zip(norms)
        .map(|(segment, (xx, uu))| Trust::of_segment(c, segment, xx, uu))
        .collect();
    let rates: Vec<f32> = trusts
        .iter()
        .map(|trust| (ctx.lr * trust.coefficient) as f32)
        .collect();
    optim::lamb_apply(
        client,
        chunks,
        x.handle(),
        m,
        v,
        &coefficients,
        &rates,
        inside,
    );
    trusts
}

/// A segment's trust coefficient, and whether a norm was 0 (coefficient 1
/// by that rule, which 1-bit LAMB leaves out of its running average).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Trust {
    pub(crate) coefficient: f64,
    pub(crate) degenerate: bool,
}

impl Trust {
    /// The coefficient of `segment` from its `Σx²` and `Σu²`: exactly 1 for
    /// a segment without decay when trust applies to decayed ones only.
    fn of_segment(c: &LambConfig, segment: &Segment, xx: f64, uu: f64) -> Trust {
        if c.trust_decay_only && !segment.decay {
            Trust {
                coefficient: 1.0,
                degenerate: false,
            }
        } else {
            Trust {
                coefficient: trust_coefficient(xx.sqrt(), uu.sqrt(), c.c_min, c.c_max),
                degenerate: xx == 0.0 || uu == 0.0,
            }
        }
    }
}

/// One LAMB step on the synchronised gradient `g`; the coefficient each
/// segment got.
pub(crate) fn lamb_step(
    c: &LambConfig,
    ctx: &StepContext<'_>,
    x: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
) -> Vec<Trust> {
    let mut moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
    if c.grad_prenorm {
        let norm = sum_of_squares(g).sqrt();
        moments.grad_scale = (1.0 / norm.max(1.0)) as f32;
    }
    let lr = ctx.lr;
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
            .map(|((((segment, x), m), v), g)| {
                let wd = if segment.decay { weight_decay } else { 0.0 };
                let partials: Vec<(f64, f64)> = x
                    .par_chunks(CHUNK)
                    .zip(m.par_chunks_mut(CHUNK))
                    .zip(v.par_chunks_mut(CHUNK))
                    .zip(g.par_chunks(CHUNK))
                    .map(|(((x, m), v), g)| {
                        with_avx(|| accumulate::<INSIDE>(&moments, wd, x, m, v, g))
                    })
                    .collect();
                let (xx, uu) = partials
                    .into_iter()
                    .fold((0.0, 0.0), |(a, b), (x, u)| (a + x, b + u));
                let trust = Trust::of_segment(c, segment, xx, uu);
                let scaled_lr = (lr * trust.coefficient) as f32;
                x.par_chunks_mut(CHUNK)
                    .zip(m.par_chunks(CHUNK))
                    .zip(v.par_chunks(CHUNK))
                    .for_each(|((x, m), v)| {
                        with_avx(|| apply::<INSIDE>(&moments, scaled_lr, wd, x, m, v))
                    });
                trust
            })
            .collect()
    })
}

/// [`lamb_step`] split between ranks that share cores (see
/// [`crate::shard`]): the gradient reduce-scattered instead of allreduced,
/// the moments and parameters updated in this rank's chunks only, each
/// chunk's `(Σx², Σu²)` shared so every rank folds each segment's norms in
/// chunk order, as [`lamb_step`] does, and the parameters shared. The same
/// bits as the allreduce and [`lamb_step`]; `m` and `v` are current only in
/// this rank's chunks afterwards. `g` is this rank's local gradient. Not
/// for `grad_prenorm` (it needs the whole gradient's norm first). Returns
/// the coefficients and the time spent in collectives.
pub(crate) fn lamb_step_sharded(
    c: &LambConfig,
    ctx: &StepContext<'_>,
    shard: &Shard,
    x: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &mut [f32],
) -> Result<(Vec<Trust>, Duration), OptimError> {
    assert!(!c.grad_prenorm);
    let comm = ctx.comm;
    let ranges = shard.ranges();
    let clock = Instant::now();
    comm.reduce_scatter_mean_f32(g, &ranges)?;
    let mut comm_time = clock.elapsed();

    let moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
    let weight_decay = c.moments.weight_decay as f32;
    let segments = ctx.layout.segments();
    let decay = |segment: usize| {
        if segments[segment].decay {
            weight_decay
        } else {
            0.0
        }
    };
    let mine = shard.mine();
    let partials: Vec<(f64, f64)> = with_eps_mode!(c.moments.eps_mode, INSIDE => {
        mine.par_iter()
            .zip(unit_slices(x, mine))
            .zip(unit_slices_mut(m, mine))
            .zip(unit_slices_mut(v, mine))
            .zip(unit_slices(g, mine))
            .map(|((((unit, x), m), v), g)| {
                let wd = decay(unit.segment);
                with_avx(|| accumulate::<INSIDE>(&moments, wd, x, m, v, g))
            })
            .collect()
    });

    let clock = Instant::now();
    let all = share_partials(comm, shard, &partials)?;
    comm_time += clock.elapsed();
    // Each segment's sums from zero in chunk order, as `lamb_step` folds.
    let mut sums = vec![(0.0f64, 0.0f64); segments.len()];
    for (unit, (xx, uu)) in shard.units().iter().zip(all) {
        let sum = &mut sums[unit.segment];
        *sum = (sum.0 + xx, sum.1 + uu);
    }
    let trusts: Vec<Trust> = segments
        .iter()
        .zip(&sums)
        .map(|(segment, &(xx, uu))| Trust::of_segment(c, segment, xx, uu))
        .collect();

    with_eps_mode!(c.moments.eps_mode, INSIDE => {
        mine.par_iter()
            .zip(unit_slices_mut(x, mine))
            .zip(unit_slices(m, mine))
            .zip(unit_slices(v, mine))
            .for_each(|(((unit, x), m), v)| {
                let scaled_lr = (ctx.lr * trusts[unit.segment].coefficient) as f32;
                let wd = decay(unit.segment);
                with_avx(|| apply::<INSIDE>(&moments, scaled_lr, wd, x, m, v))
            })
    });
    let clock = Instant::now();
    comm.share_ranges_f32(x, &ranges)?;
    comm_time += clock.elapsed();
    Ok((trusts, comm_time))
}

/// Every rank's `(Σx², Σu²)` per unit, in unit order (as f64 bit patterns
/// in pairs of 32-bit words).
fn share_partials(
    comm: &dyn Communicator,
    shard: &Shard,
    partials: &[(f64, f64)],
) -> Result<Vec<(f64, f64)>, OptimError> {
    let flat: Vec<f64> = partials.iter().flat_map(|&(x, u)| [x, u]).collect();
    let all = share_unit_words(comm, shard, bytemuck::cast_slice(&flat), 4)?;
    let all: Vec<f64> = bytemuck::pod_collect_to_vec(&all);
    Ok(all.chunks_exact(2).map(|p| (p[0], p[1])).collect())
}

/// Pass 1 over a chunk: updates the moments, returns `(Σx², Σu²)` in f64.
///
/// The direction u goes to a chunk-sized scratch buffer (it stays in cache)
/// so that both loops are simple element-wise loops the compiler vectorises;
/// fusing the f64 norms into the moment loop kept it scalar (3.5× slower).
#[inline(always)]
fn accumulate<const INSIDE: bool>(
    moments: &Moments,
    wd: f32,
    x: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
) -> (f64, f64) {
    let mut u = vec![0.0f32; x.len()];
    for ((((u, &x), m), v), &g) in u.iter_mut().zip(x).zip(m).zip(v).zip(g) {
        moments.accumulate(m, v, g);
        *u = moments.direction::<INSIDE>(*m, *v, x, wd);
    }
    (chunk_sum_of_squares(x), chunk_sum_of_squares(&u))
}

/// Pass 2 over a chunk: `x -= (lr·c)·u`.
#[inline(always)]
fn apply<const INSIDE: bool>(
    moments: &Moments,
    scaled_lr: f32,
    wd: f32,
    x: &mut [f32],
    m: &[f32],
    v: &[f32],
) {
    for ((x, &m), &v) in x.iter_mut().zip(m).zip(v) {
        *x -= scaled_lr * moments.direction::<INSIDE>(m, v, *x, wd);
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
