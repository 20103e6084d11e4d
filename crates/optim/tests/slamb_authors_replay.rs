//! terse's SLAMB replayed on the gradients the SLAMB authors' own `Slamb`
//! (hangxu0304/SLAMB, `Swin-Transformer/optimizer.py`) was given, against
//! the parameters it produced: `tests/fixtures/slamb_authors/
//! slamb_authors.safetensors`, written by `make_slamb_authors_fixture.py`
//! beside it (the authors' class unmodified, 1, 2 and 4 workers as gloo
//! processes, its mask's permutation set to terse's `mask = "cyclic"`).
//!
//! Asserted, on 1, 2 and 4 workers over all 40 steps (model averages after
//! steps 1, 9, 17, 25, 33; the mask's ten chunks four times over), within
//! 1e-5 of the distance the authors' parameters travelled (L2, beyond one
//! f32 spacing per element: see [`beyond_rounding`]), on every rank after
//! every step, for the authors' defaults (c_max 1000, β3 0.99) and with a
//! binding clip (c_max 0.3, β3 0.9): terse with `compat = "authors"`. The
//! mutations that fail it: the paper's rules (`compat = "paper"`: each
//! ratio clipped, 1-D parameters masked and clipped like the rest, the
//! model averaged after steps 8, 16, …), no bias correction, another
//! mask, and β3 off by 0.01.

mod replay_setup;

use std::collections::HashMap;

use replay_setup::{Run, fixture, parameters, replay_steps, squared_distance, squared_norm};

use terse_optim::{MaskKind, OptimizerConfig, ParamLayout, SlambCompat, SlambConfig, WithMoments};

const FIXTURE: &str = "tests/fixtures/slamb_authors/slamb_authors.safetensors";
const STEPS: u64 = 40;
const LR: f64 = 0.01;
const TOLERANCE: f64 = 1e-5;
/// The fixture's runs: (name, c_min, c_max, β3).
const RUNS: [(&str, f64, f64, f64); 2] = [
    ("defaults", 0.01, 1000.0, 0.99),
    ("clipped", 0.01, 0.3, 0.9),
];

/// The settings of the authors' class as the fixture ran it.
fn authors_config((c_min, c_max, beta_3): (f64, f64, f64)) -> SlambConfig {
    SlambConfig {
        bias_correction: true,
        k: 0.1,
        beta_3,
        sync_every: 8,
        phi_min: c_min,
        phi_max: c_max,
        mask: MaskKind::Cyclic,
        mask_seed: 44,
        always_sync_below: 100,
        compat: SlambCompat::Authors,
        ..SlambConfig::default()
    }
    .with_eps(1e-6)
    .with_weight_decay(0.01)
}

/// The fixture's parameters as terse lays them out (the matrices take
/// weight decay, the vectors none, as the authors' groups).
fn layout() -> ParamLayout {
    ParamLayout::from_shapes([
        ("small".to_string(), vec![8, 10]),
        ("a".to_string(), vec![20, 30]),
        ("b".to_string(), vec![22, 15]),
        ("long_bias".to_string(), vec![150]),
        ("bias".to_string(), vec![20]),
    ])
}

/// How much farther apart `a` and `b` are than one f32 spacing of `b` per
/// element, `max(0, ‖a − b‖ − ‖ulp(b)‖)`: the authors average the
/// workers' parameters through gloo, which sums in its own order, so the
/// two sides of a model average legitimately differ in the last bit of
/// every element (1.6e-5 of the first step's travel on 4 workers).
fn beyond_rounding(a: &[f32], b: &[f32]) -> f64 {
    let ulps: Vec<f32> = b.iter().map(|&y| y.abs().next_up() - y.abs()).collect();
    (squared_distance(a, b).sqrt() - squared_norm(&ulps).sqrt()).max(0.0)
}

/// The largest distance of terse's parameters from the authors' over every
/// step, rank and world size, and where it is: the distance beyond
/// rounding ([`beyond_rounding`]) relative to ‖Δauthors‖, the distance
/// the authors' parameters travelled from the start.
fn worst_distance(f: &HashMap<String, Vec<f32>>, run: &str, config: &SlambConfig) -> (f64, String) {
    let (config, layout) = (OptimizerConfig::Slamb(config.clone()), layout());
    let mut worst = (0.0f64, String::new());
    for world in [1, 2, 4] {
        let x0 = &f[&format!("{run}/w{world}/x0")];
        let moved = |x: &[f32]| -> Vec<f32> { x.iter().zip(x0).map(|(a, b)| a - b).collect() };
        let replayed = replay_steps(
            f,
            Run {
                name: run,
                world,
                lr: LR,
            },
            &config,
            &layout,
            1..=STEPS,
            parameters,
        );
        for (s, ranks) in replayed.iter().enumerate() {
            let t = s + 1;
            for (rank, x) in ranks.iter().enumerate() {
                let theirs = &f[&format!("{run}/w{world}/r{rank}/t{t}/params")];
                let apart = beyond_rounding(x, theirs) / squared_norm(&moved(theirs)).sqrt();
                if apart > worst.0 || apart.is_nan() {
                    worst = (apart, format!("{world} worker(s), rank {rank}, step {t}"));
                }
            }
        }
    }
    worst
}

#[test]
fn the_authors_rules_give_the_authors_parameters() {
    let f = fixture(FIXTURE);
    for (run, c_min, c_max, beta_3) in RUNS {
        let (worst, at) = worst_distance(&f, run, &authors_config((c_min, c_max, beta_3)));
        println!("{run}: at most {worst:.2e} relative L2 apart ({at})");
        assert!(worst <= TOLERANCE, "{run}: {worst:e} apart at {at}");
    }
}

/// Each of the authors' rules matters: without it the distance passes the
/// tolerance on at least one run.
#[test]
fn the_papers_rules_are_not_the_authors() {
    let f = fixture(FIXTURE);
    for (run, c_min, c_max, beta_3) in RUNS {
        let authors = authors_config((c_min, c_max, beta_3));
        let mutations = [
            (
                "the paper's rules",
                SlambConfig {
                    compat: SlambCompat::Paper,
                    ..authors.clone()
                },
            ),
            (
                "no bias correction",
                SlambConfig {
                    bias_correction: false,
                    ..authors.clone()
                },
            ),
            (
                "another mask (seed 45)",
                SlambConfig {
                    mask_seed: 45,
                    ..authors.clone()
                },
            ),
            (
                "beta_3 off by 0.01",
                SlambConfig {
                    beta_3: beta_3 - 0.01,
                    ..authors.clone()
                },
            ),
        ];
        for (what, config) in mutations {
            let (worst, at) = worst_distance(&f, run, &config);
            println!("{run} with {what}: {worst:.2e} relative L2 apart at {at}");
            assert!(
                worst > TOLERANCE,
                "{run} with {what}: still within ({worst:e})"
            );
        }
    }
}
