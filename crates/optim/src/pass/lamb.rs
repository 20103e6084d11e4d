//! LAMB's two passes (ALGORITHMS.md "LAMB"): the moments with each
//! segment's norms ‖x‖² and ‖u‖², then — once the trust coefficients are
//! known — the update `x -= (lr·c)·u` (LAMB's step and 1-bit LAMB's
//! warmup). On a device the coefficients are computed between the passes
//! there, not on the host.

use std::time::Duration;

use rayon::prelude::*;
use terse_comm::Communicator;
use terse_kernels::device::optim::{self, TrustConstants};

use super::Direction;
use crate::lamb::{Trust, TrustRule, Trusts};
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{chunk_sum_of_squares, with_avx};
use crate::span::{On, Partials, Span};
use crate::{Flat, FlatMut, OptimError};

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
