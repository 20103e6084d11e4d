//! 1-bit LAMB's two stages, written once over the passes (host or device):
//! the warmup is LAMB with a running average of each segment's trust
//! coefficient, ending in the freeze; the compression stage (§A.5) scales
//! the momentum per segment, compresses it, and adapts the frozen
//! coefficient through the fresh variance's ratio.

use std::time::{Duration, Instant};

use terse_kernels::device::optim::VarianceRatioRule;

use super::scalars::SegmentScalars;
use super::{OneBitLamb, OneBitLambConfig, RatioKind};
use crate::lamb::lamb_update;
use crate::moments::Moments;
use crate::pass::Direction;
use crate::pass::fresh_variance::{
    FreshVariance, device_fresh_update, fresh_ratios, scaled_momentum, update_norms,
};
use crate::pass::frozen::{accumulate_momentum, frozen_apply};
use crate::pass::lamb::Trusts;
use crate::pass::sums::{copy, segment_squared_norms, sum_of_abs};
use crate::span::Span;
use crate::step::CommTime;
use crate::step::{FlatOptimizer, StepContext};
use crate::{EpsMode, Flat, FlatMut, OptimError};

impl OneBitLamb {
    /// LAMB on the averaged gradient, the running trust average, and the
    /// freeze when it comes: v freezes (it is never updated again),
    /// v_fresh starts from it, and the momentum scales are taken from m
    /// (§A.5.2). Split between ranks that share cores, unless the freeze
    /// step is found from the whole v after each step.
    pub(super) fn warmup_step(
        &mut self,
        ctx: &StepContext,
        x: &mut FlatMut,
        g: &mut FlatMut,
    ) -> CommTime {
        let lamb = self.lamb_config();
        let (wd, splittable) = (lamb.moments.weight_decay, !self.freeze.is_auto());
        let span = self.spans.span(ctx, x, wd, splittable);
        self.segments.follow(x.device());
        let mut comm_time = span.mean_gradient(ctx.comm, g)?;
        let (trusts, time) = lamb_update(&lamb, ctx, &span, x, (&mut self.m, &mut self.v), g)?;
        comm_time += time + span.share_back(ctx.comm, &mut [x])?;
        self.partial |= span.is_split();
        let beta_3 = self.config.beta_3;
        match trusts {
            // A device's average stays there: the step reads nothing.
            Trusts::Queued(queued) => queued.average_into(self.segments.on_device(), beta_3 as f32),
            ready => self.segments.average_trust(beta_3, &ready.read()),
        }
        let v = &self.v;
        let ends = self
            .freeze
            .ends_warmup(ctx.t, || sum_of_abs(&span, v), ctx.lr_warmup);
        if ends {
            // The compression stage reads m and v whole on every rank. The
            // freeze sets the scales and ratios on the host, and the basic
            // ablation's compression stage reads c_avg there: a device's
            // average is read back once, here.
            self.sync_state(ctx.comm)?;
            self.segments.follow(None);
            if !self.basic {
                // The same span again (the shard kept as it is): the
                // freeze's passes read whole buffers either way.
                let span = self.spans.span(ctx, x, wd, splittable);
                copy(&span, &self.v, &mut self.v_fresh);
                let squares = segment_squared_norms(&span, &self.m);
                self.segments.set_scales(ctx.layout, &squares);
            }
        }
        Ok(comm_time)
    }

    /// The compression stage: the momentum (scaled per segment, but in the
    /// basic ablation) synchronised 1-bit, then unscaled and masked where
    /// the frozen v is zero, the fresh variance and its ratio to the frozen
    /// one, and the update with v frozen at the end of step `t_w`. Ranks
    /// that share cores split what follows the allreduce (m is the same on
    /// every rank then): each masks, unscales and updates its own chunks,
    /// and m and x are shared back for the next step.
    pub(super) fn compression_step(
        &mut self,
        ctx: &StepContext,
        x: &mut FlatMut,
        g: &mut FlatMut,
        t_w: u64,
    ) -> CommTime {
        let c = &self.config;
        let span = self.spans.span(ctx, x, c.moments.weight_decay, true);
        let fresh = Moments::new(&c.moments, c.bias_correction, ctx.t);
        if self.basic {
            accumulate_momentum(&span, &fresh, &mut self.m, g);
        } else {
            let (m, m_last) = (&mut self.m, &mut self.m_last);
            scaled_momentum(
                &span,
                &fresh,
                c.moments.beta_1,
                &self.segments.k,
                (m, m_last),
                g,
            );
        }
        let start = Instant::now();
        let like = x.device();
        self.allreduce
            .mean_of(ctx.comm, &span, like, &mut self.m, &mut self.errors)?;
        let mut comm_time = start.elapsed();
        let moments = Moments::frozen(&c.moments, c.bias_correction, ctx.t, t_w);
        let eps_mode = c.moments.eps_mode.in_stage(true);
        let direction = Direction {
            moments: &moments,
            eps_mode,
            weight_decay: c.moments.weight_decay as f32,
        };
        let hold = c.allreduce.hold_zero_variance;
        // The ratio's decay blend takes host norms: its ratios are clipped
        // on the host.
        let device = x.device().filter(|_| !self.basic && !c.blends_decay());
        self.segments.follow(device);
        if device.is_some() {
            let rule = VarianceRatioRule {
                lr: ctx.lr as f32,
                r_min: c.r_min as f32,
                r_max: c.r_max as f32,
                r_threshold: c.r_threshold as f32,
            };
            let f = Self::fresh_variance(c, &self.segments.k, &moments, eps_mode);
            let state = (&mut self.m, &self.m_last, &self.v, &mut self.v_fresh);
            device_fresh_update(&span, &f, &rule, x, state, self.segments.on_device());
        } else {
            let (rates, time) = if self.basic {
                // The masking happens in the update (m = 0 where v = 0).
                let c_avg = self.segments.c_avg();
                let rates = c_avg.iter().map(|c_avg| (ctx.lr * c_avg) as f32);
                (rates.collect(), Duration::ZERO)
            } else {
                self.partial |= span.is_split();
                let state = (&mut self.m, &self.m_last, &self.v, &mut self.v_fresh);
                let segments = &mut self.segments;
                host_rates(ctx, &span, &direction, x, &self.config, segments, state)?
            };
            comm_time += time;
            frozen_apply(&span, &direction, &rates, x, &mut self.m, &self.v, hold);
        }
        comm_time += span.share_back(ctx.comm, &mut [&mut self.m, x])?;
        Ok(comm_time)
    }

    /// The fresh variance's constants for this step (of `c` and the
    /// momentum scales `k`: fields, so the state stays free to borrow).
    fn fresh_variance<'a>(
        c: &'a OneBitLambConfig,
        k: &'a [f64],
        moments: &'a Moments,
        eps_mode: EpsMode,
    ) -> FreshVariance<'a> {
        FreshVariance {
            moments,
            eps_mode,
            beta_1: c.moments.beta_1,
            beta_2: c.moments.beta_2,
            eps: c.moments.eps,
            variance: c.ratio == RatioKind::Variance,
            k,
            hold: c.allreduce.hold_zero_variance,
        }
    }
}

/// The compression stage's rates `lr·r·c_avg` per segment on the host
/// (of `c`, 1-bit LAMB's config), where the fresh variance is updated and
/// its ratios clipped (and blended) against `segments`' last ones; the time
/// spent gathering a split step's ratios is returned.
fn host_rates(
    ctx: &StepContext,
    span: &Span<'_>,
    direction: &Direction<'_>,
    x: &FlatMut,
    c: &OneBitLambConfig,
    segments: &mut SegmentScalars,
    (m, m_last, v, v_fresh): (&mut Flat, &Flat, &Flat, &mut Flat),
) -> Result<(Vec<f32>, Duration), OptimError> {
    let f = OneBitLamb::fresh_variance(c, &segments.k, direction.moments, direction.eps_mode);
    let partials = fresh_ratios(span, &f, m, m_last, v, v_fresh);
    let (raw, mut comm_time) = span.per_segment(ctx.comm, partials, 0.0f32, f32::max)?;
    let mut raw: Vec<f64> = raw.into_iter().map(f64::from).collect();
    if c.blends_decay() {
        let partials = update_norms(span, direction, m, v, x);
        let add = |a: [f64; 2], b: [f64; 2]| [a[0] + b[0], a[1] + b[1]];
        let (norms, time) = span.per_segment(ctx.comm, partials, [0.0; 2], add)?;
        comm_time += time;
        let layout = ctx.layout.segments();
        for ((r, [prelim, update]), segment) in raw.iter_mut().zip(norms).zip(layout) {
            if segment.decay && update > 0.0 {
                let share = (prelim / update).sqrt().min(1.0);
                *r = *r * share + (1.0 - share);
            }
        }
    }
    let ratios = segments.clip_ratios(c, &raw);
    let rates = ratios
        .iter()
        .zip(segments.c_avg())
        .map(|(r, c_avg)| (ctx.lr * r * c_avg) as f32)
        .collect();
    Ok((rates, comm_time))
}
