//! terse's 1-bit Adam replayed on the gradients DeepSpeed's own
//! `OnebitAdam.step()` (deepspeed 0.19.6) was given, against the states it
//! produced: `tests/fixtures/deepspeed/onebit_adam.safetensors`, written by
//! `make_deepspeed_fixtures.py` beside it (DeepSpeed's optimizer class
//! unmodified on 1, 2 and 4 simulated workers; its NCCL backend's
//! `compressed_allreduce` followed line by line on the CPU).
//!
//! DeepSpeed's first `step()` only initialises (its gradient is ignored,
//! nothing moves) but counts towards `freeze_step`, so DeepSpeed's step `t`
//! is terse's step `t − 1` and its `freeze_step = 4` is terse's 3.
//!
//! What holds today (asserted): through the warmup, terse with
//! `bias_correction = false` (DeepSpeed applies none) gives DeepSpeed's
//! parameters within 1e-6 relative L2 on every world size, and on one
//! worker — where DeepSpeed never compresses — through the whole run.
//! What does not yet (printed, the DeepSpeed-compatibility issue): the
//! compression stage on 2 and 4 workers, where DeepSpeed scales each
//! worker's whole buffer by one L2 RMS (padding included) and terse scales
//! per chunk; and the elements with no gradient, which DeepSpeed moves by
//! hundreds without an `exp_avg_mask` while terse masks them itself.

use std::collections::HashMap;
use std::time::Duration;

use terse_comm::{Communicator, LocalComm};
use terse_optim::{
    LrSchedule, OneBitAdamConfig, Optimizer, OptimizerConfig, ParamLayout, ScaleKind,
    WithCompression, WithMoments,
};

const FIXTURE: &str = "tests/fixtures/deepspeed/onebit_adam.safetensors";
/// DeepSpeed's steps, the initialisation step included.
const STEPS: u64 = 10;
/// DeepSpeed's `freeze_step`: its steps 2..=4 are the warmup.
const DS_FREEZE: u64 = 4;
const ZERO_BLOCK: std::ops::Range<usize> = 500..532;
const TOLERANCE: f64 = 1e-6;

fn fixture() -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(FIXTURE).unwrap_or_else(|e| panic!("{FIXTURE}: {e}"));
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .filter(|(_, view)| view.dtype() == safetensors::Dtype::F32)
        .map(|(name, view)| {
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (name, values)
        })
        .collect()
}

/// terse's parameters on every rank after each of DeepSpeed's steps
/// `2..=STEPS` (index 0: DeepSpeed's step 2).
fn terse_run(f: &HashMap<String, Vec<f32>>, variant: &str, world: usize) -> Vec<Vec<Vec<f32>>> {
    let config = OptimizerConfig::OnebitAdam(
        OneBitAdamConfig::default()
            .with_weight_decay(0.01)
            .with_eps(1e-8)
            .with_scale(ScaleKind::L2)
            .with_freeze_step(DS_FREEZE - 1),
    );
    // A matrix: terse leaves vectors (biases, norms) undecayed, DeepSpeed
    // decays whatever is in the group.
    let layout = ParamLayout::from_shapes([("p".to_string(), vec![17, 59])]);
    let results = LocalComm::run(world, Duration::from_secs(60), |comm| {
        let schedule = LrSchedule::Constant { lr: 1e-3 };
        let mut opt = Optimizer::new(config.clone(), schedule, layout.clone(), comm).unwrap();
        let mut x = f[&format!("{variant}/w{world}/x0")].clone();
        let mut xs = Vec::new();
        for t in 2..=STEPS {
            let mut g = f[&format!("{variant}/w{world}/r{}/t{t}/grad", comm.rank())].clone();
            opt.step_flat(&mut x, &mut g, comm).unwrap();
            xs.push(x.clone());
        }
        xs
    });
    let per_rank: Vec<Vec<Vec<f32>>> = results.into_iter().map(|r| r.unwrap()).collect();
    (0..per_rank[0].len())
        .map(|s| per_rank.iter().map(|xs| xs[s].clone()).collect())
        .collect()
}

/// ‖a − b‖ / ‖b‖ over the elements `keep` selects.
fn relative_l2(a: &[f32], b: &[f32], keep: impl Fn(usize) -> bool) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (_, (&x, &y)) in a.iter().zip(b).enumerate().filter(|(i, _)| keep(*i)) {
        diff += (f64::from(x) - f64::from(y)).powi(2);
        norm += f64::from(y).powi(2);
    }
    (diff / norm).sqrt()
}

#[test]
fn fixture_is_deepspeeds_initialisation_step() {
    let f = fixture();
    for world in [1, 2, 4] {
        let x0 = &f[&format!("plain/w{world}/x0")];
        assert_eq!(&f[&format!("plain/w{world}/r0/t1/params")], x0);
        assert!(
            f[&format!("plain/w{world}/r0/t1/exp_avg")]
                .iter()
                .all(|&m| m == 0.0)
        );
    }
}

#[test]
fn warmup_matches_deepspeed_and_one_worker_throughout() {
    let f = fixture();
    for variant in ["plain", "masked"] {
        for world in [1, 2, 4] {
            let terse = terse_run(&f, variant, world);
            for (s, ranks) in terse.iter().enumerate() {
                let t = s as u64 + 2;
                let compressing = t > DS_FREEZE;
                for (rank, x) in ranks.iter().enumerate() {
                    let ds = &f[&format!("{variant}/w{world}/r{rank}/t{t}/params")];
                    let everywhere = relative_l2(x, ds, |_| true);
                    let outside = relative_l2(x, ds, |i| !ZERO_BLOCK.contains(&i));
                    if !compressing {
                        assert!(
                            everywhere <= TOLERANCE,
                            "{variant}, {world} worker(s), rank {rank}, DeepSpeed step {t} \
                             (warmup): parameters {everywhere:e} apart"
                        );
                    } else if world == 1 {
                        // No compression on one worker in DeepSpeed: the same
                        // steps, but for the elements with a frozen v of 0,
                        // which terse masks (no weight decay) and DeepSpeed
                        // decays.
                        assert!(
                            outside <= TOLERANCE,
                            "{variant}, 1 worker, DeepSpeed step {t}: parameters {outside:e} \
                             apart outside the elements with no gradient"
                        );
                    }
                    if compressing && rank == 0 {
                        println!(
                            "{variant}, {world} worker(s), DeepSpeed step {t} (compression \
                             stage): {everywhere:.2e} relative L2 apart, {outside:.2e} outside \
                             the elements with no gradient"
                        );
                    }
                }
            }
        }
    }
}
