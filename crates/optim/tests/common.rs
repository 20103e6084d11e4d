//! Shared by the optimizer tests: a seeded random stream and a flat problem
//! whose segments differ in magnitude by 10^6.

#![allow(dead_code)]

use terse_optim::ParamLayout;

pub use terse_rng::SplitMix64 as SplitMix;

/// Segments of very different size and magnitude. `(path, shape, scale)`:
/// parameters and gradients of a segment are drawn with that scale. The
/// 20,000-element segment spans several parallel chunks; `zero.bias` starts at
/// zero, so LAMB's ‖x‖ = 0 rule is exercised on the first step.
pub const SEGMENTS: [(&str, &[usize], f32); 6] = [
    ("huge.weight", &[200, 100], 1e3),
    ("huge.bias", &[100], 1e3),
    ("unit.weight", &[37, 11], 1.0),
    ("tiny.weight", &[16, 8], 1e-3),
    ("tiny.bias", &[8], 1e-3),
    ("zero.bias", &[5], 1.0),
];

pub fn layout() -> ParamLayout {
    ParamLayout::from_shapes(
        SEGMENTS
            .iter()
            .map(|(path, shape, _)| (path.to_string(), shape.to_vec())),
    )
}

/// Initial parameters: each segment uniform in ±scale (`zero.bias` all zero).
pub fn initial_params(rng: &mut SplitMix) -> Vec<f32> {
    let mut x = Vec::new();
    for (path, shape, scale) in SEGMENTS {
        let n: usize = shape.iter().product();
        let zero = path.starts_with("zero");
        x.extend((0..n).map(|_| if zero { 0.0 } else { scale * rng.symmetric() }));
    }
    x
}

/// A gradient: each segment uniform in ±scale.
pub fn gradient(rng: &mut SplitMix) -> Vec<f32> {
    let mut g = Vec::new();
    for (_, shape, scale) in SEGMENTS {
        let n: usize = shape.iter().product();
        g.extend((0..n).map(|_| scale * rng.symmetric()));
    }
    g
}
