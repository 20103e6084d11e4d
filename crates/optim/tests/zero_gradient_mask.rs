//! Coordinates whose gradient is always zero do not move in the compression
//! stage (issue: sign(0) = +1 gave them ±scale and an update of lr·scale/ε).
//!
//! Three segments: `used` has a gradient on every rank, `dead` is zero on
//! every rank at every step (an embedding row no token uses), `partly` is
//! zero on every rank but rank 0 (a row only one rank's data reaches). After
//! the freeze and 50 compression steps, with a save and load of every rank's
//! state in the middle, `dead` is bit-identical to its value at the freeze,
//! for 1-bit Adam and 1-bit LAMB on 1, 2 and 4 ranks; `partly` (whose
//! variance is not zero) keeps training.

use std::time::Duration;
use terse_optim::{WithCompression, WithMoments};

use terse_comm::{Communicator, LocalComm};
use terse_optim::{
    LrSchedule, OneBitAdamConfig, OneBitLambConfig, Optimizer, OptimizerConfig, ParamLayout,
};
use terse_rng::{SplitMix64, mix64};

const FREEZE: u64 = 10;
const COMPRESSION_STEPS: u64 = 50;
const SAVE_AT: u64 = FREEZE + 20;

fn layout() -> ParamLayout {
    ParamLayout::from_shapes([
        ("used.weight".to_string(), vec![16, 20]),
        ("dead.weight".to_string(), vec![12, 20]),
        ("partly.weight".to_string(), vec![6, 20]),
        ("used.bias".to_string(), vec![16]),
    ])
}

fn initial(layout: &ParamLayout) -> Vec<f32> {
    let mut rng = SplitMix64::new(7);
    (0..layout.len()).map(|_| 0.1 * rng.symmetric()).collect()
}

fn gradient(layout: &ParamLayout, rank: usize, t: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(mix64(t * 1000 + rank as u64));
    layout
        .segments()
        .iter()
        .flat_map(|segment| {
            let live = match segment.path.as_str() {
                "dead.weight" => false,
                "partly.weight" => rank == 0,
                _ => true,
            };
            (0..segment.len)
                .map(|_| {
                    let g = 0.3 + rng.normal();
                    if live { g } else { 0.0 }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every rank's x at the freeze and at the end.
fn run(config: &OptimizerConfig, n: usize, dir: &std::path::Path) -> Vec<(Vec<f32>, Vec<f32>)> {
    let layout = layout();
    LocalComm::run(n, Duration::from_secs(120), |comm| {
        let schedule = LrSchedule::Constant { lr: 1e-3 };
        let fresh =
            || Optimizer::new(config.clone(), schedule.clone(), layout.clone(), comm).unwrap();
        let mut opt = fresh();
        let mut x = initial(&layout);
        let mut at_freeze = Vec::new();
        for t in 1..=FREEZE + COMPRESSION_STEPS {
            let mut g = gradient(&layout, comm.rank(), t);
            opt.step_flat(&mut x, &mut g, comm).unwrap();
            if t == FREEZE {
                at_freeze = x.clone();
            }
            if t == SAVE_AT {
                let path = dir.join(format!("rank{}-of-{n}.safetensors", comm.rank()));
                // Local ranks split the update: the state is gathered whole
                // before it is saved.
                opt.sync_state(comm).unwrap();
                opt.save(&path).unwrap();
                opt = fresh();
                opt.load(&path).unwrap();
            }
        }
        (at_freeze, x)
    })
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

fn check(name: &str, config: OptimizerConfig) {
    let scratch = tempfile::Builder::new()
        .prefix(&format!("terse-zero-mask-{name}-"))
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let layout = layout();
    let segment = |name: &str| {
        layout
            .segments()
            .iter()
            .find(|s| s.path == name)
            .unwrap()
            .range()
    };
    let (dead, partly, used) = (
        segment("dead.weight"),
        segment("partly.weight"),
        segment("used.weight"),
    );
    for n in [1, 2, 4] {
        let ranks = run(&config, n, dir);
        for (rank, (at_freeze, end)) in ranks.iter().enumerate() {
            assert!(
                end.iter().all(|v| v.is_finite()),
                "{name} n={n}: not finite"
            );
            assert_eq!(
                end[dead.clone()]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                at_freeze[dead.clone()]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                "{name} n={n} rank {rank}: a zero-gradient coordinate moved after the freeze"
            );
            for (what, range) in [("partly", &partly), ("used", &used)] {
                let moved = end[range.clone()]
                    .iter()
                    .zip(&at_freeze[range.clone()])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                // 50 steps of lr 1e-3 with |m̂/√v̂| around 1.
                assert!(
                    moved > 1e-3 && moved < 1.0,
                    "{name} n={n} rank {rank}: `{what}` moved by {moved}"
                );
            }
        }
        for (rank, (_, end)) in ranks.iter().enumerate().skip(1) {
            assert_eq!(
                end.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                ranks[0].1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{name} n={n}: rank {rank} differs from rank 0"
            );
        }
    }
}

#[test]
fn onebit_adam_leaves_zero_gradient_coordinates_where_the_freeze_found_them() {
    check(
        "onebit_adam",
        OptimizerConfig::OnebitAdam(OneBitAdamConfig {
            bias_correction: true,
            ..OneBitAdamConfig::default()
                .with_weight_decay(0.01)
                .with_freeze_step(FREEZE)
        }),
    );
}

#[test]
fn onebit_lamb_leaves_zero_gradient_coordinates_where_the_freeze_found_them() {
    check(
        "onebit_lamb",
        OptimizerConfig::OnebitLamb(OneBitLambConfig {
            bias_correction: true,
            ..OneBitLambConfig::default()
                .with_weight_decay(0.01)
                .with_freeze_step(FREEZE)
        }),
    );
}
