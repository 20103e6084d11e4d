//! 1-bit Adam (ALGORITHMS.md "1-bit Adam"; Tang et al., Algorithm 1) and its
//! two ablation baselines: Adam with an fp32 gradient allreduce until the
//! freeze step, then v frozen and only the momentum synchronised, 1-bit
//! compressed with two-level error feedback (one fused buffer for all
//! segments).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use terse_comm::ReduceOp;

use crate::adam::{adam_step, adam_step_device, adam_step_sharded};
use crate::config_check::NoOtherFields;
use crate::device_flat::{allreduce_mean_device, chunk_table, mean_over_ranks};
use crate::freeze::FreezePoint;
use crate::kept_out::{ErrorFeedback, KeptOutAllreduce};
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{CHUNK, with_avx};
use crate::shard::{Shard, Unit, gather_partial_state, unit_slices, unit_slices_mut};
use crate::step::{FlatOptimizer, StepContext, allreduce_mean_gradient};
use crate::{
    AdamConfig, CompressionConfig, DeviceFlat, EpsMode, Flat, MomentConfig, OptimError,
    ParamLayout, Stage, WithCompression, WithMoments,
};
use terse_kernels::device::optim::DeviceChunks;

/// `onebit_adam`, `onebit_adam_fp32` and `adam_onebit_naive` (the naive
/// baseline ignores the freeze fields: it compresses from step 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OneBitAdamConfig {
    /// β1, β2, ε, its placement (`inside_compressed`: the Tarasov–Ershov
    /// fix, from the compression stage on) and the weight decay.
    #[serde(flatten)]
    pub moments: MomentConfig,
    /// Bias correction (off: the papers' "BertAdam").
    pub bias_correction: bool,
    /// Scales, parameters kept out of compression, the freeze.
    #[serde(flatten)]
    pub compression: CompressionConfig,
    /// Refuses keys no field claims (must stay last).
    #[serde(flatten, skip_serializing)]
    pub no_other_fields: NoOtherFields,
}

impl Default for OneBitAdamConfig {
    fn default() -> Self {
        Self {
            moments: MomentConfig::default(),
            bias_correction: false,
            compression: CompressionConfig::default(),
            no_other_fields: NoOtherFields,
        }
    }
}

impl OneBitAdamConfig {
    pub(crate) fn validate(&self, name: &str) -> Result<(), OptimError> {
        self.moments.validate(name)?;
        self.compression.validate(name)
    }
}

impl WithMoments for OneBitAdamConfig {
    fn moments_mut(&mut self) -> &mut MomentConfig {
        &mut self.moments
    }
}

impl WithCompression for OneBitAdamConfig {
    fn compression_mut(&mut self) -> &mut CompressionConfig {
        &mut self.compression
    }
}

/// Which member of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdamVariant {
    /// `onebit_adam`.
    OneBit,
    /// `onebit_adam_fp32`: the momentum allreduced uncompressed after the freeze.
    Fp32Momentum,
    /// `adam_onebit_naive`: Adam on the 1-bit compressed gradient from step 1.
    Naive,
}

/// The state of the family: m, v (frozen after `T_w`), the compressed
/// allreduce's two errors and the freeze decision.
pub struct OneBitAdam {
    config: OneBitAdamConfig,
    variant: AdamVariant,
    m: Flat,
    v: Flat,
    allreduce: KeptOutAllreduce,
    errors: ErrorFeedback,
    freeze: FreezePoint,
    /// The device kernels' chunk table (device runs).
    chunks: Option<DeviceChunks>,
    /// The split of warmup steps between ranks that share cores.
    shard: Option<Arc<Shard>>,
    /// m and v are current only in this rank's part of `shard`.
    partial: bool,
}

impl OneBitAdam {
    /// Zeroed state for `layout`'s parameters on `comm`'s rank; `name` is
    /// the config's, for errors.
    pub fn new(
        config: OneBitAdamConfig,
        name: &str,
        variant: AdamVariant,
        layout: &ParamLayout,
        comm: &dyn terse_comm::Communicator,
    ) -> Result<Self, OptimError> {
        let d = layout.len();
        let allreduce = KeptOutAllreduce::new(
            &config.compression.uncompressed,
            format!("{name}.uncompressed"),
            layout,
            comm,
            config.compression.options(),
        )?;
        let freeze = FreezePoint::new(&config.compression, config.moments.beta_2);
        Ok(Self {
            m: Flat::zeros(d),
            v: Flat::zeros(d),
            errors: allreduce.zeroed_errors(),
            allreduce,
            freeze,
            config,
            variant,
            chunks: None,
            shard: None,
            partial: false,
        })
    }

    /// Adam on an already synchronised gradient `g`; `compressing` picks
    /// the ε placement of `inside_compressed` (the naive baseline compresses
    /// from step 1).
    fn adam_step(&mut self, ctx: &StepContext<'_>, x: &mut [f32], g: &[f32], compressing: bool) {
        let adam = self.adam_config(compressing);
        adam_step(&adam, ctx, x, self.m.host_mut(), self.v.host_mut(), g);
    }

    /// The Adam of this config's warmup (or compression stage).
    fn adam_config(&self, compressing: bool) -> AdamConfig {
        let c = &self.config;
        AdamConfig {
            moments: MomentConfig {
                eps_mode: c.moments.eps_mode.in_stage(compressing),
                ..c.moments.clone()
            },
            bias_correction: c.bias_correction,
            no_other_fields: NoOtherFields,
        }
    }

    /// The compression stage's update of `units` from the synchronised m
    /// and frozen v.
    fn frozen_step(&self, ctx: &StepContext<'_>, x: &mut [f32], t_w: u64, units: &[Unit]) {
        let c = &self.config;
        let moments = Moments::frozen(&c.moments, c.bias_correction, ctx.t, t_w);
        let lrs = vec![ctx.lr; ctx.layout.segments().len()];
        let update = FrozenUpdate {
            moments: &moments,
            eps_mode: c.moments.eps_mode.in_stage(true),
            weight_decay: c.moments.weight_decay,
        };
        update.apply(ctx.layout, units, &lrs, x, self.m.host(), self.v.host());
    }
}

/// The compression stage's parameter update with v frozen.
pub(crate) struct FrozenUpdate<'a> {
    pub(crate) moments: &'a Moments,
    pub(crate) eps_mode: crate::EpsMode,
    pub(crate) weight_decay: f64,
}

impl FrozenUpdate<'_> {
    /// `x -= lr_p·(m̂/denom(v̂) + wd·x)` with one rate per segment, except
    /// where the frozen `v` is exactly zero.
    ///
    /// A coordinate whose variance is exactly zero at the freeze has had a
    /// zero gradient on every rank at every warmup step (an embedding row no
    /// token used, a position beyond the sequence length, padding): the
    /// compressed momentum would hand it ±scale (sign(0) = +1) and an update
    /// of lr·scale/ε. Such coordinates are masked, as DeepSpeed's
    /// `exp_avg_mask` does, and do not move at all (no decay either) for the
    /// rest of the run. The mask is `v == 0` of the frozen v, so it is saved
    /// with v in every checkpoint and needs no state of its own.
    ///
    /// Applied to `units` only (consecutive chunks: all of them, or one
    /// rank's when ranks that share cores split the step).
    pub(crate) fn apply(
        &self,
        layout: &ParamLayout,
        units: &[Unit],
        lrs: &[f64],
        x: &mut [f32],
        m: &[f32],
        v: &[f32],
    ) {
        let moments = self.moments;
        let segments = layout.segments();
        with_eps_mode!(self.eps_mode, INSIDE => {
            units
                .par_iter()
                .zip(unit_slices_mut(x, units))
                .zip(unit_slices(m, units))
                .zip(unit_slices(v, units))
                .for_each(|(((unit, x), m), v)| {
                    let lr = lrs[unit.segment] as f32;
                    let decay = segments[unit.segment].decay;
                    let wd = if decay { self.weight_decay as f32 } else { 0.0 };
                    with_avx(|| {
                        for ((x, &m), &v) in x.iter_mut().zip(m).zip(v) {
                            let step = lr * moments.direction::<INSIDE>(m, v, *x, wd);
                            *x -= if v > 0.0 { step } else { 0.0 };
                        }
                    })
                })
        });
    }
}

/// Zeroes the momentum where the frozen variance is exactly zero (see
/// [`FrozenUpdate::apply`]), after the compressed allreduce gave those
/// coordinates the chunk's ±scale: the masked momentum stays zero instead of
/// carrying the scale into the next steps.
pub(crate) fn mask_momentum(m: &mut [f32], v: &[f32]) {
    m.par_chunks_mut(CHUNK)
        .zip(v.par_chunks(CHUNK))
        .for_each(|(m, v)| {
            for (m, &v) in m.iter_mut().zip(v) {
                if v == 0.0 {
                    *m = 0.0;
                }
            }
        });
}

/// `m = β1·m + (1-β1)·g` over the whole buffer.
pub(crate) fn accumulate_momentum(beta_1: f64, m: &mut [f32], g: &[f32]) {
    let (b1, one_minus) = (beta_1 as f32, (1.0 - beta_1) as f32);
    m.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .for_each(|(m, g)| {
            with_avx(|| {
                for (m, &g) in m.iter_mut().zip(g) {
                    *m = b1 * *m + one_minus * g;
                }
            })
        });
}

/// `Σ|v|` in f64, in chunk order (deterministic).
pub(crate) fn l1_norm(v: &[f32]) -> f64 {
    let partials: Vec<f64> = v
        .par_chunks(CHUNK)
        .map(|c| c.iter().map(|&x| f64::from(x.abs())).sum::<f64>())
        .collect();
    partials.into_iter().sum()
}

impl FlatOptimizer for OneBitAdam {
    fn step(
        &mut self,
        ctx: &StepContext<'_>,
        x: &mut [f32],
        g: &mut [f32],
    ) -> Result<Duration, OptimError> {
        if self.variant == AdamVariant::Naive {
            let start = Instant::now();
            self.allreduce
                .allreduce_mean(ctx.comm, g, &mut self.errors)?;
            let comm_time = start.elapsed();
            self.adam_step(ctx, x, g, true);
            return Ok(comm_time);
        }
        match self.freeze.step() {
            Some(t_w) if ctx.t > t_w => {
                accumulate_momentum(self.config.moments.beta_1, self.m.host_mut(), g);
                // Ranks that share cores split the update (m is the same on
                // every rank after the allreduce, which each of them
                // dequantises only in its own part), then share m and x back.
                let shard = Shard::for_step(&mut self.shard, ctx);
                let range = shard.my_range();
                let start = Instant::now();
                match self.variant {
                    AdamVariant::Fp32Momentum => {
                        ctx.comm.allreduce_f32(self.m.host_mut(), ReduceOp::Mean)?
                    }
                    _ => self.allreduce.allreduce_mean_part(
                        ctx.comm,
                        self.m.host_mut(),
                        &mut self.errors,
                        range.clone(),
                    )?,
                }
                let mut comm_time = start.elapsed();
                mask_momentum(&mut self.m.host_mut()[range.clone()], &self.v.host()[range]);
                self.frozen_step(ctx, x, t_w, shard.mine());
                comm_time += shard.share_parts(ctx.comm, &mut [self.m.host_mut(), x])?;
                Ok(comm_time)
            }
            _ => {
                // Split between ranks that share cores, unless the freeze
                // step is found from the whole v after each step.
                let adam = self.adam_config(false);
                let shard = match self.freeze.is_auto() {
                    true => None,
                    false => Some(Shard::for_step(&mut self.shard, ctx)),
                };
                let comm_time = match shard.filter(|s| s.is_split()) {
                    Some(shard) => {
                        self.partial = true;
                        let (m, v) = (self.m.host_mut(), self.v.host_mut());
                        adam_step_sharded(&adam, ctx, &shard, x, m, v, g)?
                    }
                    None => {
                        let comm_time = allreduce_mean_gradient(ctx.comm, g)?;
                        self.adam_step(ctx, x, g, false);
                        comm_time
                    }
                };
                let v = self.v.host();
                if self.freeze.ends_warmup(ctx.t, || l1_norm(v), ctx.lr_warmup) {
                    // The compression stage reads m and v whole.
                    self.sync_state(ctx.comm)?;
                }
                Ok(comm_time)
            }
        }
    }

    fn state(&mut self) -> Vec<(&'static str, &mut Flat)> {
        vec![
            ("m", &mut self.m),
            ("v", &mut self.v),
            ("worker_error", &mut self.errors.worker),
            ("server_error", &mut self.errors.server),
        ]
    }

    fn state_loaded(&mut self) {
        self.partial = false;
    }

    fn state_is_partial(&self) -> bool {
        self.partial
    }

    fn sync_state(&mut self, comm: &dyn terse_comm::Communicator) -> Result<(), OptimError> {
        let buffers: &mut [&mut [f32]] = &mut [self.m.host_mut(), self.v.host_mut()];
        gather_partial_state(comm, self.shard.as_deref(), &mut self.partial, buffers)
    }

    fn scalars(&self) -> Vec<(&'static str, Vec<f64>)> {
        self.freeze.scalars()
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
        use terse_kernels::device::optim;
        let (warmup_adam, naive_adam) = (self.adam_config(false), self.adam_config(true));
        let c = &self.config;
        let chunks = chunk_table(&mut self.chunks, x, ctx.layout, c.moments.weight_decay);
        let client = x.client();
        let len = ctx.layout.len();
        if self.variant == AdamVariant::Naive {
            let start = Instant::now();
            let buf = g.swap_handle(client.empty(size_of::<f32>()));
            let (buf, result) =
                self.allreduce
                    .allreduce_mean_device(ctx.comm, x, buf, len, &mut self.errors);
            g.swap_handle(buf);
            result?;
            let comm_time = start.elapsed();
            adam_step_device(&naive_adam, ctx, chunks, x, &self.m, &self.v, g);
            return Ok(comm_time);
        }
        match self.freeze.step() {
            Some(t_w) if ctx.t > t_w => {
                let fresh = Moments::new(&c.moments, c.bias_correction, ctx.t);
                let m = &mut self.m;
                optim::accumulate_momentum(
                    client,
                    chunks,
                    m.handle(),
                    g.handle(),
                    &fresh.coefficients(),
                );
                let start = Instant::now();
                if self.variant == AdamVariant::Fp32Momentum {
                    if let Some(mean) = mean_over_ranks(ctx.comm, client, m.handle(), len)? {
                        m.put_handle(mean);
                    }
                } else {
                    let (mean, result) = self.allreduce.allreduce_mean_device(
                        ctx.comm,
                        x,
                        m.take_handle(),
                        len,
                        &mut self.errors,
                    );
                    m.put_handle(mean);
                    result?;
                }
                let comm_time = start.elapsed();
                let moments = Moments::frozen(&c.moments, c.bias_correction, ctx.t, t_w);
                let rates = vec![ctx.lr as f32; ctx.layout.segments().len()];
                optim::frozen_apply(
                    client,
                    chunks,
                    x.handle(),
                    m.handle(),
                    self.v.handle(),
                    &moments.coefficients(),
                    &rates,
                    c.moments.eps_mode.in_stage(true) == EpsMode::Inside,
                );
                Ok(comm_time)
            }
            _ => {
                let comm_time = allreduce_mean_device(ctx.comm, g)?;
                adam_step_device(&warmup_adam, ctx, chunks, x, &self.m, &self.v, g);
                let v = self.v.handle();
                let v_l1 = || optim::sum_of_abs(client, chunks, v).iter().sum();
                self.freeze.ends_warmup(ctx.t, v_l1, ctx.lr_warmup);
                Ok(comm_time)
            }
        }
    }

    fn set_scalars(&mut self, role: &str, values: Vec<f64>) -> Result<(), String> {
        self.freeze.set_scalars(role, values)
    }

    fn stage(&self, t: u64) -> Stage {
        match self.variant {
            AdamVariant::Naive => Stage::Compression,
            _ => self.freeze.stage(t),
        }
    }
}
