//! The compressed optimizers' checkpoints, traffic and the eps-inside fix:
//! resume in every stage continues bit-identically, a checkpoint keeps each
//! rank's own state (the error buffers) apart from the state alike on every
//! rank, a checkpoint of another world size or optimizer is refused, compression cuts the bytes per step as
//! ALGORITHMS.md says, and eps inside the root bounds the update that a
//! shared 1-bit scale forces on coordinates with a tiny frozen variance.

use std::time::Duration;
use terse_optim::{WithCompression, WithMoments};

use terse_comm::{Communicator, LocalComm, SparseValues};
use terse_optim::{
    LrSchedule, OneBitAdamConfig, Optimizer, OptimizerConfig, ParamLayout, SlambConfig,
};
use terse_rng::{SplitMix64, mix64};

mod compressed_setup;
use compressed_setup::*;

/// x on every rank after `STEPS` steps, stopping after `stop` to save every
/// rank's state and resuming into fresh optimizers (`None`: never stopped).
fn run_with_stop(
    config: &OptimizerConfig,
    n: usize,
    stop: Option<u64>,
    dir: &std::path::Path,
) -> Vec<Vec<f32>> {
    let layout = layout();
    LocalComm::run(n, Duration::from_secs(120), |comm| {
        let schedule = LrSchedule::Constant { lr: LR };
        let fresh =
            || Optimizer::new(config.clone(), schedule.clone(), layout.clone(), comm).unwrap();
        let mut opt = fresh();
        let mut x = initial(&layout);
        for t in 1..=STEPS {
            let mut g = gradient(&layout, comm.rank(), t);
            opt.step_flat(&mut x, &mut g, comm).unwrap();
            if Some(t) == stop {
                // Local ranks split the warmup's update: the state is
                // gathered whole before it is saved.
                reload_through(dir, &mut opt, comm, fresh);
                assert_eq!(opt.step_count(), t);
            }
        }
        x
    })
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

#[test]
fn resuming_in_any_stage_is_bit_identical() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let auto = adam_config()
        .with_beta_2(0.9)
        .with_freeze(terse_optim::FreezeRule::Auto)
        .with_freeze_threshold(0.5);
    let configs = [
        OptimizerConfig::OnebitAdam(adam_config()),
        OptimizerConfig::OnebitAdam(auto),
        OptimizerConfig::AdamOnebitNaive(adam_config()),
        OptimizerConfig::OnebitLamb(lamb_config()),
        OptimizerConfig::LambOnebitBasic(lamb_config()),
        OptimizerConfig::Slamb(SlambConfig {
            sync_every: 8,
            always_sync_below: 30,
            ..Default::default()
        }),
    ];
    for config in &configs {
        let straight = run_with_stop(config, 2, None, dir);
        // Warmup, the freeze step itself, compression (for SLAMB: between syncs).
        for stop in [5, FREEZE, 13, 20] {
            let resumed = run_with_stop(config, 2, Some(stop), dir);
            for (a, b) in straight.iter().zip(&resumed) {
                let same = a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{}: resumed after step {stop} differs", config.name());
            }
        }
    }
}

#[test]
fn resuming_with_another_world_size_or_optimizer_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let config = OptimizerConfig::OnebitAdam(adam_config());
    run_with_stop(&config, 2, Some(12), dir);
    let path = dir.join("rank0.safetensors");
    let schedule = LrSchedule::Constant { lr: LR };
    let single = terse_comm::SingleRank::new();
    let mut one = Optimizer::new(config.clone(), schedule.clone(), layout(), &single).unwrap();
    let message = one.load(&path).unwrap_err().to_string();
    assert!(
        message.contains("world_size") && message.contains("saved 2, now 1"),
        "{message}"
    );
    let lamb = OptimizerConfig::OnebitLamb(lamb_config());
    let mut other = Optimizer::new(lamb, schedule, layout(), &single).unwrap();
    let message = other.load(&path).unwrap_err().to_string();
    assert!(
        message.contains("saved by optimizer `onebit_adam`"),
        "{message}"
    );
}

/// Rank `rank`'s checkpoint files of `config` after `steps` steps on 2
/// ranks: `(alike, own)` as [`Optimizer::to_checkpoint_bytes`] gives them.
fn checkpoint_bytes(config: &OptimizerConfig, steps: u64) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let layout = layout();
    LocalComm::run(2, Duration::from_secs(120), |comm| {
        let schedule = LrSchedule::Constant { lr: LR };
        let mut opt = Optimizer::new(config.clone(), schedule, layout.clone(), comm).unwrap();
        let mut x = initial(&layout);
        for t in 1..=steps {
            let mut g = gradient(&layout, comm.rank(), t);
            opt.step_flat(&mut x, &mut g, comm).unwrap();
        }
        opt.sync_state(comm).unwrap();
        opt.to_checkpoint_bytes().unwrap()
    })
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

/// A safetensors file's metadata and its tensors by name.
type Parsed = (
    std::collections::HashMap<String, String>,
    std::collections::BTreeMap<String, Vec<u8>>,
);

fn parsed(bytes: &[u8]) -> Parsed {
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let data = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect();
    (header.metadata().clone().unwrap_or_default(), data)
}

#[test]
fn a_checkpoint_keeps_each_ranks_own_state_apart_from_the_state_alike_on_every_rank() {
    // 1-bit Adam in its compression stage: the moments and scalars alike on
    // both ranks, in a file that names no rank; the error buffers each
    // rank's own, in a file that names it.
    let config = OptimizerConfig::OnebitAdam(adam_config());
    let files = checkpoint_bytes(&config, 14);
    let (alike0, alike1) = (parsed(&files[0].0), parsed(&files[1].0));
    let own0 = parsed(files[0].1.as_ref().expect("an own part"));
    let own1 = parsed(files[1].1.as_ref().expect("an own part"));
    assert_eq!(alike0.1, alike1.1, "the moments differ between ranks");
    let names = |p: &Parsed| p.1.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&alike0),
        ["m", "scalar.freeze_history", "scalar.freeze_step", "v"]
    );
    assert_eq!(names(&own0), ["server_error", "worker_error"]);
    assert!(!alike0.0.contains_key("rank"));
    assert_eq!((&own0.0["rank"][..], &own1.0["rank"][..]), ("0", "1"));
    assert_ne!(
        own0.1, own1.1,
        "the errors are alike: the test shows nothing"
    );

    let scratch = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let path = scratch.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let alike = write("alike.safetensors", &files[0].0);
    let own = write("own-0.safetensors", files[0].1.as_ref().unwrap());
    let other_rank = write("own-1.safetensors", files[1].1.as_ref().unwrap());
    let earlier = checkpoint_bytes(&config, 13);
    let earlier_own = write("own-0-step-13.safetensors", earlier[0].1.as_ref().unwrap());
    let refusal = |parts: &[&std::path::Path]| {
        // Rank 0 of 2, as the files were written.
        let result = LocalComm::run(2, Duration::from_secs(30), |comm| {
            let schedule = LrSchedule::Constant { lr: LR };
            let mut opt = Optimizer::new(config.clone(), schedule, layout(), comm).unwrap();
            if comm.rank() == 0 {
                opt.load_parts(parts).map_err(|e| e.to_string())
            } else {
                Ok(())
            }
        });
        result.into_iter().next().unwrap().unwrap()
    };
    refusal(&[&alike, &own]).unwrap();
    let message = refusal(&[&alike]).unwrap_err();
    assert!(
        message.contains("missing state tensor `worker_error`"),
        "{message}"
    );
    let message = refusal(&[&alike, &other_rank]).unwrap_err();
    assert!(
        message.contains("own-1.safetensors") && message.contains("the rank changed"),
        "{message}"
    );
    let message = refusal(&[&alike, &earlier_own]).unwrap_err();
    assert!(
        message.contains("saved at step 13") && message.contains("at step 14"),
        "{message}"
    );

    // AdamW's whole state is alike on every rank: one file naming no rank.
    // SLAMB's is each rank's own: one file naming it.
    let adam = OptimizerConfig::Adam(terse_optim::AdamConfig::default());
    for (rank, (bytes, own)) in checkpoint_bytes(&adam, 3).into_iter().enumerate() {
        assert!(own.is_none());
        assert!(!parsed(&bytes).0.contains_key("rank"), "rank {rank}");
    }
    let slamb = OptimizerConfig::Slamb(SlambConfig::default());
    for (rank, (bytes, own)) in checkpoint_bytes(&slamb, 3).into_iter().enumerate() {
        assert!(own.is_none());
        assert_eq!(parsed(&bytes).0["rank"], rank.to_string());
    }
}

/// Bytes sent per step by rank 0 of a 4-rank world on one 2^18-element
/// segment, over `steps` steps, against the fp32 allreduce of the same buffer.
fn bytes_ratio(config: OptimizerConfig, steps: u64, from: u64) -> f64 {
    let d = 1usize << 18;
    let layout = ParamLayout::from_shapes([("w".to_string(), vec![512, 512])]);
    let sent = LocalComm::run(4, Duration::from_secs(300), |comm| {
        let schedule = LrSchedule::Constant { lr: 1e-4 };
        let mut opt = Optimizer::new(config.clone(), schedule, layout.clone(), comm).unwrap();
        let mut x = vec![0.5f32; d];
        let mut total = 0u64;
        for t in 1..=steps {
            let mut rng = SplitMix64::new(mix64(t ^ ((comm.rank() as u64) << 40)));
            let mut g: Vec<f32> = (0..d).map(|_| rng.normal()).collect();
            let report = opt.step_flat(&mut x, &mut g, comm).unwrap();
            if t >= from {
                total += report.traffic.sent();
            }
        }
        total as f64 / (steps - from + 1) as f64
    });
    let per_step = results_rank0(sent);
    let fp32 = 2.0 * 3.0 / 4.0 * 4.0 * d as f64;
    fp32 / per_step
}

fn results_rank0(results: Vec<std::thread::Result<f64>>) -> f64 {
    results.into_iter().next().unwrap().unwrap()
}

#[test]
fn compression_cuts_the_bytes_per_step() {
    let adam = OptimizerConfig::OnebitAdam(OneBitAdamConfig::default().with_freeze_step(2));
    let ratio = bytes_ratio(adam, 5, 3);
    println!("1-bit Adam compression stage: {ratio:.1}x fewer bytes than fp32");
    assert!(ratio >= 30.0, "1-bit Adam: only {ratio:.1}x");
    let slamb = OptimizerConfig::Slamb(SlambConfig {
        k: 0.1,
        sync_every: 100,
        ..Default::default()
    });
    let ratio = bytes_ratio(slamb, 200, 1);
    println!("SLAMB k = 0.1, H = 100 over 200 steps: {ratio:.2}x (formula 1/(k+1/H) = 9.09x)");
    assert!((8.6..=9.6).contains(&ratio), "SLAMB: {ratio:.2}x");
    let slamb_f16 = OptimizerConfig::Slamb(SlambConfig {
        k: 0.1,
        sync_every: 100,
        values: SparseValues::F16,
        ..Default::default()
    });
    let ratio = bytes_ratio(slamb_f16, 200, 1);
    // fp16 momentum, fp32 model sync: 4 / (2·0.1 + 4/100) = 16.7x.
    println!("SLAMB k = 0.1, H = 100, fp16 values: {ratio:.2}x (formula 16.7x)");
    assert!((16.0..=17.4).contains(&ratio), "SLAMB fp16: {ratio:.2}x");
}

/// fp16 values change SLAMB's trajectory by fp16 rounding only: after the
/// last model sync the ranks agree, and the parameters stay within 1% of
/// the fp32 run's.
#[test]
fn slamb_with_fp16_values_tracks_fp32() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let config = |values| {
        OptimizerConfig::Slamb(SlambConfig {
            k: 0.2,
            sync_every: 8,
            always_sync_below: 30,
            values,
            ..SlambConfig::default()
                .with_weight_decay(0.01)
                .with_eps(1e-6)
        })
    };
    let f32_run = run_with_stop(&config(SparseValues::F32), 4, None, dir);
    let f16_run = run_with_stop(&config(SparseValues::F16), 4, None, dir);
    for x in &f16_run {
        assert_eq!(x, &f16_run[0], "ranks agree after the sync at step {STEPS}");
    }
    let x0 = initial(&layout());
    let (mut diff, mut moved) = (0.0f64, 0.0f64);
    for ((a, b), x0) in f16_run[0].iter().zip(&f32_run[0]).zip(&x0) {
        diff += f64::from(a - b).powi(2);
        moved += f64::from(b - x0).powi(2);
    }
    let relative = (diff / moved).sqrt();
    println!("SLAMB fp16 vs fp32 values: difference {relative:.2e} of the distance moved");
    assert!(relative > 0.0 && relative < 1e-2, "{relative:e}");
}

/// The Tarasov–Ershov mechanism in miniature: one compressed chunk mixes 64
/// coordinates with gradients ~1 and 64 "flat" ones with gradients ~1e-6.
/// After the freeze the chunk's single scale (~1) lands on the flat
/// coordinates, whose frozen variance is ~1e-12: with ε outside the root the
/// update is ~s/sqrt(v) = 1e6 times Adam's; ε inside bounds it by
/// `lr·s/sqrt(ε)`. Two ranks with the same gradient, the problem tiled once
/// per rank so each chunk holds one copy: a world of one does not compress.
#[test]
fn eps_inside_bounds_the_update_of_flat_coordinates() {
    let layout = ParamLayout::from_shapes([
        ("big.weight".to_string(), vec![8, 8]),
        ("flat.weight".to_string(), vec![8, 8]),
        ("copy.big.weight".to_string(), vec![8, 8]),
        ("copy.flat.weight".to_string(), vec![8, 8]),
    ]);
    let lr = 1e-3;
    let largest_flat_update = |config: OptimizerConfig| {
        let results = LocalComm::run(2, Duration::from_secs(60), |comm| {
            let schedule = LrSchedule::Constant { lr };
            let mut opt = Optimizer::new(config.clone(), schedule, layout.clone(), comm).unwrap();
            let mut x = vec![0.0f32; 256];
            let mut largest = 0.0f32;
            for t in 1..=8u64 {
                let mut rng = SplitMix64::new(mix64(t));
                let tile: Vec<f32> = (0..128)
                    .map(|i| rng.normal() * if i < 64 { 1.0 } else { 1e-6 })
                    .collect();
                let mut g = tile.repeat(2);
                let before = x.clone();
                opt.step_flat(&mut x, &mut g, comm).unwrap();
                if t > 5 {
                    let step = (64..128)
                        .map(|i| (x[i] - before[i]).abs())
                        .fold(0.0, f32::max);
                    largest = largest.max(step);
                }
            }
            f64::from(largest)
        });
        results.into_iter().next().unwrap().unwrap()
    };
    let onebit = |eps_mode| {
        OptimizerConfig::OnebitAdam(OneBitAdamConfig {
            bias_correction: true,
            ..OneBitAdamConfig::default()
                .with_eps_mode(eps_mode)
                .with_freeze_step(5)
        })
    };
    let adam = largest_flat_update(OptimizerConfig::Adam(Default::default()));
    let outside = largest_flat_update(onebit(terse_optim::EpsMode::Outside));
    let inside = largest_flat_update(onebit(terse_optim::EpsMode::Inside));
    println!(
        "largest flat-coordinate update after the freeze: Adam {adam:.2e}, \
         1-bit eps outside {outside:.2e}, 1-bit eps inside {inside:.2e}"
    );
    assert!(
        outside >= 1e4 * adam,
        "outside {outside:e} vs Adam {adam:e}"
    );
    // Inside, the denominator is at least sqrt(ε) = 1e-4, so an update is at
    // most lr·|m̂|/1e-4, with |m̂| a few units here.
    let bound = lr * 4.0 / 1e-8f64.sqrt();
    assert!(inside <= bound, "inside {inside:e} above {bound:e}");
    assert!(
        inside * 50.0 <= outside,
        "inside {inside:e} vs outside {outside:e}"
    );
}
