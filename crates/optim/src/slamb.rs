//! SLAMB (ALGORITHMS.md "SLAMB"; Xu et al., Algorithm 1 with Appendix E):
//! every step only a masked subset of the momentum is averaged (the mask is a
//! function of the seed and the step, so no indices travel); elements not
//! synchronised recently are stepped with a smaller rate and their own trust
//! ratio, and the parameters are averaged every H steps.

use std::ops::Range;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use terse_comm::{ReduceOp, SparseAllreduce};

use crate::lamb::trust_coefficient;
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{CHUNK, split_segments, split_segments_mut, with_avx};
use crate::{FlatOptimizer, OptimError, ParamLayout, SlambConfig, Stage, StepContext};

/// SLAMB's state: local m and v, the per-element freshness c, and the
/// per-step selection flags (scratch).
pub struct Slamb {
    config: SlambConfig,
    m: Vec<f32>,
    v: Vec<f32>,
    /// Freshness: 1 where synchronised this step, decaying by β3 otherwise.
    /// Starts at 1: every rank starts from the same parameters.
    freshness: Vec<f32>,
    selected: Vec<u8>,
    sparse: SparseAllreduce,
    world_size: usize,
}

impl Slamb {
    /// Zeroed moments for `layout`, on `comm`'s world.
    pub fn new(
        config: SlambConfig,
        layout: &ParamLayout,
        comm: &dyn terse_comm::Communicator,
    ) -> Self {
        let d = layout.len();
        let always: Vec<Range<usize>> = layout
            .segments()
            .iter()
            .filter(|s| s.len < config.always_sync_below)
            .map(|s| s.range())
            .collect();
        Self {
            sparse: SparseAllreduce::with_precision(config.mask(d), always, config.values),
            m: vec![0.0; d],
            v: vec![0.0; d],
            freshness: vec![1.0; d],
            selected: vec![0; d],
            world_size: comm.world_size(),
            config,
        }
    }
}

/// Per-chunk sums of squares split by selection: (x·M, u·M, x·¬M, u·¬M),
/// and the number of unselected elements.
#[derive(Debug, Clone, Copy, Default)]
struct Norms {
    x_sel: f64,
    u_sel: f64,
    x_rest: f64,
    u_rest: f64,
    selected: usize,
    rest: usize,
}

impl Norms {
    fn add(self, o: Norms) -> Norms {
        Norms {
            x_sel: self.x_sel + o.x_sel,
            u_sel: self.u_sel + o.u_sel,
            x_rest: self.x_rest + o.x_rest,
            u_rest: self.u_rest + o.u_rest,
            selected: self.selected + o.selected,
            rest: self.rest + o.rest,
        }
    }
}

impl FlatOptimizer for Slamb {
    fn step(
        &mut self,
        ctx: &StepContext<'_>,
        x: &mut [f32],
        g: &mut [f32],
    ) -> Result<Duration, OptimError> {
        let c = self.config.clone();
        let moments = Moments::new(c.beta_1, c.beta_2, c.eps, c.bias_correction, ctx.t);
        self.m
            .par_chunks_mut(CHUNK)
            .zip(self.v.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|((m, v), g)| {
                with_avx(|| {
                    for ((m, v), &g) in m.iter_mut().zip(v).zip(g) {
                        moments.accumulate(m, v, g);
                    }
                })
            });
        let start = Instant::now();
        let selection = self.sparse.allreduce_mean(ctx.comm, ctx.t, &mut self.m)?;
        let mut comm_time = start.elapsed();
        self.selected.fill(0);
        for j in selection.indices() {
            self.selected[j] = 1;
        }
        let beta_3 = c.beta_3 as f32;
        self.freshness
            .par_chunks_mut(CHUNK)
            .zip(self.selected.par_chunks(CHUNK))
            .for_each(|(f, s)| {
                for (f, &s) in f.iter_mut().zip(s) {
                    *f = if s == 1 { 1.0 } else { beta_3 * *f };
                }
            });

        let lr = ctx.lr;
        let stale_lr = lr / (self.world_size as f64).sqrt();
        let weight_decay = c.weight_decay as f32;
        let layout = ctx.layout;
        let xs = split_segments_mut(layout, x);
        let ms = split_segments(layout, &self.m);
        let vs = split_segments(layout, &self.v);
        let fs = split_segments(layout, &self.freshness);
        let ss = split_segments(layout, &self.selected);
        with_eps_mode!(c.eps_mode, INSIDE => {
            layout.segments().par_iter().zip(xs).zip(ms).zip(vs).zip(fs).zip(ss).for_each(
                |(((((segment, x), m), v), f), s)| {
                    let wd = if segment.decay { weight_decay } else { 0.0 };
                    let norms = x
                        .par_chunks(CHUNK)
                        .zip(m.par_chunks(CHUNK))
                        .zip(v.par_chunks(CHUNK))
                        .zip(s.par_chunks(CHUNK))
                        .map(|(((x, m), v), s)| {
                            let mut n = Norms::default();
                            for (((&x, &m), &v), &s) in x.iter().zip(m).zip(v).zip(s) {
                                let u = f64::from(moments.direction::<INSIDE>(m, v, x, wd));
                                let x = f64::from(x);
                                if s == 1 {
                                    n.x_sel += x * x;
                                    n.u_sel += u * u;
                                    n.selected += 1;
                                } else {
                                    n.x_rest += x * x;
                                    n.u_rest += u * u;
                                    n.rest += 1;
                                }
                            }
                            n
                        })
                        .collect::<Vec<_>>()
                        .into_iter()
                        .fold(Norms::default(), Norms::add);
                    let ratio = |x: f64, u: f64| {
                        trust_coefficient(x.sqrt(), u.sqrt(), c.phi_min, c.phi_max)
                    };
                    let phi_sel = ratio(norms.x_sel, norms.u_sel);
                    let phi_rest = ratio(norms.x_rest, norms.u_rest);
                    let (phi_max, phi_min) = match (norms.selected, norms.rest) {
                        (_, 0) => (phi_sel, phi_sel),
                        (0, _) => (phi_rest, phi_rest),
                        _ => (phi_sel, phi_rest),
                    };
                    let (phi_max, phi_min) = (phi_max as f32, phi_min as f32);
                    let (lr, stale_lr) = (lr as f32, stale_lr as f32);
                    x.par_chunks_mut(CHUNK)
                        .zip(m.par_chunks(CHUNK))
                        .zip(v.par_chunks(CHUNK))
                        .zip(f.par_chunks(CHUNK))
                        .for_each(|(((x, m), v), f)| {
                            for (((x, &m), &v), &f) in x.iter_mut().zip(m).zip(v).zip(f) {
                                let u = moments.direction::<INSIDE>(m, v, *x, wd);
                                let phi = phi_max * f + phi_min * (1.0 - f);
                                let eta = lr * f + stale_lr * (1.0 - f);
                                *x -= eta * phi * u;
                            }
                        });
                },
            )
        });
        if ctx.t.is_multiple_of(c.sync_every) {
            let start = Instant::now();
            ctx.comm.allreduce_f32(x, ReduceOp::Mean)?;
            comm_time += start.elapsed();
        }
        Ok(comm_time)
    }

    fn finish(&mut self, ctx: &StepContext<'_>, x: &mut [f32]) -> Result<Duration, OptimError> {
        if ctx.t.is_multiple_of(self.config.sync_every) {
            return Ok(Duration::ZERO);
        }
        let start = Instant::now();
        ctx.comm.allreduce_f32(x, ReduceOp::Mean)?;
        Ok(start.elapsed())
    }

    fn state(&self) -> Vec<(&'static str, &[f32])> {
        vec![
            ("m", &self.m),
            ("v", &self.v),
            ("freshness", &self.freshness),
        ]
    }

    fn state_mut(&mut self) -> Vec<(&'static str, &mut [f32])> {
        vec![
            ("m", &mut self.m),
            ("v", &mut self.v),
            ("freshness", &mut self.freshness),
        ]
    }

    fn stage(&self, _t: u64) -> Stage {
        Stage::Sparse
    }
}
