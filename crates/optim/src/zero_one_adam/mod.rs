//! 0/1 Adam (ALGORITHMS.md "0/1 Adam"; Lu et al., ICLR 2023), as
//! DeepSpeed's `ZeroOneAdam.step()` runs it: a variance stage where v is
//! updated from the exactly averaged gradient on a doubling schedule and
//! m from the 1-bit compressed gradient in between, then local steps with
//! v frozen, each rank moving its own parameters and accumulating what it
//! applied, synchronised through the 1-bit allreduce of that accumulator
//! on a second doubling schedule.
//!
//! The accumulator is kept as the parameters of the last synchronisation,
//! `x_sync` (the applied updates are `x − x_sync`), rather than as
//! DeepSpeed's running sum: the parameters after a synchronisation are then
//! computed from `x_sync`, the same bits on every rank, and the state is no
//! larger than DeepSpeed's.

mod config;
pub(crate) mod schedule;

use std::time::Duration;

pub use config::ZeroOneAdamConfig;
use schedule::ZeroOneSchedule;

use crate::kept_out::{ErrorFeedback, KeptOutAllreduce};
use crate::moments::Moments;
use crate::pass::Direction;
use crate::pass::adam::adam;
use crate::pass::frozen::{accumulate_momentum, frozen_apply};
use crate::pass::sums::copy;
use crate::pass::zero_one_sync::{sync_apply, sync_scale};
use crate::span::SpanCache;
use crate::step::CommTime;
use crate::step::{FlatOptimizer, StepContext};
use crate::{Flat, FlatMut, OptimError, ParamLayout, Stage};

/// 0/1 Adam's state: the moments, the 1-bit allreduce's errors (of the
/// gradient in the variance stage, zeroed at the freeze, of the
/// accumulated updates after), the parameters of the last
/// synchronisation, the sum of the rates since, and the schedules.
pub struct ZeroOneAdam {
    config: ZeroOneAdamConfig,
    m: Flat,
    v: Flat,
    synced: Flat,
    allreduce: KeptOutAllreduce,
    errors: ErrorFeedback,
    schedule: ZeroOneSchedule,
    lr_sum: f64,
    spans: SpanCache,
    /// What the last step did (the schedule has moved on since).
    last_stage: Stage,
}

impl ZeroOneAdam {
    /// Zeroed state for `layout`'s parameters on `comm`'s rank; `name` is
    /// the config's, for errors.
    pub fn new(
        config: ZeroOneAdamConfig,
        name: &str,
        layout: &ParamLayout,
        comm: &dyn terse_comm::Communicator,
    ) -> Result<Self, OptimError> {
        let d = layout.len();
        let allreduce = KeptOutAllreduce::new(&config.allreduce, name, layout, comm)?;
        let schedule = ZeroOneSchedule::new(
            config.var_update_scaler,
            config.local_step_scaler,
            config.local_step_clipper,
        );
        Ok(Self {
            m: Flat::zeros(d),
            v: Flat::zeros(d),
            synced: Flat::zeros(d),
            errors: allreduce.zeroed_errors(),
            allreduce,
            schedule,
            lr_sum: 0.0,
            config,
            spans: SpanCache::default(),
            last_stage: Stage::Warmup,
        })
    }

    /// Step `t`'s moment constants with v updated `updates` times: with
    /// `bias_correction`, m̂ = m/(1−β1^t) and v̂ = v/(1−β2^updates) (v
    /// moves only on its schedule); without (DeepSpeed), both as they are.
    fn moments(&self, t: u64, updates: u64) -> Moments {
        Moments::frozen(
            &self.config.moments,
            self.config.bias_correction,
            t,
            updates,
        )
    }

    /// A variance-stage step: Adam on the exactly averaged gradient when v
    /// is due, otherwise m from the 1-bit compressed gradient and the
    /// update with the current v. After the last one the errors are zeroed
    /// (they switch from the gradient to the accumulated updates) and the
    /// parameters are the first synchronisation point.
    fn variance_step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        let due = self.schedule.variance_due(ctx.t);
        let updates = self.schedule.variance_updates() + u64::from(due);
        let moments = self.moments(ctx.t, updates);
        let c = &self.config;
        let span = self.spans.span(ctx, x, c.moments.weight_decay, false);
        let comm_time = if due {
            let comm_time = span.mean_gradient(ctx.comm, g)?;
            let d = direction(c, &moments);
            adam(&span, &d, ctx.lr as f32, x, (&mut self.m, &mut self.v), g);
            self.last_stage = Stage::Warmup;
            comm_time
        } else {
            let comm_time = self
                .allreduce
                .mean_of_whole(ctx.comm, g, &mut self.errors)?;
            accumulate_momentum(&span, &moments, &mut self.m, g);
            let rates = vec![ctx.lr as f32; ctx.layout.segments().len()];
            frozen_apply(
                &span,
                &direction(c, &moments),
                &rates,
                x,
                &mut self.m,
                &self.v,
                c.allreduce.hold_zero_variance,
            );
            self.last_stage = Stage::Compression;
            comm_time
        };
        self.schedule.after_variance_step(ctx.t);
        if ctx.t == c.var_freeze_step {
            self.errors = self.allreduce.zeroed_errors();
            copy(&span, x, &mut self.synced);
        }
        Ok(comm_time)
    }

    /// A local step: m from this rank's own gradient and the update with v
    /// frozen applied to this rank's parameters (the compression stage's
    /// passes), and a synchronisation when one is due.
    fn local_step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        let moments = self.moments(ctx.t, self.schedule.variance_updates());
        let c = &self.config;
        let span = self.spans.span(ctx, x, c.moments.weight_decay, false);
        accumulate_momentum(&span, &moments, &mut self.m, g);
        let d = direction(c, &moments);
        let rates = vec![ctx.lr as f32; ctx.layout.segments().len()];
        frozen_apply(
            &span,
            &d,
            &rates,
            x,
            &mut self.m,
            &self.v,
            c.allreduce.hold_zero_variance,
        );
        self.lr_sum += ctx.lr;
        let mut comm_time = Duration::ZERO;
        self.last_stage = Stage::Local;
        if self.schedule.sync_due(ctx.t) {
            comm_time = self.synchronise(ctx, x)?;
            self.last_stage = Stage::Compression;
        }
        self.schedule.after_local_step();
        Ok(comm_time)
    }

    /// The synchronisation that ends a run of local steps: the updates
    /// applied since the last one, `x − x_sync`, scaled by the denominator
    /// and 1-bit averaged over ranks (in x's buffer), m re-estimated from
    /// the mean and x moved by it from `x_sync` (the same bits on every
    /// rank afterwards).
    fn synchronise(&mut self, ctx: &StepContext, x: &mut FlatMut) -> CommTime {
        let moments = self.moments(ctx.t, self.schedule.variance_updates());
        let d = direction(&self.config, &moments);
        let span = self
            .spans
            .span(ctx, x, self.config.moments.weight_decay, false);
        sync_scale(&span, &d, x, (&self.synced, &self.v));
        let comm_time = self
            .allreduce
            .mean_of_whole(ctx.comm, x, &mut self.errors)?;
        // ū·denom/Σlr estimates m̂; m is stored uncorrected. Rates that sum
        // to zero moved nothing: m restarts from zero there (DeepSpeed
        // divides by the zero).
        let lr_sum = if self.lr_sum > 0.0 {
            (self.lr_sum * moments.inv_bias_1()) as f32
        } else {
            f32::INFINITY
        };
        let state = (&mut self.synced, &mut self.m, &self.v);
        sync_apply(
            &span,
            &d,
            lr_sum,
            x,
            state,
            self.config.allreduce.hold_zero_variance,
        );
        self.lr_sum = 0.0;
        Ok(comm_time)
    }
}

/// Adam's direction with this config's ε placement and decay.
fn direction<'a>(c: &ZeroOneAdamConfig, moments: &'a Moments) -> Direction<'a> {
    Direction {
        moments,
        eps_mode: c.moments.eps_mode,
        weight_decay: c.moments.weight_decay as f32,
    }
}

impl FlatOptimizer for ZeroOneAdam {
    fn step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        if ctx.t <= self.config.var_freeze_step {
            self.variance_step(ctx, x, g)
        } else {
            self.local_step(ctx, x, g)
        }
    }

    fn state(&mut self) -> Vec<(&'static str, &mut Flat)> {
        vec![
            ("m", &mut self.m),
            ("v", &mut self.v),
            ("synced_params", &mut self.synced),
            ("worker_error", &mut self.errors.worker),
            ("server_error", &mut self.errors.server),
        ]
    }

    fn scalars(&self) -> Vec<(&'static str, Vec<f64>)> {
        vec![
            ("schedule", self.schedule.counters()),
            ("lr_sum", vec![self.lr_sum]),
        ]
    }

    fn set_scalars(&mut self, role: &str, values: Vec<f64>) -> Result<(), String> {
        match (role, values.as_slice()) {
            ("schedule", values) => self.schedule.restore(values),
            ("lr_sum", &[sum]) if sum >= 0.0 && sum.is_finite() => {
                self.lr_sum = sum;
                Ok(())
            }
            ("lr_sum", other) => Err(format!("lr_sum {other:?}")),
            _ => Err(format!("unknown scalar state `{role}`")),
        }
    }

    /// The kind of the last step taken (its schedule has moved on since);
    /// a resumed run reports `warmup` until it takes a step.
    fn stage(&self, t: u64) -> Stage {
        let _ = t;
        self.last_stage
    }

    /// Between synchronisations each rank holds its own parameters.
    fn params_replicated(&self) -> bool {
        false
    }

    /// Synchronises the local steps taken since the last synchronisation,
    /// so that a run ends with the same parameters on every rank.
    fn finish(&mut self, ctx: &StepContext, x: &mut FlatMut) -> CommTime {
        let t = ctx.t;
        if t <= self.config.var_freeze_step || self.lr_sum == 0.0 {
            return Ok(Duration::ZERO);
        }
        self.synchronise(ctx, x)
    }
}
