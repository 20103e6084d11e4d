//! terse's 1-bit Adam replayed on the gradients DeepSpeed's own
//! `OnebitAdam.step()` (deepspeed 0.19.6) was given, against the states it
//! produced: `tests/fixtures/deepspeed/onebit_adam.safetensors`, written by
//! `make_deepspeed_fixtures.py` beside it (DeepSpeed's optimizer class
//! unmodified on 1, 2 and 4 simulated workers; its NCCL backend's
//! `compressed_allreduce` followed line by line on the CPU).
//!
//! DeepSpeed's first `step()` only initialises (its gradient is ignored,
//! nothing moves) but counts towards `freeze_step`, so DeepSpeed's step `t`
//! is terse's step `t − 1` and its `freeze_step = 16` is terse's 15.
//!
//! Asserted, on 1, 2 and 4 workers over all 40 steps (15 of warmup, 24 of
//! compression), within 1e-5 relative L2 on every rank after every step:
//! terse with DeepSpeed's settings (`scale = "deepspeed"`: its padded
//! whole-buffer worker scale and per-chunk server scale;
//! `bias_correction = false`; `hold_zero_variance = false`) in two runs:
//! - `plain`: no mask, where the 32 elements that never get a gradient
//!   are moved by hundreds (their compressed momentum over ε) in both;
//! - `masked`: DeepSpeed's `exp_avg_mask` zero on those elements, terse's
//!   `momentum_mask` naming the parameter that holds them;
//! - `non_freeze`: those elements given gradients and put in a DeepSpeed
//!   `non_freeze` group, terse's `non_freeze` naming them.
//!
//! The mutations that fail it: terse's L2 chunks (`scale = "l2"`), bias
//! correction on, `hold_zero_variance` on, the mask left out.

mod replay_setup;

use std::collections::HashMap;

use replay_setup::{fixture, parameters, replay, squared_distance, squared_norm};

use terse_optim::{
    OneBitAdamConfig, OptimizerConfig, ParamLayout, ScaleKind, WithCompression, WithMoments,
    WithOneBitAllreduce,
};

const FIXTURE: &str = "tests/fixtures/deepspeed/onebit_adam.safetensors";
/// DeepSpeed's steps, the initialisation step included.
const STEPS: u64 = 40;
/// DeepSpeed's `freeze_step`: its steps 2..=16 are the warmup.
const DS_FREEZE: u64 = 16;
const TOLERANCE: f64 = 1e-5;

/// The settings that reproduce DeepSpeed's `OnebitAdam`.
fn deepspeed_config(masked: bool) -> OneBitAdamConfig {
    let config = OneBitAdamConfig {
        bias_correction: false,
        ..OneBitAdamConfig::default()
    }
    .with_weight_decay(0.01)
    .with_eps(1e-8)
    .with_scale(ScaleKind::DeepSpeed)
    .with_hold_zero_variance(false)
    .with_freeze_step(DS_FREEZE - 1);
    match masked {
        true => config.with_momentum_mask(vec!["block".into()]),
        false => config,
    }
}

/// DeepSpeed's one flat parameter as three matrices (terse decays
/// matrices only; DeepSpeed decays its whole group), the middle one the 32
/// elements with no gradient, which the mask names (and which the
/// `non_freeze` run gives gradients and never freezes).
fn layout() -> ParamLayout {
    ParamLayout::from_shapes([
        ("before".to_string(), vec![100, 5]),
        ("block".to_string(), vec![32, 1]),
        ("after".to_string(), vec![471, 1]),
    ])
}

/// The largest relative L2 distance from DeepSpeed's parameters over every
/// step, rank and world size, and where it is.
fn worst_distance(
    f: &HashMap<String, Vec<f32>>,
    variant: &str,
    config: &OneBitAdamConfig,
) -> (f64, String) {
    let (config, layout) = (OptimizerConfig::OnebitAdam(config.clone()), layout());
    // terse's parameters on every rank after each of DeepSpeed's steps.
    let terse = |world| replay(f, variant, world, &config, &layout, STEPS, parameters);
    replay_setup::worst_distance(f, variant, DS_FREEZE, terse, |x, ds| {
        relative_l2(x, ds.after, ds.before)
    })
}

/// ‖a − b‖ / max(‖b‖, ‖b_before‖): relative to DeepSpeed's parameters
/// before or after the step, whichever is larger. In the `plain` run the
/// elements with no gradient swing by about 300 a step and some land near
/// zero; f32 rounding of the swing (a few ulps of 300, as much in
/// DeepSpeed as in terse) would read as a large error relative to where
/// they landed.
fn relative_l2(a: &[f32], b: &[f32], b_before: &[f32]) -> f64 {
    let norm = squared_norm(b).max(squared_norm(b_before));
    (squared_distance(a, b) / norm).sqrt()
}

#[test]
fn fixture_is_deepspeeds_initialisation_step() {
    let f = fixture(FIXTURE);
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
fn deepspeeds_settings_give_deepspeeds_parameters_across_the_freeze() {
    let f = fixture(FIXTURE);
    for (variant, masked) in [("plain", false), ("masked", true)] {
        let (worst, at) = worst_distance(&f, variant, &deepspeed_config(masked));
        println!("{variant}: at most {worst:.2e} relative L2 apart ({at})");
        assert!(
            worst <= TOLERANCE,
            "{variant}: parameters {worst:e} apart at {at}"
        );
    }
}

/// DeepSpeed's `non_freeze` group: the block takes Adam steps on the
/// averaged gradient after the freeze, its v still updating, the rest
/// compressed without it. terse's `non_freeze` gives DeepSpeed's
/// parameters; keeping the block out of compression with v frozen
/// (`uncompressed`) does not.
#[test]
fn non_freeze_parameters_take_deepspeeds_adam_steps() {
    let f = fixture(FIXTURE);
    let config = OneBitAdamConfig {
        non_freeze: vec!["block".into()],
        ..deepspeed_config(false)
    };
    let (worst, at) = worst_distance(&f, "non_freeze", &config);
    println!("non_freeze: at most {worst:.2e} relative L2 apart ({at})");
    assert!(worst <= TOLERANCE, "non_freeze: {worst:e} apart at {at}");
    let frozen = deepspeed_config(false).with_uncompressed(vec!["block".into()]);
    let (worst, at) = worst_distance(&f, "non_freeze", &frozen);
    println!("non_freeze as uncompressed (v frozen): {worst:.2e} relative L2 apart at {at}");
    assert!(worst > TOLERANCE, "v frozen: still within ({worst:e})");
}

/// Each of DeepSpeed's settings matters: changing any one of them moves
/// the parameters past the tolerance.
#[test]
fn each_deepspeed_setting_is_needed() {
    let f = fixture(FIXTURE);
    let plain = deepspeed_config(false);
    let masked = deepspeed_config(true);
    let mutations = [
        (
            "plain",
            "terse's L2 chunks",
            plain.clone().with_scale(ScaleKind::L2),
        ),
        (
            "plain",
            "bias correction",
            OneBitAdamConfig {
                bias_correction: true,
                ..plain.clone()
            },
        ),
        (
            "plain",
            "hold_zero_variance",
            plain.clone().with_hold_zero_variance(true),
        ),
        (
            "masked",
            "no momentum_mask",
            masked.clone().with_momentum_mask(Vec::new()),
        ),
    ];
    for (variant, what, config) in mutations {
        let (worst, at) = worst_distance(&f, variant, &config);
        println!("{variant} with {what}: {worst:.2e} relative L2 apart at {at}");
        assert!(
            worst > TOLERANCE,
            "{variant} with {what}: still within {TOLERANCE:e} ({worst:e})"
        );
    }
}
