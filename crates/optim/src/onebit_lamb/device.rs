//! 1-bit LAMB's steps on a cubecl device: the same stages as the host
//! steps in the parent module, each element-wise pass a kernel of
//! `terse_kernels::device::optim`, the per-segment scalars (trust
//! averages, momentum scales, variance ratios) on the host.

use std::time::{Duration, Instant};

use terse_kernels::device::optim;

use super::{OneBitLamb, RatioKind};
use crate::device_flat::allreduce_mean_device;
use crate::lamb::lamb_step_device;
use crate::moments::Moments;
use crate::step::StepContext;
use crate::{DeviceFlat, EpsMode, OptimError};

impl OneBitLamb {
    /// The warmup's LAMB step on the device, the running trust average, and
    /// the freeze when it comes.
    pub(super) fn warmup_step_device(
        &mut self,
        ctx: &StepContext<'_>,
        x: &DeviceFlat,
        g: &mut DeviceFlat,
    ) -> Result<Duration, OptimError> {
        let comm_time = allreduce_mean_device(ctx.comm, g)?;
        let lamb = self.lamb_config();
        let chunks = self.chunks.take().expect("built by step_device");
        let trusts = lamb_step_device(&lamb, ctx, &chunks, x, (&self.m, &self.v), g);
        self.average_trust(&trusts);
        let client = x.client();
        let v = self.v.handle();
        let v_l1 = || optim::sum_of_abs(client, &chunks, v).iter().sum();
        if self.freeze.ends_warmup(ctx.t, v_l1, ctx.lr_warmup) && !self.basic {
            optim::copy(client, v, self.v_fresh.handle(), ctx.layout.len());
            let squares = optim::sum_of_squares(client, &chunks, self.m.handle());
            self.set_scales(ctx.layout, &squares);
        }
        self.chunks = Some(chunks);
        Ok(comm_time)
    }

    /// The compression stage on the device: the same steps as
    /// [`OneBitLamb::compression_step`], the worker side of the compressed
    /// allreduce in device kernels.
    pub(super) fn compression_step_device(
        &mut self,
        ctx: &StepContext<'_>,
        x: &DeviceFlat,
        g: &DeviceFlat,
        t_w: u64,
    ) -> Result<Duration, OptimError> {
        let c = self.config.clone();
        let len = ctx.layout.len();
        let inv_one_minus_beta_1 = self.inv_one_minus_beta_1();
        let k: Vec<f32> = self.k.iter().map(|&k| k as f32).collect();
        let chunks = self.chunks.clone().expect("built by step_device");
        let client = x.client();
        let fresh = Moments::new(&c.moments, c.bias_correction, ctx.t).coefficients();
        if self.basic {
            optim::accumulate_momentum(client, &chunks, self.m.handle(), g.handle(), &fresh);
        } else {
            optim::copy(client, self.m.handle(), self.m_last.handle(), len);
            optim::scaled_momentum(client, &chunks, self.m.handle(), g.handle(), &fresh, &k);
        }
        let start = Instant::now();
        let (mean, result) = self.allreduce.allreduce_mean_device(
            ctx.comm,
            x,
            self.m.take_handle(),
            len,
            &mut self.errors,
        );
        self.m.put_handle(mean);
        let comm_time = start.elapsed();
        result?;
        let [m, v] = [&self.m, &self.v].map(crate::Flat::handle);

        let moments = Moments::frozen(&c.moments, c.bias_correction, ctx.t, t_w);
        let inside = c.moments.eps_mode.in_stage(true) == EpsMode::Inside;
        let lrs: Vec<f32> = if self.basic {
            // The masking happens in the update (m = 0 where v = 0).
            self.c_avg
                .iter()
                .map(|c_avg| (ctx.lr * c_avg) as f32)
                .collect()
        } else {
            optim::unscale_masked(client, &chunks, m, v, &k);
            let raw = optim::fresh_variance(
                client,
                &chunks,
                m,
                self.m_last.handle(),
                v,
                self.v_fresh.handle(),
                &moments.coefficients(),
                inv_one_minus_beta_1,
                inside,
                c.ratio == RatioKind::Variance,
            );
            self.clip_ratios(&raw)
                .iter()
                .zip(&self.c_avg)
                .map(|(r, c_avg)| (ctx.lr * r * c_avg) as f32)
                .collect()
        };
        optim::frozen_apply(
            client,
            &chunks,
            x.handle(),
            self.m.handle(),
            self.v.handle(),
            &moments.coefficients(),
            &lrs,
            inside,
        );
        Ok(comm_time)
    }
}
