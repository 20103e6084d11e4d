//! The optimizers' device kernels on a real Vulkan device (Mesa's lavapipe
//! on machines without a GPU) against their CPU loops: the same steps on
//! random buffers of 1, 33 and 2^20 + 7 elements and a layout of several
//! segments with and without weight decay, for Adam (ε outside and inside,
//! with and without bias correction), LAMB (with pre-normalisation and with
//! trust on decayed segments only), SGD (plain and Nesterov) and the 1-bit
//! Adam and 1-bit LAMB families (on one rank and on two: warmup, freeze at a
//! step or by the auto rule, compression stage, the ablation baselines) and
//! SLAMB (hash and cyclic masks, fp32 and fp16 values, the model average
//! every 3 steps); the 1-bit optimizers also with parameters kept out of
//! compression.
//! The
//! parameters after every step agree within 1e-6 relative; a state saved
//! from the device loads on the host and continues there like the host run,
//! and a device run saved, loaded and continued on the device is
//! bit-identical to one never stopped.

use std::time::Duration;

use burn::tensor::{Device, DeviceKind};
use terse_comm::{Communicator, LocalComm, SingleRank, SparseValues};
use terse_optim::{
    AdamConfig, DeviceFlat, EpsMode, FreezeRule, LambConfig, LrSchedule, MaskKind,
    OneBitAdamConfig, OneBitLambConfig, Optimizer, OptimizerConfig, ParamLayout, RatioKind,
    ScaleKind, SgdConfig, SlambCompat, SlambConfig, Stage, WithMoments, WithOneBitAllreduce,
    ZeroOneAdamConfig,
};
use terse_rng::SplitMix64;

const STEPS: usize = 4;

fn lavapipe() -> Device {
    assert!(
        std::env::var_os("XDG_RUNTIME_DIR").is_some(),
        "set XDG_RUNTIME_DIR (e.g. /tmp)"
    );
    Device::wgpu(DeviceKind::Cpu)
}

fn schedule() -> LrSchedule {
    LrSchedule::LinearWarmupPolyDecay {
        peak: 1e-2,
        warmup_steps: 2,
        total_steps: 20,
        power: 0.5,
        end_lr: 0.0,
    }
}

fn layouts() -> Vec<(&'static str, ParamLayout)> {
    let shapes = |list: &[(&str, &[usize])]| {
        ParamLayout::from_shapes(list.iter().map(|(p, s)| (p.to_string(), s.to_vec())))
    };
    vec![
        ("one element", shapes(&[("b", &[1])])),
        ("33 elements", shapes(&[("w", &[3, 11])])),
        (
            "2^20 + 7 elements",
            shapes(&[("w", &[1024, 1024]), ("b", &[7])]),
        ),
        (
            "several segments",
            shapes(&[
                ("w0", &[5, 7]),
                ("b0", &[7]),
                ("w1", &[300, 70]),
                ("b1", &[1]),
                ("norm", &[4100]),
                ("w2", &[2, 4097]),
            ]),
        ),
    ]
}

fn configs() -> Vec<OptimizerConfig> {
    let mut all = vec![
        OptimizerConfig::Adam(AdamConfig::default().with_weight_decay(0.01)),
        OptimizerConfig::Adam({
            let mut c = AdamConfig {
                bias_correction: false,
                ..AdamConfig::default()
            };
            c.moments.eps_mode = EpsMode::Inside;
            c.moments.eps = 1e-6;
            c
        }),
        OptimizerConfig::Lamb(LambConfig {
            grad_prenorm: true,
            bias_correction: true,
            ..LambConfig::default().with_weight_decay(0.01)
        }),
        OptimizerConfig::Lamb(LambConfig {
            trust_decay_only: true,
            ..LambConfig::default().with_weight_decay(0.1)
        }),
        OptimizerConfig::Sgd(SgdConfig {
            weight_decay: 1e-4,
            ..Default::default()
        }),
        OptimizerConfig::Sgd(SgdConfig {
            nesterov: true,
            ..Default::default()
        }),
        // One rank compresses nothing, but the stages still run: the
        // warmup, the freeze (at a step, or by the auto rule from Σ|v|,
        // here Δ = 2) and the frozen-variance update.
        OptimizerConfig::OnebitAdam({
            let mut c = OneBitAdamConfig::default().with_weight_decay(0.01);
            c.compression.freeze_step = 2;
            c
        }),
        OptimizerConfig::OnebitAdam({
            let mut c = OneBitAdamConfig::default();
            c.moments.beta_2 = 0.5;
            c.compression.freeze = FreezeRule::Auto;
            c
        }),
        OptimizerConfig::OnebitLamb(onebit_lamb()),
    ];
    all.extend(in_both_lists());
    all
}

/// The configs both lists hold: 1-bit LAMB as DeepSpeed's with the decay
/// blend, the basic 1-bit LAMB, 0/1 Adam (terse's and DeepSpeed's
/// settings) and SLAMB.
fn in_both_lists() -> [OptimizerConfig; 5] {
    [
        OptimizerConfig::OnebitLamb(OneBitLambConfig {
            decay_blend: true,
            ..deepspeed(onebit_lamb())
        }),
        OptimizerConfig::LambOnebitBasic(onebit_lamb()),
        OptimizerConfig::ZeroOneAdam(zero_one()),
        OptimizerConfig::ZeroOneAdam(deepspeed(zero_one())),
        OptimizerConfig::Slamb(slamb()),
    ]
}

fn slamb() -> SlambConfig {
    SlambConfig {
        sync_every: 3,
        always_sync_below: 1000,
        ..SlambConfig::default().with_weight_decay(0.01)
    }
}

fn onebit_lamb() -> OneBitLambConfig {
    let mut c = OneBitLambConfig::default().with_weight_decay(0.01);
    c.compression.freeze_step = 2;
    c
}

struct Problem {
    x0: Vec<f32>,
    grads: Vec<Vec<f32>>,
}

fn problem(len: usize, seed: u64) -> Problem {
    let mut rng = SplitMix64::new(seed);
    let x0 = (0..len).map(|_| rng.normal()).collect();
    let grads = (0..2 * STEPS)
        .map(|_| (0..len).map(|_| 0.1 * rng.normal()).collect())
        .collect();
    Problem { x0, grads }
}

/// Largest `|a - b| / max(|b|, rms(b))` (the rms keeps elements that happen
/// to sit near zero from dividing by nothing).
fn max_relative(a: &[f32], b: &[f32]) -> f64 {
    let rms = (b.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / b.len() as f64).sqrt();
    a.iter()
        .zip(b)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs() / f64::from(b).abs().max(rms))
        .fold(0.0, f64::max)
}

/// The parameters and the stage after every step of the host run.
fn host_run(config: &OptimizerConfig, layout: &ParamLayout, p: &Problem) -> Vec<(Vec<f32>, Stage)> {
    let comm = SingleRank::new();
    let mut opt = Optimizer::new(config.clone(), schedule(), layout.clone(), &comm).unwrap();
    let mut x = p.x0.clone();
    p.grads[..STEPS]
        .iter()
        .map(|g| {
            let report = opt.step_flat(&mut x, &mut g.clone(), &comm).unwrap();
            (x.clone(), report.stage)
        })
        .collect()
}

#[test]
fn device_steps_match_the_cpu_loops() {
    let device = lavapipe();
    let comm = SingleRank::new();
    for (seed, (what, layout)) in layouts().into_iter().enumerate() {
        let p = problem(layout.len(), seed as u64 + 1);
        for config in configs() {
            let host = host_run(&config, &layout, &p);
            let mut opt =
                Optimizer::new(config.clone(), schedule(), layout.clone(), &comm).unwrap();
            let mut x = DeviceFlat::from_host(&p.x0, &device).unwrap();
            for (t, (g, (expected, stage))) in p.grads.iter().zip(&host).enumerate() {
                let mut g = DeviceFlat::from_host(g, &device).unwrap();
                let report = opt.step_device(&mut x, &mut g, &comm).unwrap();
                assert_eq!(
                    report.stage,
                    *stage,
                    "{what}, {}: step {}",
                    config.name(),
                    t + 1
                );
                let rel = max_relative(&x.to_host(), expected);
                eprintln!(
                    "{what}, {}, step {}, {}: {rel:.2e}",
                    config.name(),
                    t + 1,
                    report.stage
                );
                assert!(
                    rel <= 1e-6,
                    "{what}, {}: step {}: parameters {rel:.2e} relative from the CPU's",
                    config.name(),
                    t + 1
                );
            }
        }
    }
}

#[test]
fn device_state_saves_loads_and_resumes() {
    let device = lavapipe();
    let comm = SingleRank::new();
    let scratch = tempfile::tempdir().unwrap();
    let (_, layout) = layouts().pop().unwrap();
    let p = problem(layout.len(), 77);
    for config in configs() {
        let name = config.name();
        let fresh = || Optimizer::new(config.clone(), schedule(), layout.clone(), &comm).unwrap();
        let upload = |v: &[f32]| DeviceFlat::from_host(v, &device).unwrap();

        // The host run, all steps.
        let mut host = fresh();
        let mut x_host = p.x0.clone();
        for g in &p.grads {
            host.step_flat(&mut x_host, &mut g.clone(), &comm).unwrap();
        }

        // A device run of all steps, and one stopped halfway and saved.
        let mut straight = fresh();
        let mut x_straight = upload(&p.x0);
        for g in &p.grads {
            straight
                .step_device(&mut x_straight, &mut upload(g), &comm)
                .unwrap();
        }
        let mut first = fresh();
        let mut x = upload(&p.x0);
        for g in &p.grads[..STEPS] {
            first.step_device(&mut x, &mut upload(g), &comm).unwrap();
        }
        let path = scratch.path().join(format!("{name}.safetensors"));
        first.save(&path).unwrap();
        let x_half = x.to_host();

        // Continued on the device: the same bits as never stopped.
        let mut resumed = fresh();
        resumed.load(&path).unwrap();
        let mut x = upload(&x_half);
        for g in &p.grads[STEPS..] {
            resumed.step_device(&mut x, &mut upload(g), &comm).unwrap();
        }
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(
            bits(x.to_host()),
            bits(x_straight.to_host()),
            "{name}: resumed on the device"
        );

        // Continued on the host: the host run's values.
        let mut on_host = fresh();
        on_host.load(&path).unwrap();
        let mut x = x_half.clone();
        for g in &p.grads[STEPS..] {
            on_host.step_flat(&mut x, &mut g.clone(), &comm).unwrap();
        }
        let rel = max_relative(&x, &x_host);
        assert!(rel <= 1e-6, "{name}: continued on the host: {rel:.2e}");
    }
}

/// The 1-bit Adam family's config of the compressed-step test.
/// 0/1 Adam in 4 steps: v updated at t = 1, the 1-bit compressed gradient
/// at t = 2, a local step that synchronises at t = 3 and one that does not
/// at t = 4 (`finish` synchronises it). ε inside the root, as `onebit()`
/// has it after its freeze: with ε outside, coordinates whose v is tiny
/// move by `scale/ε`, and the last-bit differences of a chunk's scale
/// (summed in another order on the device) grew to 1.24e-6 of x there
/// (2^20 + 7 elements, step 4).
fn zero_one() -> ZeroOneAdamConfig {
    ZeroOneAdamConfig {
        var_freeze_step: 2,
        var_update_scaler: 1,
        local_step_scaler: 1,
        local_step_clipper: 4,
        ..ZeroOneAdamConfig::default()
            .with_weight_decay(0.01)
            .with_eps_mode(EpsMode::Inside)
    }
}

/// DeepSpeed's compressed allreduce (through the host on a device) and
/// its handling of coordinates with a frozen v of zero.
fn deepspeed<C: WithOneBitAllreduce>(config: C) -> C {
    config
        .with_scale(ScaleKind::DeepSpeed)
        .with_hold_zero_variance(false)
}

fn onebit() -> OneBitAdamConfig {
    let mut c = OneBitAdamConfig::default().with_weight_decay(0.01);
    c.compression.freeze_step = 2;
    c.moments.eps_mode = EpsMode::InsideCompressed;
    c
}

/// The compressed-step test's optimizers: every rule the registry lists
/// (its short run, so a rule added there is stepped here too), every
/// compressed rule's options that change what travels, the ablation
/// baselines.
fn compressed_configs() -> Vec<OptimizerConfig> {
    let mut all = OptimizerConfig::short_runs(2);
    all.extend([
        OptimizerConfig::OnebitAdam(onebit()),
        OptimizerConfig::OnebitAdam({
            let mut c = onebit();
            c.allreduce.scale_block = Some(64);
            c.allreduce.scale = ScaleKind::L2;
            c
        }),
        OptimizerConfig::OnebitAdam(deepspeed(onebit())),
        OptimizerConfig::OnebitAdamFp32(onebit()),
        OptimizerConfig::AdamOnebitNaive(onebit()),
        OptimizerConfig::OnebitLamb(onebit_lamb()),
        OptimizerConfig::OnebitLamb({
            let mut c = onebit_lamb();
            c.ratio = RatioKind::Variance;
            c.moments.eps_mode = EpsMode::InsideCompressed;
            c.allreduce.scale_block = Some(64);
            c
        }),
    ]);
    all.extend(in_both_lists());
    all.extend([
        OptimizerConfig::Slamb(SlambConfig {
            values: SparseValues::F16,
            k: 0.3,
            ..slamb()
        }),
        OptimizerConfig::Slamb(SlambConfig {
            mask: MaskKind::Cyclic,
            ..slamb()
        }),
        // The authors' rules: the blend clipped (to a bound that binds),
        // 1-D segments always synchronised and unclipped.
        OptimizerConfig::Slamb(SlambConfig {
            compat: SlambCompat::Authors,
            phi_max: 0.3,
            ..slamb()
        }),
    ]);
    all
}

/// How far the device run's parameters may lie from the host run's in the
/// compressed test below (relative to the larger of the element and the
/// vector's rms). The block scales of the compressed allreduce are sums
/// over up to half a million elements: the host sums them in f64 and
/// rounds once, the device in f32 (WGSL has no f64), so a device scale may
/// differ from the host's in its last bits, and error feedback carries the
/// difference into the next steps. With the worker's scales on the device
/// and the server's on the host the largest gap was 9.4e-7 (bound 1e-6);
/// with the server step on the device too (its scales summed there), two
/// such sums a step differ, and the largest gap is 2.25e-6 (1-bit Adam,
/// 2^20 + 7 elements, step 4). A real mismatch — a sign, a scale slot, a
/// missed error update — moves parameters by 1e-3 or more.
const COMPRESSED_BOUND: f64 = 4e-6;

/// The 1-bit Adam and 1-bit LAMB families, 0/1 Adam and SLAMB on 2 thread ranks, each rank
/// with its own gradients: the warmup (fp32 gradient allreduce), the
/// freeze, and the compression stage with the compressed allreduce's worker
/// and server sides in device kernels (or the fp32 momentum allreduce, or the naive
/// baseline that compresses the gradient from step 1; 1-bit LAMB's scaled
/// momentum and fresh variance in both ratio flavours; the basic ablation;
/// SLAMB's selected values averaged through the host in fp32 or fp16),
/// against the same run on host buffers: parameters within
/// [`COMPRESSED_BOUND`] relative after every step, the same bytes sent.
#[test]
fn compressed_optimizers_step_on_the_device_as_on_the_host() {
    let device = lavapipe();
    let configs = compressed_configs();
    for (seed, (what, layout)) in layouts().into_iter().enumerate() {
        let problems: Vec<Problem> = (0..2)
            .map(|rank| problem(layout.len(), 100 * seed as u64 + rank))
            .collect();
        // Parameters kept out of compression (averaged in fp32): a bias
        // and a matrix of the several-segment layout, and the one-element
        // layout's only parameter (nothing left to compress).
        let kept_out: &[&str] = match what {
            "several segments" => &["b0", "w1"],
            "one element" => &["b"],
            _ => &[],
        };
        let mut configs = configs.to_vec();
        // DeepSpeed's `exp_avg_mask` as rows of a matrix and a whole
        // vector, and its `non_freeze` groups.
        if what == "several segments" {
            let mask = vec!["w1[10:20]".to_string(), "norm".to_string()];
            configs.extend([
                OptimizerConfig::OnebitAdam(deepspeed(onebit()).with_momentum_mask(mask.clone())),
                OptimizerConfig::ZeroOneAdam(deepspeed(zero_one()).with_momentum_mask(mask)),
                // DeepSpeed's non_freeze groups: a vector and a matrix.
                OptimizerConfig::OnebitAdam(OneBitAdamConfig {
                    non_freeze: vec!["b0".into(), "w2".into()],
                    ..deepspeed(onebit())
                }),
            ]);
        }
        if !kept_out.is_empty() {
            let uncompressed: Vec<String> = kept_out.iter().map(|p| p.to_string()).collect();
            let mut adam = onebit();
            adam.allreduce.uncompressed.clone_from(&uncompressed);
            let mut lamb = onebit_lamb();
            lamb.allreduce.uncompressed.clone_from(&uncompressed);
            let mut zero_one = zero_one();
            zero_one.allreduce.uncompressed = uncompressed;
            configs.extend([
                OptimizerConfig::OnebitAdam(adam.clone()),
                OptimizerConfig::AdamOnebitNaive(adam),
                OptimizerConfig::OnebitLamb(lamb),
                OptimizerConfig::ZeroOneAdam(zero_one),
            ]);
        }
        for config in &configs {
            let name = config.name();
            let run = |on_device: bool| {
                // Each rank starts from its own parameters here, which a
                // step split between ranks that share cores does not allow
                // (it needs them replicated, as data parallelism keeps
                // them): the host steps unsplit, as the device does.
                let world = LocalComm::world_with_timeout(2, Duration::from_secs(120))
                    .into_iter()
                    .map(LocalComm::unshared)
                    .collect();
                let results = LocalComm::run_in(world, |comm| {
                    let p = &problems[comm.rank()];
                    let mut opt =
                        Optimizer::new(config.clone(), schedule(), layout.clone(), comm).unwrap();
                    let mut xs = Vec::new();
                    let mut sent = Vec::new();
                    let mut x_host = p.x0.clone();
                    let mut x_device = DeviceFlat::from_host(&p.x0, &device).unwrap();
                    for g in &p.grads[..STEPS] {
                        let report = if on_device {
                            let mut g = DeviceFlat::from_host(g, &device).unwrap();
                            let report = opt.step_device(&mut x_device, &mut g, comm).unwrap();
                            xs.push(x_device.to_host());
                            report
                        } else {
                            let report = opt.step_flat(&mut x_host, &mut g.clone(), comm).unwrap();
                            xs.push(x_host.clone());
                            report
                        };
                        sent.push(report.traffic.sent());
                    }
                    // The end of the run (SLAMB averages the parameters).
                    if on_device {
                        opt.finish_device(&mut x_device, comm).unwrap();
                        xs.push(x_device.to_host());
                    } else {
                        opt.finish_flat(&mut x_host, comm).unwrap();
                        xs.push(x_host.clone());
                    }
                    (xs, sent)
                });
                results.into_iter().map(|r| r.unwrap()).collect::<Vec<_>>()
            };
            let (host, on_device) = (run(false), run(true));
            for (rank, ((xs_h, sent_h), (xs_d, sent_d))) in host.iter().zip(&on_device).enumerate()
            {
                assert_eq!(sent_d, sent_h, "{what}, {name}, rank {rank}: bytes sent");
                for (t, (d, h)) in xs_d.iter().zip(xs_h).enumerate() {
                    let rel = max_relative(d, h);
                    eprintln!("{what}, {name}, rank {rank}, step {}: {rel:.2e}", t + 1);
                    assert!(
                        rel <= COMPRESSED_BOUND,
                        "{what}, {name}, rank {rank}: step {}: parameters {rel:.2e} relative \
                         from the host's",
                        t + 1
                    );
                }
            }
        }
    }
}
