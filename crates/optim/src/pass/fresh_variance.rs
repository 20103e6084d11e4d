//! 1-bit LAMB's compression-stage passes (ALGORITHMS.md "1-bit LAMB",
//! §A.5): the momentum scaled per segment so one compressed buffer carries
//! every layer, then — after the allreduce — the momentum unscaled and
//! masked, the fresh variance rebuilt from the momentum difference, and
//! each chunk's largest ratio of the frozen to the fresh denominator.

use std::ops::Range;

use cubecl::server::Handle;
use rayon::prelude::*;

use super::Direction;
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{CHUNK, split_segments, split_segments_mut, with_avx};
use crate::span::{On, Partials, Span};
use crate::{EpsMode, Flat, FlatMut, ParamLayout};
use terse_kernels::device::optim;

/// Running maxima of [`fresh_ratios`]: one AVX-512 register.
const RATIO_LANES: usize = 16;

/// The constants of the fresh variance.
pub(crate) struct FreshVariance<'a> {
    /// This step's moment constants (the frozen v's bias correction).
    pub(crate) moments: &'a Moments,
    /// ε's placement in the compression stage.
    pub(crate) eps_mode: EpsMode,
    pub(crate) beta_1: f64,
    pub(crate) beta_2: f64,
    pub(crate) eps: f64,
    /// The paper's ratio `(v + ε)/(v_fresh + ε)` instead of the
    /// denominators'.
    pub(crate) variance: bool,
    /// Each segment's momentum scale.
    pub(crate) k: &'a [f64],
    /// Zero the momentum where the frozen v is zero (`hold_zero_variance`).
    pub(crate) hold: bool,
}

/// `m_last = m`, then `m = (β1·m + (1-β1)·g)·k_s` per segment. A host
/// step split between ranks keeps `m_last` only in this rank's part (the
/// only part it reads).
pub(crate) fn scaled_momentum(
    span: &Span<'_>,
    moments: &Moments,
    beta_1: f64,
    k: &[f64],
    (m, m_last): (&mut Flat, &mut Flat),
    g: &FlatMut<'_>,
) {
    match &span.on {
        On::Host(shard) => host_scaled_momentum(
            span.layout,
            beta_1,
            k,
            m.host_mut(),
            (m_last.host_mut(), shard.my_range()),
            g.host(),
        ),
        On::Device { client, chunks } => {
            let k: Vec<f32> = k.iter().map(|&k| k as f32).collect();
            optim::copy(client, m.handle(), m_last.handle(), span.layout.len());
            let fresh = moments.coefficients();
            optim::scaled_momentum(client, chunks, m.handle(), g.handle(), &fresh, &k);
        }
    }
}

/// Masks the synchronised momentum where the frozen v is zero (with
/// `hold`) and unscales it (`m /= k_s`), updates v_fresh from the reconstructed
/// gradient and returns the largest ratio per chunk of this rank (host) or
/// per segment (device). On the host one pass: mask, unscale and ratio per
/// element in the order three separate passes had, so the bits are the
/// same; the segments' maxima do not depend on how the chunks are grouped.
pub(crate) fn fresh_ratios(
    span: &Span<'_>,
    f: &FreshVariance<'_>,
    m: &mut Flat,
    m_last: &Flat,
    v: &Flat,
    v_fresh: &mut Flat,
) -> Partials<f32> {
    match &span.on {
        On::Host(_) => {
            let (b1, b2) = (f.beta_1 as f32, f.beta_2 as f32);
            let (inv_one_minus_b1, one_minus_b2) =
                (1.0 / (1.0 - f.beta_1) as f32, (1.0 - f.beta_2) as f32);
            let eps = f.eps as f32;
            let (variance, hold) = (f.variance, f.hold);
            let moments = f.moments;
            let writes = [m.host_mut(), v_fresh.host_mut()];
            Partials::Units(with_eps_mode!(f.eps_mode, INSIDE => {
                span.unit_slices(writes, [m_last.host(), v.host()])
                    .map(|(segment, [m, fresh], [last, v])| {
                        let k = f.k[segment] as f32;
                        // One element: mask, unscale, v_fresh, its ratio.
                        let ratio_of = |m: &mut f32, last: f32, v: f32, fresh: &mut f32| {
                            if hold && v == 0.0 {
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
            }))
        }
        On::Device { client, chunks } => {
            optim::unscale_masked(client, chunks, m.handle(), v.handle(), &f.k_f32(), f.hold);
            let buffers = [m.handle(), m_last.handle(), v.handle(), v_fresh.handle()];
            let coefficients = f.moments.coefficients();
            Partials::Segments(optim::fresh_variance(
                client,
                chunks,
                buffers,
                &f.kernel_constants(&coefficients),
            ))
        }
    }
}

/// On a device: the synchronised momentum masked and unscaled, the fresh
/// variance, each segment's ratio clipped by `rule` against the last one
/// (which it replaces) and the update with v frozen, all there
/// ([`optim::fresh_variance_update`]): the host reads nothing. `scalars`
/// holds `c_avg` then the last ratios (1-bit LAMB's, on the device).
///
/// # Panics
/// On a host span.
pub(crate) fn device_fresh_update(
    span: &Span<'_>,
    f: &FreshVariance<'_>,
    rule: &optim::VarianceRatioRule,
    x: &mut FlatMut,
    (m, m_last, v, v_fresh): (&mut Flat, &Flat, &Flat, &mut Flat),
    scalars: &Handle,
) {
    let On::Device { client, chunks } = &span.on else {
        panic!("a device update on a host span")
    };
    optim::unscale_masked(client, chunks, m.handle(), v.handle(), &f.k_f32(), f.hold);
    let buffers = [
        x.handle(),
        m.handle(),
        m_last.handle(),
        v.handle(),
        v_fresh.handle(),
    ];
    let coefficients = f.moments.coefficients();
    let constants = f.kernel_constants(&coefficients);
    optim::fresh_variance_update(client, chunks, buffers, scalars, &constants, rule, f.hold);
}

impl FreshVariance<'_> {
    /// The momentum scales as the kernels take them.
    fn k_f32(&self) -> Vec<f32> {
        self.k.iter().map(|&k| k as f32).collect()
    }

    /// The kernels' constants, with this step's `coefficients`.
    fn kernel_constants<'c>(
        &self,
        coefficients: &'c optim::MomentCoefficients,
    ) -> optim::FreshVarianceConstants<'c> {
        optim::FreshVarianceConstants {
            coefficients,
            inv_one_minus_beta_1: 1.0 / (1.0 - self.beta_1) as f32,
            inside: self.eps_mode == EpsMode::Inside,
            variance: self.variance,
        }
    }
}

/// `last = m` (in `keep`, whole chunks of the split: the only part of
/// `last` this rank reads), then `m = (β1·m + (1-β1)·g)·k_p` per segment, in
/// one pass.
fn host_scaled_momentum(
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

/// Each segment's `[‖m̂/denom(v̂)‖², ‖m̂/denom(v̂) + wd·x‖²]` (the update
/// without and with its weight decay), for `decay_blend`: per unit of this
/// rank on the host (m is current there), per segment on a device, where
/// the three buffers are read to the host (the option is DeepSpeed
/// parity, whose compressed allreduce goes through the host anyway).
pub(crate) fn update_norms(
    span: &Span<'_>,
    d: &Direction<'_>,
    m: &Flat,
    v: &Flat,
    x: &FlatMut<'_>,
) -> Partials<[f64; 2]> {
    let sums = |m: &[f32], v: &[f32], x: &[f32], wd: f32| {
        with_eps_mode!(d.eps_mode, INSIDE => {
            let mut sums = [0.0f64; 2];
            for ((&m, &v), &x) in m.iter().zip(v).zip(x) {
                let prelim = d.moments.direction::<INSIDE>(m, v, x, 0.0);
                let update = d.moments.direction::<INSIDE>(m, v, x, wd);
                sums[0] += f64::from(prelim) * f64::from(prelim);
                sums[1] += f64::from(update) * f64::from(update);
            }
            sums
        })
    };
    match &span.on {
        On::Host(_) => Partials::Units(
            span.unit_slices([], [m.host(), v.host(), x.host()])
                .map(|(segment, [], [m, v, x])| sums(m, v, x, d.decay_of(span, segment)))
                .collect(),
        ),
        On::Device { .. } => {
            let (m, v) = (m.read(), v.read());
            let x = x.device().expect("a device step's parameters").to_host();
            Partials::Segments(
                span.layout
                    .segments()
                    .iter()
                    .enumerate()
                    .map(|(s, seg)| {
                        let r = seg.range();
                        sums(&m[r.clone()], &v[r.clone()], &x[r], d.decay_of(span, s))
                    })
                    .collect(),
            )
        }
    }
}
