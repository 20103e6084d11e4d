//! Shared by the replays against the reference optimizers' own code
//! (DeepSpeed's, the SLAMB authors'): the fixtures' tensors, terse stepped
//! on their gradients, and distances in float64.

#![allow(dead_code)]

use std::collections::HashMap;

/// Every f32 and i32 tensor of the safetensors file at `path` (relative to
/// the crate), flat, the i32 ones as f32 values (flags and counts); other
/// dtypes (DeepSpeed's float64 coefficients, kept for reading by hand)
/// are left out.
pub fn fixture(path: &str) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .filter_map(|(name, view)| {
            let value: fn([u8; 4]) -> f32 = match view.dtype() {
                safetensors::Dtype::F32 => f32::from_le_bytes,
                safetensors::Dtype::I32 => |b| i32::from_le_bytes(b) as f32,
                _ => return None,
            };
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| value(b.try_into().unwrap()))
                .collect();
            Some((name, values))
        })
        .collect()
}

/// `Σv²`.
pub fn squared_norm(v: &[f32]) -> f64 {
    v.iter().map(|&y| f64::from(y).powi(2)).sum()
}

/// `‖a − b‖²`.
pub fn squared_distance(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum()
}

/// `‖a − b‖ / ‖b‖`.
pub fn relative_l2(a: &[f32], b: &[f32]) -> f64 {
    (squared_distance(a, b) / squared_norm(b)).sqrt()
}

/// terse's parameters on every rank of a `world` of local ranks after each
/// of DeepSpeed's steps `2..=steps` (DeepSpeed's first step only
/// initialises; index 0 is its step 2), stepping `config` on `layout` at
/// DeepSpeed's constant rate from the fixture's `{run}/w{world}/x0` with
/// each rank's `{run}/w{world}/r{rank}/t{step}/grad`: `[step][rank]`.
/// Of each step, `keep` takes what it needs from the parameters after it
/// and the step's report (the parameters alone: [`parameters`]).
pub fn replay<T: Clone + Send>(
    f: &HashMap<String, Vec<f32>>,
    run: &str,
    world: usize,
    config: &terse_optim::OptimizerConfig,
    layout: &terse_optim::ParamLayout,
    steps: u64,
    keep: impl Fn(&[f32], &terse_optim::StepReport) -> T + Sync,
) -> Vec<Vec<T>> {
    let run = Run {
        name: run,
        world,
        lr: 1e-3,
    };
    replay_steps(f, run, config, layout, 2..=steps, keep)
}

/// One of a fixture's runs: its name, world size and constant rate.
pub struct Run<'a> {
    pub name: &'a str,
    pub world: usize,
    pub lr: f64,
}

/// [`replay`] over the reference's `steps`, each one a step of terse's.
pub fn replay_steps<T: Clone + Send>(
    f: &HashMap<String, Vec<f32>>,
    Run {
        name: run,
        world,
        lr,
    }: Run<'_>,
    config: &terse_optim::OptimizerConfig,
    layout: &terse_optim::ParamLayout,
    steps: std::ops::RangeInclusive<u64>,
    keep: impl Fn(&[f32], &terse_optim::StepReport) -> T + Sync,
) -> Vec<Vec<T>> {
    use terse_comm::{Communicator, LocalComm};
    use terse_optim::{LrSchedule, Optimizer};
    let results = LocalComm::run(world, std::time::Duration::from_secs(60), |comm| {
        let schedule = LrSchedule::Constant { lr };
        let mut opt = Optimizer::new(config.clone(), schedule, layout.clone(), comm).unwrap();
        let mut x = f[&format!("{run}/w{world}/x0")].clone();
        steps
            .clone()
            .map(|t| {
                let mut g = f[&format!("{run}/w{world}/r{}/t{t}/grad", comm.rank())].clone();
                let report = opt.step_flat(&mut x, &mut g, comm).unwrap();
                keep(&x, &report)
            })
            .collect::<Vec<_>>()
    });
    let per_rank: Vec<Vec<T>> = results.into_iter().map(|r| r.unwrap()).collect();
    (0..per_rank[0].len())
        .map(|s| per_rank.iter().map(|xs| xs[s].clone()).collect())
        .collect()
}

/// What [`replay`] keeps where only the parameters are compared.
pub fn parameters(x: &[f32], _: &terse_optim::StepReport) -> Vec<f32> {
    x.to_vec()
}

/// DeepSpeed's parameters of one rank around one of its steps, and at the
/// start: what a distance from terse's parameters is measured against.
pub struct Around<'a> {
    pub x0: &'a [f32],
    pub before: &'a [f32],
    pub after: &'a [f32],
}

/// The largest `distance` of terse's parameters from DeepSpeed's over every
/// step and rank of `run` on 1, 2 and 4 workers (`terse(world)`: terse's
/// parameters as [`replay`] returns them), and where it is; steps after
/// DeepSpeed's `freeze` are named the compression stage.
pub fn worst_distance(
    f: &HashMap<String, Vec<f32>>,
    run: &str,
    freeze: u64,
    terse: impl Fn(usize) -> Vec<Vec<Vec<f32>>>,
    distance: impl Fn(&[f32], Around<'_>) -> f64,
) -> (f64, String) {
    let mut worst = (0.0f64, String::new());
    for world in [1, 2, 4] {
        let x0 = &f[&format!("{run}/w{world}/x0")];
        for (s, ranks) in terse(world).iter().enumerate() {
            let t = s as u64 + 2;
            for (rank, x) in ranks.iter().enumerate() {
                let params = |t: u64| &f[&format!("{run}/w{world}/r{rank}/t{t}/params")];
                let around = Around {
                    x0,
                    before: params(t - 1),
                    after: params(t),
                };
                let apart = distance(x, around);
                if apart > worst.0 || apart.is_nan() {
                    let stage = if t > freeze { "compression" } else { "warmup" };
                    worst = (
                        apart,
                        format!("{world} worker(s), rank {rank}, DeepSpeed step {t} ({stage})"),
                    );
                }
            }
        }
    }
    worst
}
