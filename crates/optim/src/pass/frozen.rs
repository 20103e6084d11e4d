//! The compression stage's passes shared by 1-bit Adam and 1-bit LAMB
//! (ALGORITHMS.md "1-bit Adam"): the momentum from the local gradient
//! before it is compressed, and the update from the synchronised momentum
//! with v frozen.

use rayon::prelude::*;

use super::Direction;
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{chunk_slices, with_avx};
use crate::span::{On, Span};
use crate::{Flat, FlatMut};
use terse_kernels::device::optim;

/// `m = β1·m + (1-β1)·g` over the whole buffer (the compressed allreduce
/// sends all of it, split step or not).
pub(crate) fn accumulate_momentum(
    span: &Span<'_>,
    moments: &Moments,
    m: &mut Flat,
    g: &FlatMut<'_>,
) {
    match &span.on {
        On::Host(_) => chunk_slices([m.host_mut()], [g.host()]).for_each(|([m], [g])| {
            with_avx(|| {
                for (m, &g) in m.iter_mut().zip(g) {
                    moments.momentum(m, g);
                }
            })
        }),
        On::Device { client, chunks } => optim::accumulate_momentum(
            client,
            chunks,
            m.handle(),
            g.handle(),
            &moments.coefficients(),
        ),
    }
}

/// `x -= rate_s·(m̂/denom(v̂) + wd·x)` with one rate per segment, over
/// `span`, except, with `hold` (the config's `hold_zero_variance`), where
/// the frozen `v` is exactly zero: there `m` is set to zero and `x` does
/// not move.
///
/// A coordinate whose variance is exactly zero at the freeze has had a
/// zero gradient on every rank at every warmup step (an embedding row no
/// token used, a position beyond the sequence length, padding): the
/// compressed momentum hands it ±scale (sign(0) = +1), which would move it
/// by lr·scale/ε. Such coordinates are masked, as DeepSpeed's
/// `exp_avg_mask` does, and do not move at all (no decay either) for the
/// rest of the run; their momentum is zeroed so it does not carry the
/// scale into the next steps. The mask is `v == 0` of the frozen v, so it
/// is saved with v in every checkpoint and needs no state of its own.
pub(crate) fn frozen_apply(
    span: &Span<'_>,
    d: &Direction<'_>,
    rates: &[f32],
    x: &mut FlatMut,
    m: &mut Flat,
    v: &Flat,
    hold: bool,
) {
    match &span.on {
        On::Host(_) => with_eps_mode!(d.eps_mode, INSIDE => {
            span.unit_slices([x.host_mut(), m.host_mut()], [v.host()])
                .for_each(|(segment, [x, m], [v])| {
                    let (rate, wd) = (rates[segment], d.decay_of(span, segment));
                    with_avx(|| {
                        for ((x, m), &v) in x.iter_mut().zip(m).zip(v) {
                            let step = rate * d.moments.direction::<INSIDE>(*m, v, *x, wd);
                            let moves = v > 0.0 || !hold;
                            *x -= if moves { step } else { 0.0 };
                            *m = if moves { *m } else { 0.0 };
                        }
                    })
                })
        }),
        On::Device { client, chunks } => {
            let (c, inside) = d.kernel_constants();
            let [x, m, v] = [x.handle(), m.handle(), v.handle()];
            optim::frozen_apply(client, chunks, x, m, v, &c, rates, inside, hold)
        }
    }
}
