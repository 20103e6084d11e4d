//! The problem the compressed-optimizer tests share: two layers of
//! different magnitude, seeded initial parameters and per-rank gradients,
//! the configs under test (freeze at step 10), and a run of them on `n`
//! thread ranks.

#![allow(dead_code)]

pub mod reference;

use std::time::Duration;

use terse_comm::{Communicator, LocalComm};
use terse_optim::{
    LrSchedule, OneBitAdamConfig, OneBitLambConfig, Optimizer, OptimizerConfig, ParamLayout, Stage,
    WithCompression, WithMoments,
};
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

/// One value for each element of `layout`, in order: `draw()` times its
/// layer's scale.
fn scaled(layout: &ParamLayout, mut draw: impl FnMut() -> f32) -> Vec<f32> {
    layout
        .segments()
        .iter()
        .zip(scales())
        .flat_map(|(s, scale)| (0..s.len).map(|_| scale * draw()).collect::<Vec<_>>())
        .collect()
}

pub fn initial(layout: &ParamLayout) -> Vec<f32> {
    let mut rng = SplitMix64::new(42);
    scaled(layout, || rng.symmetric())
}

pub fn gradient(layout: &ParamLayout, rank: usize, t: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(mix64(t * 1000 + rank as u64));
    scaled(layout, || 0.3 + rng.normal())
}

/// Saves rank `comm`'s state of `opt` into `dir` as a checkpoint keeps it
/// (gathered whole first: local ranks may split it): `rank<r>.safetensors`
/// and, where part of the state is the rank's own, `rank<r>-own.safetensors`.
/// Then replaces `opt` with a `fresh` optimizer that loads them.
pub fn reload_through(
    dir: &std::path::Path,
    opt: &mut Optimizer,
    comm: &LocalComm,
    fresh: impl Fn() -> Optimizer,
) {
    let alike = dir.join(format!("rank{}.safetensors", comm.rank()));
    let own_path = dir.join(format!("rank{}-own.safetensors", comm.rank()));
    opt.sync_state(comm).unwrap();
    let (bytes, own) = opt.to_checkpoint_bytes().unwrap();
    std::fs::write(&alike, bytes).unwrap();
    let mut parts = vec![alike.as_path()];
    if let Some(own) = own {
        std::fs::write(&own_path, own).unwrap();
        parts.push(&own_path);
    }
    *opt = fresh();
    opt.load_parts(&parts).unwrap();
}

pub fn adam_config() -> OneBitAdamConfig {
    OneBitAdamConfig::default()
        .with_weight_decay(0.01)
        .with_eps(1e-6)
        .with_freeze_step(FREEZE)
}

pub fn lamb_config() -> OneBitLambConfig {
    OneBitLambConfig::default()
        .with_weight_decay(0.01)
        .with_eps(1e-6)
        .with_freeze_step(FREEZE)
}

/// x on every rank after every step, and the stage of every step.
pub fn run(config: &OptimizerConfig, n: usize) -> (Vec<Vec<Vec<f32>>>, Vec<Stage>) {
    let layout = layout();
    let results = LocalComm::run(n, Duration::from_secs(120), |comm| {
        let schedule = LrSchedule::Constant { lr: LR };
        let mut opt = Optimizer::new(config.clone(), schedule, layout.clone(), comm).unwrap();
        let mut x = initial(&layout);
        let mut xs = Vec::new();
        let mut stages = Vec::new();
        for t in 1..=STEPS {
            let mut g = gradient(&layout, comm.rank(), t);
            let report = opt.step_flat(&mut x, &mut g, comm).unwrap();
            xs.push(x.clone());
            stages.push(report.stage);
        }
        (xs, stages)
    });
    let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    let stages = results[0].1.clone();
    let per_step = (0..STEPS as usize)
        .map(|s| results.iter().map(|(xs, _)| xs[s].clone()).collect())
        .collect();
    (per_step, stages)
}

/// The parameters of every step on a world of one, as bits.
pub fn bits_at_world_one(config: OptimizerConfig) -> Vec<Vec<u32>> {
    run(&config, 1)
        .0
        .iter()
        .map(|ranks| ranks[0].iter().map(|v| v.to_bits()).collect())
        .collect()
}
