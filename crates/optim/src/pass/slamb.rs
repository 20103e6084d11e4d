//! SLAMB's element-wise passes (ALGORITHMS.md "SLAMB"), each with its host
//! loop and its cubecl kernel side by side: the moments, the freshness from
//! the step's selection, the per-segment norms split by selection and the
//! trust ratios from them (on a device computed there, not read), and the
//! update with each element's blend of the two trust ratios and rates.
//! The selection is a flag per element on the host and a bitmap on the
//! device ([`Selected`]); everything else is the same step on either.

use cubecl::prelude::*;
use cubecl::server::Handle;
use rayon::prelude::*;
use terse_kernels::device::optim::DeviceChunks;
use terse_kernels::device::slamb as kernels;
use terse_kernels::device::slamb_trust::{self, SlambTrust};

use super::Direction;
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{CHUNK, chunk_slices, split_segments, split_segments_mut, with_avx};
use crate::{Flat, FlatMut, ParamLayout, Segment};

/// Where SLAMB's passes run: the host's fixed chunks, or the device's
/// chunk table.
pub(crate) enum SlambOn<'a> {
    Host,
    Device {
        client: &'a Client,
        chunks: &'a DeviceChunks,
    },
}

/// The elements this step synchronised.
pub(crate) enum Selected<'a> {
    /// 1 where selected, one byte per element.
    Host(&'a [u8]),
    /// One bit per element, 32 to a word.
    Device(&'a Handle),
}

/// Per-segment sums of squares split by selection: (x·M, u·M, x·¬M, u·¬M)
/// and how many elements each side has.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Norms {
    pub(crate) x_sel: f64,
    pub(crate) u_sel: f64,
    pub(crate) x_rest: f64,
    pub(crate) u_rest: f64,
    pub(crate) selected: usize,
    pub(crate) rest: usize,
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

/// m and v take the local gradient `g`.
pub(crate) fn moments(
    on: &SlambOn<'_>,
    moments: &Moments,
    (m, v): (&mut Flat, &mut Flat),
    g: &FlatMut,
) {
    match on {
        SlambOn::Host => {
            chunk_slices([m.host_mut(), v.host_mut()], [g.host()]).for_each(|([m, v], [g])| {
                with_avx(|| {
                    for ((m, v), &g) in m.iter_mut().zip(v).zip(g) {
                        moments.accumulate(m, v, g);
                    }
                })
            })
        }
        SlambOn::Device { client, chunks } => {
            let coefficients = moments.coefficients();
            kernels::moments(
                client,
                chunks,
                m.handle(),
                v.handle(),
                g.handle(),
                &coefficients,
            )
        }
    }
}

/// The freshness: 1 where selected, decaying by β3 elsewhere.
pub(crate) fn freshness(on: &SlambOn<'_>, f: &mut Flat, selected: &Selected<'_>, beta_3: f32) {
    match (on, selected) {
        (SlambOn::Host, Selected::Host(selected)) => f
            .host_mut()
            .par_chunks_mut(CHUNK)
            .zip(selected.par_chunks(CHUNK))
            .for_each(|(f, s)| {
                for (f, &s) in f.iter_mut().zip(s) {
                    *f = if s == 1 { 1.0 } else { beta_3 * *f };
                }
            }),
        (SlambOn::Device { client, .. }, Selected::Device(words)) => {
            let len = f.len();
            kernels::freshness(client, f.handle(), words, len, beta_3)
        }
        _ => unreachable!("the selection lives where the step runs"),
    }
}

/// A segment's two trust ratios and the bounds their per-element blend is
/// clipped to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SegmentTrust {
    /// The selected (fresh) elements' ratio.
    pub(crate) phi_max: f32,
    /// The others' ratio.
    pub(crate) phi_min: f32,
    /// `(lo, hi)` of the blend.
    pub(crate) bounds: (f32, f32),
}

/// The segments' trust ratios of a step: on the host, or `[φ_max, φ_min,
/// lo, hi]` per segment in a device buffer.
pub(crate) enum Phi {
    Host(Vec<SegmentTrust>),
    Device(Handle),
}

/// What the trust ratios and the update need besides the buffers: the
/// segments, and Adam's direction (the other passes' [`Direction`]).
pub(crate) struct SlambStep<'a> {
    pub(crate) layout: &'a ParamLayout,
    pub(crate) direction: Direction<'a>,
}

impl SlambStep<'_> {
    /// Each segment's trust ratios from the norms of x and of Adam's
    /// direction u split by the selection: on the host `host_ratios` of
    /// f64 sums in chunk order; on a device the same rule, `device_rule`,
    /// computed there and left there ([`slamb_trust::trust_ratios`]), so
    /// the host does not wait for them.
    pub(crate) fn trust(
        &self,
        on: &SlambOn<'_>,
        x: &FlatMut,
        (m, v): (&Flat, &Flat),
        selected: &Selected<'_>,
        host_ratios: impl Fn(&Norms, &Segment) -> SegmentTrust,
        device_rule: &SlambTrust<'_>,
    ) -> Phi {
        match (on, selected) {
            (SlambOn::Host, Selected::Host(selected)) => Phi::Host(
                self.host_split_norms(x, (m, v), selected)
                    .iter()
                    .zip(self.layout.segments())
                    .map(|(n, segment)| host_ratios(n, segment))
                    .collect(),
            ),
            (SlambOn::Device { client, chunks }, Selected::Device(words)) => {
                Phi::Device(slamb_trust::trust_ratios(
                    client,
                    chunks,
                    [x.handle(), m.handle(), v.handle()],
                    words,
                    &self.direction.moments.coefficients(),
                    self.direction.inside(),
                    device_rule,
                ))
            }
            _ => unreachable!("the selection lives where the step runs"),
        }
    }

    /// Each segment's norms of x and of Adam's direction u on the host,
    /// split by the selection (f64 sums in chunk order).
    fn host_split_norms(&self, x: &FlatMut, (m, v): (&Flat, &Flat), selected: &[u8]) -> Vec<Norms> {
        let moments = self.direction.moments;
        let layout = self.layout;
        let xs = split_segments(layout, x.host());
        let ms = split_segments(layout, m.host());
        let vs = split_segments(layout, v.host());
        let ss = split_segments(layout, selected);
        with_eps_mode!(self.direction.eps_mode, INSIDE => {
            layout.segments().par_iter().zip(xs).zip(ms).zip(vs).zip(ss).map(
                |((((segment, x), m), v), s)| {
                    let wd = self.direction.decay(segment.decay);
                    chunk_slices([], [x, m, v])
                        .zip(s.par_chunks(CHUNK))
                        .map(|(([], [x, m, v]), s)| {
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
                        .fold(Norms::default(), Norms::add)
                },
            )
            .collect()
        })
    }

    /// `x -= η·φ·u`, with each element's rate and ratio blended by its
    /// freshness f between the fresh ones (`lr`, the segment's φ_max) and
    /// the stale ones (`stale_lr`, its φ_min), the blended ratio clipped to
    /// the segment's bounds.
    pub(crate) fn apply(
        &self,
        on: &SlambOn<'_>,
        x: &mut FlatMut,
        (m, v, f): (&Flat, &Flat, &Flat),
        phi: &Phi,
        (lr, stale_lr): (f32, f32),
    ) {
        let moments = self.direction.moments;
        match (on, phi) {
            (SlambOn::Host, Phi::Host(phi)) => {
                let layout = self.layout;
                let xs = split_segments_mut(layout, x.host_mut());
                let ms = split_segments(layout, m.host());
                let vs = split_segments(layout, v.host());
                let fs = split_segments(layout, f.host());
                with_eps_mode!(self.direction.eps_mode, INSIDE => {
                    layout.segments().par_iter().zip(phi).zip(xs).zip(ms).zip(vs).zip(fs).for_each(
                        |(((((segment, phi), x), m), v), f)| {
                            let wd = self.direction.decay(segment.decay);
                            let SegmentTrust { phi_max, phi_min, bounds: (lo, hi) } = *phi;
                            chunk_slices([x], [m, v, f])
                                .for_each(|([x], [m, v, f])| {
                                    for (((x, &m), &v), &f) in x.iter_mut().zip(m).zip(v).zip(f) {
                                        let u = moments.direction::<INSIDE>(m, v, *x, wd);
                                        let phi = (phi_max * f + phi_min * (1.0 - f)).clamp(lo, hi);
                                        let eta = lr * f + stale_lr * (1.0 - f);
                                        *x -= eta * phi * u;
                                    }
                                });
                        },
                    )
                });
            }
            (SlambOn::Device { client, chunks }, Phi::Device(phi)) => kernels::apply(
                client,
                chunks,
                x.handle(),
                m.handle(),
                v.handle(),
                f.handle(),
                &moments.coefficients(),
                phi,
                lr,
                stale_lr,
                self.direction.inside(),
            ),
            _ => unreachable!("the ratios live where the step runs"),
        }
    }
}
