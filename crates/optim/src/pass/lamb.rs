//! LAMB's two passes (ALGORITHMS.md "LAMB"): the moments with each
//! segment's norms ‖x‖² and ‖u‖², then — once the trust coefficients are
//! known — the update `x -= (lr·c)·u` (LAMB's step and 1-bit LAMB's
//! warmup). On a device the coefficients are computed between the passes
//! there, not on the host.

use std::time::Duration;

use rayon::prelude::*;
use terse_comm::Communicator;
use terse_kernels::device::optim::{self, QueuedTrusts, TrustConstants};

use super::Direction;
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{chunk_sum_of_squares, with_avx};
use crate::span::{On, Partials, Span};
use crate::{Flat, FlatMut, OptimError, Segment};

/// LAMB's step over `span`: `m, v` take `g`, each segment's `‖x‖²` and
/// `‖u‖²` (u the direction with decaying segments' `weight_decay`) give its
/// coefficient by `rule`, and `x -= (lr·c)·u`. On the host the chunks'
/// f64 partials are folded per segment (gathered from the other ranks
/// when the step is split; the time that took is returned); on a device
/// the coefficients are computed there and the host waits for nothing
/// ([`optim::lamb_step`]).
pub(crate) fn lamb_passes(
    span: &Span<'_>,
    d: &Direction<'_>,
    rule: &TrustRule,
    comm: &dyn Communicator,
    x: &mut FlatMut,
    (m, v): (&mut Flat, &mut Flat),
    g: &FlatMut<'_>,
) -> Result<(Trusts, Duration), OptimError> {
    let segments = span.layout.segments();
    match &span.on {
        On::Host(_) => {
            let partials = with_eps_mode!(d.eps_mode, INSIDE => {
                span.unit_slices([m.host_mut(), v.host_mut()], [x.host(), g.host()])
                    .map(|(segment, [m, v], [x, g])| {
                        let wd = d.decay_of(span, segment);
                        with_avx(|| accumulate::<INSIDE>(d.moments, wd, x, m, v, g))
                    })
                    .collect()
            });
            let add = |a: [f64; 2], b: [f64; 2]| [a[0] + b[0], a[1] + b[1]];
            let (sums, time) = span.per_segment(comm, Partials::Units(partials), [0.0; 2], add)?;
            let trusts: Vec<Trust> = segments
                .iter()
                .zip(sums)
                .map(|(segment, [xx, uu])| rule.of_segment(segment, xx, uu))
                .collect();
            let rates: Vec<f32> = trusts
                .iter()
                .map(|trust| (rule.lr * trust.coefficient) as f32)
                .collect();
            with_eps_mode!(d.eps_mode, INSIDE => {
                span.unit_slices([x.host_mut()], [m.host(), v.host()])
                    .for_each(|(segment, [x], [m, v])| {
                        let (rate, wd) = (rates[segment], d.decay_of(span, segment));
                        with_avx(|| apply::<INSIDE>(d.moments, rate, wd, x, m, v))
                    })
            });
            Ok((Trusts::Ready(trusts), time))
        }
        On::Device { client, chunks } => {
            let (c, inside) = d.kernel_constants();
            let trusted: Vec<bool> = segments.iter().map(|s| rule.applies_to(s)).collect();
            let constants = TrustConstants {
                lr: rule.lr as f32,
                c_min: rule.c_min as f32,
                c_max: rule.c_max as f32,
                trusted: &trusted,
            };
            let buffers = [x.handle(), m.handle(), v.handle(), g.handle()];
            let queued = optim::lamb_step(client, chunks, buffers, &c, inside, &constants);
            Ok((Trusts::Queued(queued), Duration::ZERO))
        }
    }
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

/// How LAMB turns a segment's norms into its coefficient and rate.
pub(crate) struct TrustRule {
    /// The step's learning rate (the rate is `lr·c`).
    pub(crate) lr: f64,
    /// The coefficient's clip range.
    pub(crate) c_min: f64,
    pub(crate) c_max: f64,
    /// A coefficient of exactly 1 for segments without decay
    /// (`trust_decay_only`).
    pub(crate) decay_only: bool,
}

impl TrustRule {
    /// Whether `segment` takes a trust ratio at all.
    pub(crate) fn applies_to(&self, segment: &Segment) -> bool {
        !self.decay_only || segment.decay
    }

    /// The coefficient of `segment` from its `Σx²` and `Σu²`.
    pub(crate) fn of_segment(&self, segment: &Segment, xx: f64, uu: f64) -> Trust {
        if self.applies_to(segment) {
            Trust {
                coefficient: trust_coefficient(xx.sqrt(), uu.sqrt(), self.c_min, self.c_max),
                degenerate: xx == 0.0 || uu == 0.0,
            }
        } else {
            Trust {
                coefficient: 1.0,
                degenerate: false,
            }
        }
    }
}

/// A segment's trust coefficient, and whether a norm was 0 (coefficient 1
/// by that rule, which 1-bit LAMB leaves out of its running average).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Trust {
    pub(crate) coefficient: f64,
    pub(crate) degenerate: bool,
}

/// The segments' coefficients of a step: computed on the host, or on the
/// device and read only when asked for ([`Trusts::read`]), so that LAMB,
/// which does not keep them, never waits for them.
pub(crate) enum Trusts {
    Ready(Vec<Trust>),
    Queued(QueuedTrusts),
}

impl Trusts {
    /// The coefficients, one per segment (a device's: waits for it).
    pub(crate) fn read(self) -> Vec<Trust> {
        match self {
            Trusts::Ready(trusts) => trusts,
            Trusts::Queued(queued) => queued
                .read()
                .into_iter()
                .map(|(coefficient, degenerate)| Trust {
                    coefficient: f64::from(coefficient),
                    degenerate,
                })
                .collect(),
        }
    }
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
) -> [f64; 2] {
    let mut u = vec![0.0f32; x.len()];
    for ((((u, &x), m), v), &g) in u.iter_mut().zip(x).zip(m).zip(v).zip(g) {
        moments.accumulate(m, v, g);
        *u = moments.direction::<INSIDE>(*m, *v, x, wd);
    }
    [chunk_sum_of_squares(x), chunk_sum_of_squares(&u)]
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
