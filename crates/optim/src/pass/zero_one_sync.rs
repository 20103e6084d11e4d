//! 0/1 Adam's synchronisation (ALGORITHMS.md "0/1 Adam"): the two passes
//! around the 1-bit allreduce of what this rank's local steps applied
//! since the last synchronisation, `x − x_sync` (the local steps
//! themselves are the compression stage's passes, [`super::frozen`]).
//!
//! The parameters after a synchronisation are `x_sync + ū/denom(v)` from
//! the saved `x_sync`, the same bits on every rank: DeepSpeed instead
//! subtracts each rank's own accumulator from its parameters, which
//! leaves them a rounding apart. Where v is exactly zero x stays at
//! `x_sync` and m is zeroed, as in the compression stage, unless the
//! config's `hold_zero_variance` is off.

use rayon::iter::ParallelIterator;

use super::Direction;
use crate::moments::with_eps_mode;
use crate::parallel::{chunk_slices, with_avx};
use crate::span::{On, Span};
use crate::{Flat, FlatMut};
use terse_kernels::device::optim;

/// Before the allreduce: `x = (x − x_sync)·denom(v)` in x's buffer.
pub(crate) fn sync_scale(
    span: &Span<'_>,
    d: &Direction<'_>,
    x: &mut FlatMut,
    (synced, v): (&Flat, &Flat),
) {
    match &span.on {
        On::Host(_) => with_eps_mode!(d.eps_mode, INSIDE => {
            chunk_slices([x.host_mut()], [synced.host(), v.host()]).for_each(|([x], [synced, v])| {
                with_avx(|| {
                    for ((x, &s), &v) in x.iter_mut().zip(synced).zip(v) {
                        *x = (*x - s) * d.moments.denominator::<INSIDE>(v);
                    }
                })
            })
        }),
        On::Device { client, chunks } => optim::sync_scale(
            client,
            chunks,
            [x.handle(), synced.handle(), v.handle()],
            &d.moments.coefficients(),
            d.inside(),
        ),
    }
}

/// After the allreduce of `ū` (in x's buffer): `m = −(ū/lr_sum)`,
/// `x = x_sync + ū/denom(v)`, `x_sync = x`; `lr_sum` is the sum of the
/// rates since the last synchronisation. With `hold`, where v is zero: m
/// is zeroed and x stays at `x_sync`.
pub(crate) fn sync_apply(
    span: &Span<'_>,
    d: &Direction<'_>,
    lr_sum: f32,
    x: &mut FlatMut,
    (synced, m, v): (&mut Flat, &mut Flat, &Flat),
    hold: bool,
) {
    match &span.on {
        On::Host(_) => with_eps_mode!(d.eps_mode, INSIDE => {
            let writes = [x.host_mut(), synced.host_mut(), m.host_mut()];
            chunk_slices(writes, [v.host()]).for_each(|([x, synced, m], [v])| {
                with_avx(|| {
                    for (((x, s), m), &v) in x.iter_mut().zip(synced).zip(m).zip(v) {
                        let u = *x;
                        if v > 0.0 || !hold {
                            *m = -(u / lr_sum);
                            *s += u / d.moments.denominator::<INSIDE>(v);
                        } else {
                            *m = 0.0;
                        }
                        *x = *s;
                    }
                })
            })
        }),
        On::Device { client, chunks } => optim::sync_apply(
            client,
            chunks,
            [x.handle(), synced.handle(), m.handle(), v.handle()],
            &d.moments.coefficients(),
            lr_sum,
            d.inside(),
            hold,
        ),
    }
}
