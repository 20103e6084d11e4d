//! 1-bit LAMB's compression stage (§A.5): the momentum scaled per
//! segment and compressed, then the fresh variance and its ratio to the
//! frozen one, and the update; split between ranks that share cores.

use std::ops::Range;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use super::{OneBitLamb, RatioKind};
use crate::moments::{Moments, with_eps_mode};
use crate::onebit_adam::{FrozenUpdate, accumulate_momentum, mask_momentum};
use crate::parallel::{CHUNK, split_segments, split_segments_mut, with_avx};
use crate::shard::{Shard, Unit, share_unit_words, unit_slices, unit_slices_mut};
use crate::step::StepContext;
use crate::{OptimError, ParamLayout};

/// Running maxima of [`OneBitLamb::fresh_ratios`]: one AVX-512 register.
const RATIO_LANES: usize = 16;

impl OneBitLamb {
    pub(super) fn compression_step(
        &mut self,
        ctx: &StepContext<'_>,
        x: &mut [f32],
        g: &[f32],
        t_w: u64,
    ) -> Result<Duration, OptimError> {
        let c = self.config.clone();
        let layout = ctx.layout;
        // Ranks that share cores split what follows the allreduce (m is the
        // same on every rank then): each masks, unscales and updates its own
        // chunks, and m and x are shared back for the next step. Such a rank
        // reads the mean and the last momentum only in its own part.
        let shard = Shard::for_step(&mut self.shard, ctx);
        let mine = shard.my_range();
        if self.basic {
            accumulate_momentum(c.moments.beta_1, self.m.host_mut(), g);
        } else {
            scaled_momentum(
                layout,
                c.moments.beta_1,
                &self.k,
                self.m.host_mut(),
                (self.m_last.host_mut(), mine.clone()),
                g,
            );
        }
        let start = Instant::now();
        self.allreduce.allreduce_mean_part(
            ctx.comm,
            self.m.host_mut(),
            &mut self.errors,
            mine.clone(),
        )?;
        let mut comm_time = start.elapsed();
        let moments = Moments::frozen(&c.moments, c.bias_correction, ctx.t, t_w);
        let units = shard.mine();
        let lrs: Vec<f64> = if self.basic {
            mask_momentum(&mut self.m.host_mut()[mine.clone()], &self.v.host()[mine]);
            self.c_avg.iter().map(|c_avg| ctx.lr * c_avg).collect()
        } else {
            // Masks and unscales m in the same pass.
            let mut unit_max = self.fresh_ratios(units, &moments);
            if shard.is_split() {
                self.partial = true;
                let clock = Instant::now();
                unit_max = share_unit_words(ctx.comm, &shard, &unit_max, 1)?;
                comm_time += clock.elapsed();
            }
            let mut raw = vec![0.0f32; layout.segments().len()];
            for (unit, r) in shard.units().iter().zip(unit_max) {
                raw[unit.segment] = raw[unit.segment].max(r);
            }
            let ratios = self.clip_ratios(&raw);
            ratios
                .iter()
                .zip(&self.c_avg)
                .map(|(r, c_avg)| ctx.lr * r * c_avg)
                .collect()
        };
        let update = FrozenUpdate {
            moments: &moments,
            eps_mode: c.moments.eps_mode.in_stage(true),
            weight_decay: c.moments.weight_decay,
        };
        update.apply(layout, units, &lrs, x, self.m.host(), self.v.host());
        comm_time += shard.share_parts(ctx.comm, &mut [self.m.host_mut(), x])?;
        Ok(comm_time)
    }

    /// Masks the synchronised momentum where the frozen v is zero and
    /// unscales it (`m /= k_p`) in `units`, updates v_fresh there from the
    /// reconstructed gradient and returns each unit's largest ratio. One
    /// pass: mask, unscale and ratio per element in the order the three
    /// separate passes had, so the bits are the same; the segments' maxima
    /// do not depend on how the chunks are grouped.
    fn fresh_ratios(&mut self, units: &[Unit], moments: &Moments) -> Vec<f32> {
        let c = &self.config;
        let (b1, b2) = (c.moments.beta_1 as f32, c.moments.beta_2 as f32);
        let (inv_one_minus_b1, one_minus_b2) = (
            1.0 / (1.0 - c.moments.beta_1) as f32,
            (1.0 - c.moments.beta_2) as f32,
        );
        let eps = c.moments.eps as f32;
        let variance = c.ratio == RatioKind::Variance;
        let k = &self.k;
        let ms = unit_slices_mut(self.m.host_mut(), units);
        let lasts = unit_slices(self.m_last.host(), units);
        let vs = unit_slices(self.v.host(), units);
        let fresh = unit_slices_mut(self.v_fresh.host_mut(), units);
        with_eps_mode!(c.moments.eps_mode.in_stage(true), INSIDE => {
            units
                .par_iter()
                .zip(ms)
                .zip(lasts)
                .zip(vs)
                .zip(fresh)
                .map(|((((unit, m), last), v), fresh)| {
                    let k = k[unit.segment] as f32;
                    // One element: mask, unscale, v_fresh, its ratio.
                    let ratio_of = |m: &mut f32, last: f32, v: f32, fresh: &mut f32| {
                        if v == 0.0 {
                            *m = 0.0;
                        }
                        *m /= k;
                        let g = (*m - b1 * last) * inv_one_minus_b1;
                        *fresh = b2 * *fresh + one_minus_b2 * g * g;
                        if variance {
                            (v + eps) / (*fresh + eps)
                        } else {
                            moments.denominator::<INSIDE>(v) / moments.denominator::<INSIDE>(*fresh)
                        }
                    };
                    with_avx(|| {
                        // The maximum in RATIO_LANES running maxima, so the
                        // loop vectorises (one running maximum kept it
                        // scalar: 7 ms of BERT-Tiny's 78 ms compression step
                        // on one rank). A maximum does not depend on the
                        // order it is taken in: the same bits.
                        let mut lanes = [0.0f32; RATIO_LANES];
                        let body = m.len() - m.len() % RATIO_LANES;
                        let (m, m_tail) = m.split_at_mut(body);
                        let (fresh, fresh_tail) = fresh.split_at_mut(body);
                        let groups = m
                            .chunks_exact_mut(RATIO_LANES)
                            .zip(last.chunks_exact(RATIO_LANES))
                            .zip(v.chunks_exact(RATIO_LANES))
                            .zip(fresh.chunks_exact_mut(RATIO_LANES));
                        for (((m, last), v), fresh) in groups {
                            for j in 0..RATIO_LANES {
                                let ratio = ratio_of(&mut m[j], last[j], v[j], &mut fresh[j]);
                                lanes[j] = lanes[j].max(ratio);
                            }
                        }
                        let tail = m_tail
                            .iter_mut()
                            .zip(&last[body..])
                            .zip(&v[body..])
                            .zip(fresh_tail.iter_mut());
                        for (j, (((m, &last), &v), fresh)) in tail.enumerate() {
                            lanes[j] = lanes[j].max(ratio_of(m, last, v, fresh));
                        }
                        lanes.into_iter().fold(0.0f32, f32::max)
                    })
                })
                .collect()
        })
    }
}

/// `last = m` (in `keep`, whole chunks of the split: the only part of
/// `last` this rank reads), then `m = (β1·m + (1-β1)·g)·k_p` per segment, in
/// one pass.
fn scaled_momentum(
    layout: &ParamLayout,
    beta_1: f64,
    k: &[f64],
    m: &mut [f32],
    (last, keep): (&mut [f32], Range<usize>),
    g: &[f32],
) {
    let (b1, one_minus) = (beta_1 as f32, (1.0 - beta_1) as f32);
    let offsets: Vec<usize> = layout.segments().iter().map(|s| s.offset).collect();
    let ms = split_segments_mut(layout, m);
    let lasts = split_segments_mut(layout, last);
    let gs = split_segments(layout, g);
    ms.into_par_iter()
        .zip(lasts)
        .zip(gs)
        .zip(k)
        .zip(offsets)
        .for_each(|((((m, last), g), &k), offset)| {
            let k = k as f32;
            m.par_chunks_mut(CHUNK)
                .zip(last.par_chunks_mut(CHUNK))
                .zip(g.par_chunks(CHUNK))
                .enumerate()
                .for_each(|(i, ((m, last), g))| {
                    let kept = keep.contains(&(offset + i * CHUNK));
                    with_avx(|| {
                        if kept {
                            for ((m, last), &g) in m.iter_mut().zip(last).zip(g) {
                                *last = *m;
                                *m = (b1 * *m + one_minus * g) * k;
                            }
                        } else {
                            for (m, &g) in m.iter_mut().zip(g) {
                                *m = (b1 * *m + one_minus * g) * k;
                            }
                        }
                    })
                });
        });
}
