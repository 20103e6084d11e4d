//! Adam's fused update (ALGORITHMS.md "Adam / AdamW"): moments,
//! direction and parameter in one pass over x, m, v and g — Adam's step,
//! 1-bit Adam's warmup and its naive baseline.

use rayon::prelude::*;

use super::Direction;
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::with_avx;
use crate::span::{On, Span};
use crate::{Flat, FlatMut};
use terse_kernels::device::optim;

/// `x -= lr·u` after `m, v` took `g`, over `span`.
pub(crate) fn adam(
    span: &Span<'_>,
    d: &Direction<'_>,
    lr: f32,
    x: &mut FlatMut,
    (m, v): (&mut Flat, &mut Flat),
    g: &FlatMut<'_>,
) {
    match &span.on {
        On::Host(_) => with_eps_mode!(d.eps_mode, INSIDE => {
            span.unit_slices([x.host_mut(), m.host_mut(), v.host_mut()], [g.host()])
                .for_each(|(segment, [x, m, v], [g])| {
                    let wd = d.decay_of(span, segment);
                    with_avx(|| adam_update::<INSIDE>(d.moments, lr, wd, x, m, v, g))
                })
        }),
        On::Device { client, chunks } => {
            let (c, inside) = d.kernel_constants();
            let [x, m, v, g] = [x.handle(), m.handle(), v.handle(), g.handle()];
            optim::adam_step(client, chunks, x, m, v, g, &c, lr, inside)
        }
    }
}

/// The fused Adam update of one chunk: moments, direction and parameter in a
/// single pass over x, m, v and g.
#[inline(always)]
fn adam_update<const INSIDE: bool>(
    moments: &Moments,
    lr: f32,
    wd: f32,
    x: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
) {
    for (((x, m), v), &g) in x.iter_mut().zip(m).zip(v).zip(g) {
        moments.accumulate(m, v, g);
        *x -= lr * moments.direction::<INSIDE>(*m, *v, *x, wd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MomentConfig;
    use terse_kernels::{SimdTier, with_tier};

    /// The update is the same bits in every vector tier the CPU has as in
    /// portable code (the optimizers' results must not depend on the
    /// machine), for both ε placements, with weight decay, at steps 1 and 7.
    #[test]
    fn every_tier_gives_the_same_bits() {
        let n = 4099;
        let wave = |k: f32| (0..n).map(move |i| (i as f32 * k).sin());
        for t in [1, 7] {
            let moments = Moments::new(&MomentConfig::default(), true, t);
            let step = |tier, inside: bool| {
                let mut x: Vec<f32> = wave(0.37).collect();
                let mut m: Vec<f32> = wave(0.11).map(|v| v * 1e-3).collect();
                let mut v: Vec<f32> = wave(0.05).map(|v| v * v * 1e-6).collect();
                let g: Vec<f32> = wave(0.91).map(|v| v * 1e-2).collect();
                with_tier(tier, || {
                    if inside {
                        adam_update::<true>(&moments, 1e-3, 0.01, &mut x, &mut m, &mut v, &g)
                    } else {
                        adam_update::<false>(&moments, 1e-3, 0.01, &mut x, &mut m, &mut v, &g)
                    }
                });
                [x, m, v].map(|b| b.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
            };
            for inside in [false, true] {
                let portable = step(SimdTier::Portable, inside);
                for tier in SimdTier::available() {
                    assert_eq!(
                        step(tier, inside),
                        portable,
                        "{tier:?}, t {t}, inside {inside}"
                    );
                }
            }
        }
    }
}
