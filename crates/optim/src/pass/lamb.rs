//! LAMB's two passes (ALGORITHMS.md "LAMB"): the moments with each
//! segment's norms ‖x‖² and ‖u‖², then — once the trust coefficients are
//! known — the update `x -= (lr·c)·u` (LAMB's step and 1-bit LAMB's
//! warmup).

use rayon::prelude::*;

use super::Direction;
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{chunk_sum_of_squares, with_avx};
use crate::span::{On, Partials, Span};
use crate::{Flat, FlatMut};
use terse_kernels::device::optim;

/// `m, v` take `g`; returns `[‖x‖², ‖u‖²]` per chunk of this rank (host)
/// or per segment (device), `u` the direction with decaying segments'
/// `weight_decay`.
pub(crate) fn lamb_norms(
    span: &Span<'_>,
    d: &Direction<'_>,
    x: &FlatMut<'_>,
    (m, v): (&mut Flat, &mut Flat),
    g: &FlatMut<'_>,
) -> Partials<[f64; 2]> {
    match &span.on {
        On::Host(_) => Partials::Units(with_eps_mode!(d.eps_mode, INSIDE => {
            span.unit_slices([m.host_mut(), v.host_mut()], [x.host(), g.host()])
                .map(|(segment, [m, v], [x, g])| {
                    let wd = d.decay_of(span, segment);
                    with_avx(|| accumulate::<INSIDE>(d.moments, wd, x, m, v, g))
                })
                .collect()
        })),
        On::Device { client, chunks } => {
            let (c, inside) = d.kernel_constants();
            let [x, m, v, g] = [x.handle(), m.handle(), v.handle(), g.handle()];
            let norms = optim::lamb_norms(client, chunks, x, m, v, g, &c, inside);
            Partials::Segments(norms.into_iter().map(|(x, u)| [x, u]).collect())
        }
    }
}

/// `x -= rate_s·u` with each segment's rate (`lr·c`), over `span`.
pub(crate) fn lamb_apply(
    span: &Span<'_>,
    d: &Direction<'_>,
    rates: &[f32],
    x: &mut FlatMut,
    (m, v): (&Flat, &Flat),
) {
    match &span.on {
        On::Host(_) => with_eps_mode!(d.eps_mode, INSIDE => {
            span.unit_slices([x.host_mut()], [m.host(), v.host()])
                .for_each(|(segment, [x], [m, v])| {
                    let (rate, wd) = (rates[segment], d.decay_of(span, segment));
                    with_avx(|| apply::<INSIDE>(d.moments, rate, wd, x, m, v))
                })
        }),
        On::Device { client, chunks } => {
            let (c, inside) = d.kernel_constants();
            let [x, m, v] = [x.handle(), m.handle(), v.handle()];
            optim::lamb_apply(client, chunks, x, m, v, &c, rates, inside)
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
