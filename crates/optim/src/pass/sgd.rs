//! Momentum SGD's fused update (ALGORITHMS.md "Momentum SGD").

use rayon::prelude::*;

use crate::parallel::with_avx;
use crate::span::{On, Span};
use crate::{Flat, FlatMut};

/// SGD's constants: momentum `mu`, the learning rate, the decay of
/// decaying segments, Nesterov's form or the heavy ball.
pub(crate) struct SgdStep {
    pub(crate) mu: f32,
    pub(crate) lr: f32,
    pub(crate) weight_decay: f32,
    pub(crate) nesterov: bool,
}

/// `d = g + wd·x; m = μm + d; x -= lr·(d + μm | m)` over `span`.
pub(crate) fn sgd(span: &Span<'_>, c: &SgdStep, x: &mut FlatMut, m: &mut Flat, g: &FlatMut<'_>) {
    match &span.on {
        On::Host(_) => span
            .unit_slices([x.host_mut(), m.host_mut()], [g.host()])
            .for_each(|(segment, [x, m], [g])| {
                let decay = span.layout.segments()[segment].decay;
                let wd = if decay { c.weight_decay } else { 0.0 };
                with_avx(|| {
                    if c.nesterov {
                        sgd_update::<true>(c.mu, c.lr, wd, x, m, g)
                    } else {
                        sgd_update::<false>(c.mu, c.lr, wd, x, m, g)
                    }
                })
            }),
        On::Device { client, chunks } => terse_kernels::device::optim::sgd_step(
            client,
            chunks,
            x.handle(),
            m.handle(),
            g.handle(),
            c.mu,
            c.lr,
            c.nesterov,
        ),
    }
}

#[inline(always)]
fn sgd_update<const NESTEROV: bool>(
    mu: f32,
    lr: f32,
    wd: f32,
    x: &mut [f32],
    m: &mut [f32],
    g: &[f32],
) {
    for ((x, m), &g) in x.iter_mut().zip(m).zip(g) {
        let d = g + wd * *x;
        *m = mu * *m + d;
        let step = if NESTEROV { d + mu * *m } else { *m };
        *x -= lr * step;
    }
}
