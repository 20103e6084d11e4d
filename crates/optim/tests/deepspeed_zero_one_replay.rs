//! terse's 0/1 Adam replayed on the gradients DeepSpeed's own
//! `ZeroOneAdam.step()` (deepspeed 0.19.6) was given, against what it did:
//! `tests/fixtures/deepspeed/zero_one_adam.safetensors`, written by
//! `make_zero_one_adam_fixture.py` beside it (DeepSpeed's class unmodified
//! on 1, 2 and 4 simulated workers, its NCCL `compressed_allreduce`
//! followed line by line on the CPU, counted per step).
//!
//! DeepSpeed's first `step()` only initialises, so its step `s` is terse's
//! `t = s − 1`; terse's schedules test `t + 1` for that reason.
//!
//! Asserted:
//! - the schedules: on every step and world, terse averages the gradient
//!   exactly where DeepSpeed's optimizer left the engine's allreduce on,
//!   compresses where DeepSpeed called its compressed allreduce, and sends
//!   nothing where DeepSpeed did not (both runs: every variance step exact,
//!   and κ = 2 with compressed steps between variance updates);
//! - the parameters, within 1e-6 relative L2 with `scale = "deepspeed"`
//!   (DeepSpeed's compression geometry): on 2 and 4 workers through the
//!   whole of both runs (variance stage, compressed gradients, freeze,
//!   local steps, synchronisations); on one worker through the `exact`
//!   run.
//!
//! Printed, not asserted: one worker's off-schedule variance steps, where
//! DeepSpeed leaves m unchanged (it skips the compressed allreduce and the
//! momentum update with it) and terse updates it from the gradient
//! (ALGORITHMS.md "0/1 Adam").

mod replay_setup;

use std::collections::HashMap;

use replay_setup::{fixture, relative_l2, replay};

use terse_optim::{
    OneBitAllreduceConfig, OptimizerConfig, ParamLayout, ScaleKind, Stage, WithMoments,
    ZeroOneAdamConfig,
};

const FIXTURE: &str = "tests/fixtures/deepspeed/zero_one_adam.safetensors";
/// DeepSpeed's steps, the initialisation step included.
const DS_STEPS: u64 = 24;
const TOLERANCE: f64 = 1e-6;
/// The fixture's runs and their `var_update_scaler`.
const RUNS: [(&str, u64); 2] = [("exact", 100), ("schedule", 2)];

/// terse's parameters and stage on every rank after each of DeepSpeed's
/// steps `2..=DS_STEPS` (index 0: DeepSpeed's step 2).
fn terse_run(
    f: &HashMap<String, Vec<f32>>,
    run: &str,
    var_update_scaler: u64,
    world: usize,
) -> Vec<Vec<(Vec<f32>, Stage)>> {
    let config = OptimizerConfig::ZeroOneAdam(ZeroOneAdamConfig {
        var_freeze_step: 9,
        var_update_scaler,
        local_step_scaler: 3,
        local_step_clipper: 4,
        allreduce: OneBitAllreduceConfig {
            scale: ScaleKind::DeepSpeed,
            ..OneBitAllreduceConfig::default()
        },
        ..ZeroOneAdamConfig::default()
            .with_weight_decay(0.01)
            .with_eps(1e-8)
    });
    // A matrix: terse leaves vectors undecayed, DeepSpeed decays its group.
    let layout = ParamLayout::from_shapes([("p".to_string(), vec![17, 59])]);
    replay(f, run, world, &config, &layout, DS_STEPS, |x, report| {
        (x.to_vec(), report.stage)
    })
}

/// What DeepSpeed's step `s` sent, as terse names it.
fn deepspeed_stage(f: &HashMap<String, Vec<f32>>, run: &str, world: usize, s: u64) -> Stage {
    let exact = f[&format!("{run}/w{world}/r0/t{s}/exact_gradient")][0] == 1.0;
    let compressed = f[&format!("{run}/w{world}/r0/t{s}/compressed_calls")][0] == 1.0;
    match (exact, compressed) {
        (true, false) => Stage::Warmup,
        (false, true) => Stage::Compression,
        (false, false) => Stage::Local,
        (true, true) => panic!("{run}, {world} workers, step {s}: exact and compressed"),
    }
}

#[test]
fn fixture_is_deepspeeds_initialisation_step() {
    let f = fixture(FIXTURE);
    for (run, _) in RUNS {
        for world in [1, 2, 4] {
            let x0 = &f[&format!("{run}/w{world}/x0")];
            assert_eq!(&f[&format!("{run}/w{world}/r0/t1/params")], x0);
        }
    }
}

#[test]
fn schedules_and_parameters_match_deepspeed() {
    let f = fixture(FIXTURE);
    for (run, scaler) in RUNS {
        for world in [1usize, 2, 4] {
            let terse = terse_run(&f, run, scaler, world);
            let mut departed = false;
            let (mut worst, mut checked) = (0.0f64, 0);
            for (i, ranks) in terse.iter().enumerate() {
                let s = i as u64 + 2;
                let theirs = deepspeed_stage(&f, run, world, s);
                // One worker: DeepSpeed never calls its compressed
                // allreduce, terse's returns its input; the kind of step
                // is still the schedule's.
                let ours = ranks[0].1;
                let expected = match (world, theirs, ours) {
                    (1, Stage::Local, Stage::Compression) => Stage::Compression,
                    _ => theirs,
                };
                assert_eq!(ours, expected, "{run}, {world} workers, DeepSpeed step {s}");
                // Where the two part ways: on one worker, DeepSpeed's
                // first off-schedule variance step (its variance stage is
                // steps 2..=10).
                departed |= world == 1 && ours == Stage::Compression && s <= 10;
                for (rank, (x, _)) in ranks.iter().enumerate() {
                    let ds = &f[&format!("{run}/w{world}/r{rank}/t{s}/params")];
                    let apart = relative_l2(x, ds);
                    if !departed {
                        worst = worst.max(apart);
                        checked += usize::from(rank == 0);
                        assert!(
                            apart <= TOLERANCE,
                            "{run}, {world} worker(s), rank {rank}, DeepSpeed step {s} \
                             ({ours}): parameters {apart:e} apart"
                        );
                    } else if rank == 0 {
                        println!(
                            "{run}, 1 worker, DeepSpeed step {s} ({ours}, after an \
                             off-schedule variance step): {apart:.2e} relative L2 apart"
                        );
                    }
                }
            }
            println!(
                "{run}, {world} worker(s): DeepSpeed steps 2..={} asserted, at most {worst:.2e} \
                 relative L2 apart",
                checked + 1
            );
        }
    }
}
