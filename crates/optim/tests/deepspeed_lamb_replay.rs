//! terse's 1-bit LAMB replayed on the gradients DeepSpeed's own
//! `OnebitLamb.step()` (deepspeed 0.19.6) was given, against the
//! parameters it produced: `tests/fixtures/deepspeed/onebit_lamb.safetensors`,
//! written by `make_onebit_lamb_fixture.py` beside it (DeepSpeed's class
//! unmodified on 1, 2 and 4 simulated workers, its NCCL backend's
//! `compressed_allreduce` followed line by line on the CPU).
//!
//! DeepSpeed's first `step()` only initialises, so its step `t` is terse's
//! `t − 1` and its `freeze_step = 16` is terse's 15.
//!
//! Asserted, on 1, 2 and 4 workers over all 40 steps (15 of warmup, 24 of
//! compression), within 1e-5 relative L2 on every rank after every step,
//! with and without weight decay: terse with DeepSpeed's settings
//! (`scale = "deepspeed"`, `bias_correction = false`,
//! `hold_zero_variance = false`, `decay_blend = true`). The mutations that
//! fail it: terse's L2 chunks, the paper's variance ratio in place of the
//! denominators', and (with weight decay) the factor left unblended.

mod replay_setup;

use std::collections::HashMap;

use replay_setup::{fixture, parameters, relative_l2, replay};

use terse_optim::{
    OneBitLambConfig, OptimizerConfig, ParamLayout, RatioKind, ScaleKind, WithCompression,
    WithMoments, WithOneBitAllreduce,
};

const FIXTURE: &str = "tests/fixtures/deepspeed/onebit_lamb.safetensors";
/// DeepSpeed's steps, the initialisation step included.
const STEPS: u64 = 40;
/// DeepSpeed's `freeze_step`: its steps 2..=16 are the warmup.
const DS_FREEZE: u64 = 16;
const TOLERANCE: f64 = 1e-5;
/// The fixture's runs and their weight decay.
const RUNS: [(&str, f64); 2] = [("decay", 0.1), ("no_decay", 0.0)];

/// The settings that reproduce DeepSpeed's `OnebitLamb` (its defaults
/// for the coefficients and factors).
fn deepspeed_config(weight_decay: f64) -> OneBitLambConfig {
    OneBitLambConfig {
        bias_correction: false,
        c_min: 0.01,
        c_max: 10.0,
        beta_3: 0.9,
        r_min: 0.5,
        r_max: 4.0,
        r_threshold: 0.1,
        decay_blend: true,
        ..OneBitLambConfig::default()
    }
    .with_weight_decay(weight_decay)
    .with_eps(1e-8)
    .with_scale(ScaleKind::DeepSpeed)
    .with_hold_zero_variance(false)
    .with_freeze_step(DS_FREEZE - 1)
}

/// The fixture's parameters as terse lays them out.
fn layout() -> ParamLayout {
    ParamLayout::from_shapes([
        ("a".to_string(), vec![40, 10]),
        ("b".to_string(), vec![23, 13]),
        ("c".to_string(), vec![25, 13]),
    ])
}

/// The largest distance from DeepSpeed's parameters over every step, rank
/// and world size, and where it is. The parameters move little against
/// their size (lr 1e-3 times a coefficient near 0.01), so the distance is
/// taken on the distance travelled from the start: ‖Δa − Δb‖/‖Δb‖.
fn worst_distance(
    f: &HashMap<String, Vec<f32>>,
    run: &str,
    config: &OneBitLambConfig,
) -> (f64, String) {
    let (config, layout) = (OptimizerConfig::OnebitLamb(config.clone()), layout());
    // terse's parameters on every rank after each of DeepSpeed's steps.
    let terse = |world| replay(f, run, world, &config, &layout, STEPS, parameters);
    let moved =
        |x: &[f32], x0: &[f32]| -> Vec<f32> { x.iter().zip(x0).map(|(a, b)| a - b).collect() };
    replay_setup::worst_distance(f, run, DS_FREEZE, terse, |x, ds| {
        relative_l2(&moved(x, ds.x0), &moved(ds.after, ds.x0))
    })
}

#[test]
fn deepspeeds_settings_give_deepspeeds_parameters_across_the_freeze() {
    let f = fixture(FIXTURE);
    for (run, weight_decay) in RUNS {
        let (worst, at) = worst_distance(&f, run, &deepspeed_config(weight_decay));
        println!("{run}: at most {worst:.2e} relative L2 apart ({at})");
        assert!(worst <= TOLERANCE, "{run}: {worst:e} apart at {at}");
    }
}

/// Each of DeepSpeed's settings matters: without it the distance passes
/// the tolerance.
#[test]
fn each_deepspeed_setting_is_needed() {
    let f = fixture(FIXTURE);
    let mutations = [
        (
            "decay",
            "terse's L2 chunks",
            deepspeed_config(0.1).with_scale(ScaleKind::L2),
        ),
        (
            "no_decay",
            "the paper's variance ratio",
            OneBitLambConfig {
                ratio: RatioKind::Variance,
                ..deepspeed_config(0.0)
            },
        ),
        (
            "decay",
            "no decay blend",
            OneBitLambConfig {
                decay_blend: false,
                ..deepspeed_config(0.1)
            },
        ),
    ];
    for (run, what, config) in mutations {
        let (worst, at) = worst_distance(&f, run, &config);
        println!("{run} with {what}: {worst:.2e} relative L2 apart at {at}");
        assert!(
            worst > TOLERANCE,
            "{run} with {what}: still within ({worst:e})"
        );
    }
}
