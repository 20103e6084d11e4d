//! The problem the compressed-optimizer tests share: two layers of
//! different magnitude, seeded initial parameters and per-rank gradients,
//! and the configs under test (freeze at step 10).

#![allow(dead_code)]

use terse_optim::{OneBitAdamConfig, OneBitLambConfig, ParamLayout};
use terse_rng::{SplitMix64, mix64};

pub const STEPS: u64 = 32;
pub const FREEZE: u64 = 10;
pub const LR: f64 = 2e-3;

/// Two layers of different magnitude; matrices decay, vectors do not. Small
/// enough that no compressed element sits so close to zero that f32 and f64
/// could disagree on its sign over the run.
pub fn layout() -> ParamLayout {
    ParamLayout::from_shapes([
        ("l1.weight".to_string(), vec![24, 40]),
        ("l1.bias".to_string(), vec![24]),
        ("l2.weight".to_string(), vec![8, 24]),
        ("l2.bias".to_string(), vec![8]),
    ])
}

pub fn scales() -> [f32; 4] {
    [1.0, 1.0, 1e-2, 1e-2]
}

pub fn initial(layout: &ParamLayout) -> Vec<f32> {
    let mut rng = SplitMix64::new(42);
    layout
        .segments()
        .iter()
        .zip(scales())
        .flat_map(|(s, scale)| {
            (0..s.len)
                .map(|_| scale * rng.symmetric())
                .collect::<Vec<_>>()
        })
        .collect()
}

pub fn gradient(layout: &ParamLayout, rank: usize, t: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(mix64(t * 1000 + rank as u64));
    layout
        .segments()
        .iter()
        .zip(scales())
        .flat_map(|(s, scale)| {
            (0..s.len)
                .map(|_| scale * (0.3 + rng.normal()))
                .collect::<Vec<_>>()
        })
        .collect()
}

pub fn adam_config() -> OneBitAdamConfig {
    OneBitAdamConfig {
        moments: terse_optim::MomentConfig {
            weight_decay: 0.01,
            eps: 1e-6,
            ..Default::default()
        },
        compression: terse_optim::CompressionConfig {
            freeze_step: FREEZE,
            ..Default::default()
        },
        ..Default::default()
    }
}

pub fn lamb_config() -> OneBitLambConfig {
    OneBitLambConfig {
        moments: terse_optim::MomentConfig {
            weight_decay: 0.01,
            eps: 1e-6,
            ..Default::default()
        },
        compression: terse_optim::CompressionConfig {
            freeze_step: FREEZE,
            ..Default::default()
        },
        ..Default::default()
    }
}
