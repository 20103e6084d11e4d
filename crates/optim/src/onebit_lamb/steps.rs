//! 1-bit LAMB's two stages, written once over the passes (host or device):
//! the warmup is LAMB with a running average of each segment's trust
//! coefficient, ending in the freeze; the compression stage (§A.5) scales
//! the momentum per segment, compresses it, and adapts the frozen
//! coefficient through the fresh variance's ratio.

use std::time::Instant;

use super::{OneBitLamb, RatioKind};
use crate::FlatMut;
use crate::lamb::lamb_update;
use crate::moments::Moments;
use crate::pass::Direction;
use crate::pass::fresh_variance::{FreshVariance, fresh_ratios, scaled_momentum, update_norms};
use crate::pass::frozen::{accumulate_momentum, frozen_apply};
use crate::pass::sums::{copy, segment_squared_norms, sum_of_abs};
use crate::step::CommTime;
use crate::step::{FlatOptimizer, StepContext};

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
        let mut comm_time = span.mean_gradient(ctx.comm, g)?;
        let (trusts, time) = lamb_update(&lamb, ctx, &span, x, (&mut self.m, &mut self.v), g)?;
        comm_time += time + span.share_back(ctx.comm, &mut [x])?;
        self.partial |= span.is_split();
        self.segments
            .average_trust(self.config.beta_3, &trusts.read());
        let v = &self.v;
        let ends = self
            .freeze
            .ends_warmup(ctx.t, || sum_of_abs(&span, v), ctx.lr_warmup);
        if ends {
            // The compression stage reads m and v whole on every rank.
            self.sync_state(ctx.comm)?;
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
        let rates: Vec<f32> = if self.basic {
            // The masking happens in the update (m = 0 where v = 0).
            let c_avg = &self.segments.c_avg;
            c_avg.iter().map(|c_avg| (ctx.lr * c_avg) as f32).collect()
        } else {
            let f = FreshVariance {
                moments: &moments,
                eps_mode,
                beta_1: c.moments.beta_1,
                beta_2: c.moments.beta_2,
                eps: c.moments.eps,
                variance: c.ratio == RatioKind::Variance,
                k: &self.segments.k,
                hold: c.allreduce.hold_zero_variance,
            };
            let (m, v, v_fresh) = (&mut self.m, &self.v, &mut self.v_fresh);
            let partials = fresh_ratios(&span, &f, m, &self.m_last, v, v_fresh);
            let (raw, time) = span.per_segment(ctx.comm, partials, 0.0f32, f32::max)?;
            comm_time += time;
            self.partial |= span.is_split();
            let mut raw: Vec<f64> = raw.into_iter().map(f64::from).collect();
            if c.decay_blend && c.moments.weight_decay > 0.0 {
                let partials = update_norms(&span, &direction, &self.m, &self.v, x);
                let add = |a: [f64; 2], b: [f64; 2]| [a[0] + b[0], a[1] + b[1]];
                let (norms, time) = span.per_segment(ctx.comm, partials, [0.0; 2], add)?;
                comm_time += time;
                let segments = ctx.layout.segments();
                for ((r, [prelim, update]), segment) in raw.iter_mut().zip(norms).zip(segments) {
                    if segment.decay && update > 0.0 {
                        let share = (prelim / update).sqrt().min(1.0);
                        *r = *r * share + (1.0 - share);
                    }
                }
            }
            let ratios = self.segments.clip_ratios(c, &raw);
            let c_avg = &self.segments.c_avg;
            ratios
                .iter()
                .zip(c_avg)
                .map(|(r, c_avg)| (ctx.lr * r * c_avg) as f32)
                .collect()
        };
        let hold = c.allreduce.hold_zero_variance;
        frozen_apply(&span, &direction, &rates, x, &mut self.m, &self.v, hold);
        comm_time += span.share_back(ctx.comm, &mut [&mut self.m, x])?;
        Ok(comm_time)
    }
}
