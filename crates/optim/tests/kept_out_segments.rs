//! The `uncompressed` option of 1-bit Adam and 1-bit LAMB: the parameters it
//! names are synchronised exactly (fp32) in the compression stage while the
//! rest is 1-bit compressed.
//!
//! Two independent checks. (1) With every rank's gradient the same, an exact
//! mean over 2 ranks is the value itself, so a kept-out parameter follows the
//! 1-rank run bit for bit (where nothing is averaged), while the compressed
//! parameters leave it (quantisation). (2) With a different gradient per rank,
//! a kept-out parameter of 1-bit Adam on 4 ranks follows the ablation that
//! sends the whole momentum in fp32, bit for bit.

use std::ops::Range;
use std::time::Duration;
use terse_optim::WithCompression;

use terse_comm::{Communicator, LocalComm};
use terse_optim::{
    LrSchedule, OneBitAdamConfig, OneBitLambConfig, Optimizer, OptimizerConfig, ParamLayout,
    WithOneBitAllreduce,
};
use terse_rng::{SplitMix64, mix64};

const FREEZE: u64 = 8;
const STEPS: u64 = 30;

fn layout() -> ParamLayout {
    ParamLayout::from_shapes([
        ("used.weight".to_string(), vec![16, 20]),
        ("exact.weight".to_string(), vec![12, 20]),
        ("exact.bias".to_string(), vec![12]),
        ("used.bias".to_string(), vec![16]),
    ])
}

fn range(name: &str) -> Range<usize> {
    layout().segment(name).unwrap().range()
}

fn gradient(layout: &ParamLayout, seed: u64, t: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(mix64(t * 1000 + seed));
    (0..layout.len()).map(|_| 0.3 + rng.normal()).collect()
}

/// Rank 0's x after every step; `per_rank` gives each rank its own gradient.
fn run(config: &OptimizerConfig, n: usize, per_rank: bool) -> Vec<Vec<u32>> {
    let layout = layout();
    let results = LocalComm::run(n, Duration::from_secs(120), |comm| {
        let schedule = LrSchedule::Constant { lr: 1e-2 };
        let mut opt = Optimizer::new(config.clone(), schedule, layout.clone(), comm).unwrap();
        let mut x: Vec<f32> = (0..layout.len()).map(|j| 0.01 * j as f32).collect();
        let seed = if per_rank { comm.rank() as u64 } else { 0 };
        (1..=STEPS)
            .map(|t| {
                let mut g = gradient(&layout, seed, t);
                opt.step_flat(&mut x, &mut g, comm).unwrap();
                x.iter().map(|v| v.to_bits()).collect()
            })
            .collect::<Vec<Vec<u32>>>()
    });
    results.into_iter().next().unwrap().unwrap()
}

fn kept_out() -> Vec<String> {
    vec!["exact.*".to_string()]
}

fn onebit_adam() -> OptimizerConfig {
    OptimizerConfig::OnebitAdam(
        OneBitAdamConfig::default()
            .with_freeze_step(FREEZE)
            .with_uncompressed(kept_out()),
    )
}

fn onebit_lamb() -> OptimizerConfig {
    OptimizerConfig::OnebitLamb(
        OneBitLambConfig::default()
            .with_freeze_step(FREEZE)
            .with_uncompressed(kept_out()),
    )
}

#[test]
fn kept_out_parameters_are_averaged_exactly() {
    for config in [onebit_adam(), onebit_lamb()] {
        let name = config.name();
        let (one, two) = (run(&config, 1, false), run(&config, 2, false));
        for t in 0..STEPS as usize {
            for segment in ["exact.weight", "exact.bias"] {
                let r = range(segment);
                assert!(
                    one[t][r.clone()] == two[t][r],
                    "{name}: kept-out `{segment}` differs from the exact run at step {}",
                    t + 1
                );
            }
        }
        // The compressed parameters do feel the 1-bit quantisation.
        let used = range("used.weight");
        let last = STEPS as usize - 1;
        assert!(
            one[last][used.clone()] != two[last][used],
            "{name}: nothing compressed"
        );
    }
}

#[test]
fn a_kept_out_parameter_of_onebit_adam_follows_the_fp32_momentum_ablation() {
    let fp32 =
        OptimizerConfig::OnebitAdamFp32(OneBitAdamConfig::default().with_freeze_step(FREEZE));
    let (ours, exact) = (run(&onebit_adam(), 4, true), run(&fp32, 4, true));
    let (kept, used) = (range("exact.weight"), range("used.weight"));
    for t in 0..STEPS as usize {
        assert!(
            ours[t][kept.clone()] == exact[t][kept.clone()],
            "step {}",
            t + 1
        );
    }
    let last = STEPS as usize - 1;
    assert!(ours[last][used.clone()] != exact[last][used]);
}

#[test]
fn a_pattern_that_names_no_parameter_is_refused() {
    let config = OptimizerConfig::OnebitAdam(
        OneBitAdamConfig::default()
            .with_uncompressed(vec!["embeddings.position.weight".to_string()]),
    );
    let message = LocalComm::run(1, Duration::from_secs(10), |comm| {
        let schedule = LrSchedule::Constant { lr: 1e-2 };
        Optimizer::new(config.clone(), schedule, layout(), comm)
            .err()
            .map(|e| e.to_string())
    })
    .into_iter()
    .next()
    .unwrap()
    .unwrap()
    .expect("refused");
    assert!(
        message.contains("onebit_adam.uncompressed")
            && message.contains("embeddings.position")
            && message.contains("used.weight, exact.weight"),
        "{message}"
    );
}
