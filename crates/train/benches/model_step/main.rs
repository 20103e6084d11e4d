//! Throughput of one training step on the flex CPU backend, beside the same
//! step in PyTorch eager (`cargo xtask bench model` runs both in one run and
//! prints the ratio):
//!
//! - BERT pre-training, as `benches/pytorch_bert_step.py`: BertForPreTraining
//!   in train mode with dropout 0.1, MLM at 15% of the positions + NSP,
//!   backward, AdamW (weight decay 0.01, lr 1e-4, eps 1e-6), seq 128;
//! - ResNet-20 (CIFAR style, option-A shortcuts) on 32×32×3 images, batch
//!   128, as `benches/pytorch_resnet_step.py`: cross-entropy over 10
//!   classes, backward, the same AdamW.
//!
//! Each step's time is broken down by class of op ([`op_profile`]: matmul,
//! attention, norm, activation, dropout, loss, embedding, optimizer, the
//! flat-buffer round trip, and the rest as "other").
//!
//! On a cubecl device (`--device lavapipe|wgpu|cuda`) the timed steps'
//! kernel dispatches are counted by kind (matmul, elementwise, reduce,
//! copy, other: `terse_kernels::dispatches`), a proxy for launch overhead
//! that lavapipe measures without a GPU; `TERSE_BENCH_KERNELS=1` lists them
//! per kernel on stderr. With `--kernel-times` each of them is also timed on
//! the device (`DispatchCounter::start_timed`): the per-op breakdown on a
//! cubecl device, by kind (`kernel_ms_by_kind`), where the host-timed
//! classes of `breakdown_ms` see only the queueing. There the device runs behind the host (burn
//! queues work): a step reads its loss once, after the update is queued,
//! as the trainer does and as PyTorch's script ends its step with
//! `loss.item()`, so the step's time includes its own device work and
//! nothing waits inside it; the phases' times are then the host's queueing
//! and `device_wait_ms` the wait for the rest at the end.
//! `--sync-phases` reads the loss after the forward pass and waits for the
//! device after the backward pass, the gradients' copy into the flat
//! buffer, the optimizer and the write-back, so that each phase is charged
//! its own device time (at the price of the overlap those waits remove).
//!
//! Its arguments (after `--` under cargo) are `model_step --help`'s. With
//! `--matmul-precision`, cubek feeds f32 operands to TF32 `cmma` wherever
//! the device has it (CUDA from sm_80), which the check's error tells from
//! full f32; with `--matmul NAME` the line says which routine ran the
//! linear layers' products (`terse_fused::name_linear_matmul`) and how many
//! it declined to burn's matmul. `--precision fp16` scales the loss as the
//! trainer does (dynamic, from 2^16: `LossScaler`), reads the gradient's
//! norm each step to judge it, unscales it and skips an overflowed update,
//! as PyTorch's fp16 column runs GradScaler; the line gives the final
//! scale and the timed steps skipped.
//! Prints one JSON line per model.

use std::time::Instant;

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use terse_comm::SingleRank;
use terse_fused::{
    self as fused,
    op_profile::{self, OpClass},
};
use terse_kernels::dispatches::{DispatchCounter, DispatchKind, KernelTimes};
use terse_models::bert::{BertForPreTraining, BertInput, BertPreset};
use terse_models::{ResnetConfig, ResnetDepth};
use terse_optim::WithMoments;
use terse_optim::{AdamConfig, FlatModel, LrSchedule, Optimizer, OptimizerConfig, ParamLayout};
use terse_rng::SplitMix64;
use terse_train::{LossScaler, LossScaling};

/// A model the benchmark times.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bench {
    Bert(BertPreset),
    Resnet20,
}

/// The benchmark's arguments, after `--` under cargo.
#[derive(clap::Parser)]
#[command(
    name = "model_step",
    bin_name = "model_step",
    about = "Times terse's training step (forward, backward, the flat-buffer round trip, \
             AdamW) and prints one JSON line per model; `cargo xtask bench model` runs it \
             beside PyTorch"
)]
struct Args {
    /// Models, comma-separated: BERT presets (tiny, mini, …, base, large, xlarge), resnet20;
    /// '' for none (with --matmul-precision, the check alone) [default: mini,base,resnet20]
    #[arg(long = "presets", value_name = "LIST", value_parser = presets)]
    preset_list: Option<Presets>,
    /// BERT's batch size
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// BERT's sequence length
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// ResNet-20's batch size
    #[arg(long, default_value_t = 128)]
    resnet_batch: usize,
    /// Untimed steps first [default: 2, with --quick 1]
    #[arg(long = "warmup", value_name = "N")]
    warmup_steps: Option<usize>,
    /// Timed steps [default: 5, with --quick 2]
    #[arg(long = "steps", value_name = "N")]
    timed_steps: Option<usize>,
    /// A smoke run: BERT-Tiny unless --presets says otherwise, 1 warmup + 2 timed steps
    #[arg(long)]
    quick: bool,
    /// No dropout (to see what dropout costs)
    #[arg(long)]
    no_dropout: bool,
    /// Where the model runs: cpu, wgpu, wgpu:N, lavapipe, cuda, cuda:N
    #[arg(long, default_value = "cpu")]
    device: terse_train::DeviceChoice,
    /// What BERT computes in (train.precision's names): fp32, tf32 (CUDA), bf16, fp16 (with the trainer's dynamic loss scaling, as PyTorch's GradScaler: the norm read each step to judge it)
    #[arg(long, default_value = "fp32")]
    precision: terse_train::Precision,
    /// First, one f32 matmul on the device against a float64 product on the host:
    /// full f32 arithmetic or TF32 tensor cores
    #[arg(long)]
    matmul_precision: bool,
    /// Wait for the device at the end of each phase, so each is charged its own device time
    #[arg(long)]
    sync_phases: bool,
    /// The linear layers' matmuls launch cubek's routine NAME (a cubecl device only)
    #[arg(long, value_name = "NAME")]
    matmul: Option<String>,
    /// Also time every kernel of the timed steps on the device (a cubecl device only): the step's
    /// kernel time by kind in the JSON line (kernel_ms_by_kind), the costliest kernels on stderr.
    /// Two timestamps around each kernel, read after the steps, so the kernels still run back to
    /// back; on a wgpu adapter without timestamp queries the host times each with a wait
    #[arg(long)]
    kernel_times: bool,
    /// Passed by `cargo bench`; ignored
    #[arg(long, hide = true)]
    bench: bool,
}

/// The models of a `--presets` list.
#[derive(Debug, Clone)]
struct Presets(Vec<Bench>);

/// Parses a `--presets` list: BERT presets by name and `resnet20`.
fn presets(list: &str) -> Result<Presets, String> {
    list.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p {
            "resnet20" => Ok(Bench::Resnet20),
            p => BertPreset::ALL
                .into_iter()
                .find(|q| q.name() == p)
                .map(Bench::Bert)
                .ok_or_else(|| {
                    let names: Vec<&str> = BertPreset::ALL.iter().map(|q| q.name()).collect();
                    format!(
                        "unknown model {p:?} (known: {}, resnet20)",
                        names.join(", ")
                    )
                }),
        })
        .collect::<Result<_, _>>()
        .map(Presets)
}

impl Args {
    /// The models to time (`--quick`: BERT-Tiny unless `--presets` names others).
    fn presets(&self) -> Vec<Bench> {
        match &self.preset_list {
            Some(Presets(list)) => list.clone(),
            None if self.quick => vec![Bench::Bert(BertPreset::Tiny)],
            None => vec![
                Bench::Bert(BertPreset::Mini),
                Bench::Bert(BertPreset::Base),
                Bench::Resnet20,
            ],
        }
    }

    /// Untimed steps first.
    fn warmup(&self) -> usize {
        self.warmup_steps.unwrap_or(if self.quick { 1 } else { 2 })
    }

    /// Timed steps.
    fn steps(&self) -> usize {
        self.timed_steps.unwrap_or(if self.quick { 2 } else { 5 })
    }
}

/// What the timed steps watch on a cubecl device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// Nothing (the CPU).
    Nothing,
    /// Kernel dispatches, counted.
    Dispatches,
    /// Dispatches, counted and timed (`--kernel-times`).
    KernelTimes,
}

impl Watch {
    /// What watches the timed steps' launches.
    fn counter(self) -> Option<DispatchCounter> {
        match self {
            Watch::Nothing => None,
            Watch::Dispatches => Some(DispatchCounter::start()),
            Watch::KernelTimes => Some(DispatchCounter::start_timed()),
        }
    }

    fn of(args: &Args) -> Self {
        match (args.device.is_cpu(), args.kernel_times) {
            (true, _) => Self::Nothing,
            (false, false) => Self::Dispatches,
            (false, true) => Self::KernelTimes,
        }
    }
}

/// Mean times of the timed steps, in milliseconds.
struct Timings {
    step: f64,
    forward: f64,
    backward: f64,
    /// The wait for the loss at the step's end (the device behind the host).
    device_wait: f64,
    classes: [f64; OpClass::ALL.len()],
    /// Kernel dispatches per timed step by kind, on a cubecl device.
    dispatches: Option<Vec<(DispatchKind, f64)>>,
    /// `--kernel-times`: the timed steps' kernel times (totals).
    kernel_times: Option<KernelTimes>,
    /// Timed steps.
    steps: f64,
    /// The device's memory after the last step, on a cubecl device (the
    /// trainer's `device_memory_mb`).
    memory: Option<cubecl::MemoryUsage>,
    /// fp16: the loss scale after the last step and the timed steps that
    /// overflowed (skipped, as the trainer skips them).
    loss_scale: Option<(f64, u64)>,
}

impl Timings {
    /// Nothing summed yet over `steps` timed steps.
    fn zero(steps: f64) -> Self {
        Timings {
            step: 0.0,
            forward: 0.0,
            backward: 0.0,
            device_wait: 0.0,
            classes: [0.0; OpClass::ALL.len()],
            dispatches: None,
            kernel_times: None,
            steps,
            memory: None,
            loss_scale: None,
        }
    }
}

/// Runs `warmup + steps` training steps of `model` (forward and loss by
/// `loss`, backward, the trainer's host round trip and an AdamW step) and
/// returns the mean times of the last `steps`.
#[allow(clippy::too_many_arguments)]
fn time_steps<M: Module>(
    mut model: M,
    warmup: usize,
    steps: usize,
    watch: Watch,
    sync_phases: bool,
    scales_loss: bool,
    loss: impl Fn(&M) -> Tensor<1>,
) -> Timings {
    // `--sync-phases`: the device's queued work done before a phase ends.
    let wait = |device: &Device| {
        if sync_phases {
            device.sync().expect("the device failed");
        }
    };
    let comm = SingleRank::new();
    let adam = OptimizerConfig::Adam(AdamConfig::default().with_weight_decay(0.01).with_eps(1e-6));
    let schedule = LrSchedule::Constant { lr: 1e-4 };
    let layout = ParamLayout::from_module(&model);
    let mut optimizer = Optimizer::new(adam, schedule, layout.clone(), &comm).unwrap();
    // Gathered after the first forward pass: burn initialises parameters
    // lazily, on first use.
    let mut flat: Option<FlatModel> = None;
    let mut sums = Timings::zero(steps as f64);
    // fp16: the trainer's dynamic loss scaling (DeepSpeed's defaults, as
    // PyTorch's GradScaler: 2^16, halved on an overflow), its cost in the
    // step as in PyTorch's fp16 column: the loss scaled, the gradient's
    // norm read to judge the step, the gradient unscaled.
    let scaling = LossScaling::default();
    let mut scaler = scales_loss.then(|| LossScaler::new(&scaling));
    let mut skipped_timed = 0u64;
    let mut counter = None;
    for step in 0..warmup + steps {
        if step == warmup {
            // The timed steps' dispatches (the warmup's autotuning and
            // first-use copies left out).
            counter = watch.counter();
        }
        op_profile::start();
        let start = Instant::now();
        let loss = loss(&model);
        if sync_phases {
            // Reading the loss waits for the forward pass.
            let _ = loss.clone().into_scalar::<f32>();
        }
        let forward = start.elapsed().as_secs_f64() * 1e3;
        let device = loss.device();
        let mut grads = match &scaler {
            Some(scaler) => loss.clone().mul_scalar(scaler.scale).backward(),
            None => loss.backward(),
        };
        wait(&device);
        let backward = start.elapsed().as_secs_f64() * 1e3 - forward;
        // The trainer's round trip: the gradients into the host buffer, one
        // step of the host parameters, written back.
        let flat = flat.get_or_insert_with(|| FlatModel::gather_on_device(&model).unwrap());
        op_profile::timed(OpClass::FlatRoundTrip, || {
            flat.add_grads(&model, &mut grads, true).unwrap();
            wait(&device);
        });
        op_profile::timed(OpClass::Optimizer, || {
            let clean = scaler
                .as_mut()
                .is_none_or(|scaler| unscale_or_skip(flat, scaler, &scaling));
            if !clean && step >= warmup {
                skipped_timed += 1;
            }
            if clean {
                flat.step(&mut optimizer, &comm).unwrap();
            }
            wait(&device);
        });
        model = op_profile::timed(OpClass::FlatRoundTrip, || {
            let model = flat.write_into(model).unwrap();
            wait(&device);
            model
        });
        // The loss read once the update is queued, as the trainer reads it
        // and as PyTorch's script ends its step with `loss.item()`: the
        // step's time includes its own device work and no wait inside it.
        let queued = start.elapsed().as_secs_f64() * 1e3;
        let _ = loss.into_scalar::<f32>();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let recorded = op_profile::finish();
        if step >= warmup {
            sums.step += ms;
            sums.device_wait += ms - queued;
            sums.forward += forward;
            sums.backward += backward;
            for (sum, s) in sums.classes.iter_mut().zip(recorded.0) {
                *sum += s * 1e3;
            }
        }
    }
    let n = steps as f64;
    let kernel_times = counter
        .as_ref()
        .filter(|_| watch == Watch::KernelTimes)
        .map(DispatchCounter::kernel_times);
    let dispatches = counter.map(|counter| per_step(&counter, n));
    let memory = flat.as_ref().and_then(FlatModel::device_memory);
    Timings {
        memory,
        loss_scale: scaler.map(|scaler| (scaler.scale, skipped_timed)),
        step: sums.step / n,
        forward: sums.forward / n,
        backward: sums.backward / n,
        device_wait: sums.device_wait / n,
        classes: sums.classes.map(|ms| ms / n),
        dispatches,
        kernel_times,
        steps: n,
    }
}

/// The dispatches `counter` saw in `steps` steps, per step by kind (and
/// by kernel on stderr with `TERSE_BENCH_KERNELS`).
fn per_step(counter: &DispatchCounter, steps: f64) -> Vec<(DispatchKind, f64)> {
    if std::env::var_os("TERSE_BENCH_KERNELS").is_some() {
        for (kernel, count) in counter.by_kernel() {
            eprintln!("{:>8.1} per step  {kernel}", count as f64 / steps);
        }
    }
    counter
        .by_kind()
        .into_iter()
        .map(|(kind, count)| (kind, count as f64 / steps))
        .collect()
}

/// fp16, as the trainer: reads the gradient's norm; unscales a finite
/// gradient and answers true, or answers false (the update is skipped);
/// the scale moves by the verdict.
fn unscale_or_skip(flat: &mut FlatModel, scaler: &mut LossScaler, scaling: &LossScaling) -> bool {
    let clean = flat.grad_sum_of_squares().is_finite();
    if clean {
        flat.scale_grad((1.0 / scaler.scale) as f32);
    }
    scaler.update(!clean, scaling);
    clean
}

mod report;

use report::report;

fn main() {
    let args = <Args as clap::Parser>::parse();
    let presets = args.presets();
    if let Err(e) = args.precision.check_device(&args.device) {
        eprintln!("model_step: error: {e}");
        std::process::exit(1)
    }
    if args.kernel_times && args.device.is_cpu() {
        eprintln!("model_step: error: --kernel-times: a cubecl device only (wgpu, lavapipe, cuda)");
        std::process::exit(1)
    }
    if args.precision.half().is_some() && presets.contains(&Bench::Resnet20) {
        eprintln!(
            "model_step: error: --precision {}: BERT only",
            args.precision
        );
        std::process::exit(1)
    }
    // The trainer's checks of `train.matmul`: the precision, and what the
    // machine lacks for the routine (cuBLAS, a TMA routine's headers).
    if let Err(e) = fused::name_linear_matmul(args.matmul.as_deref()).and_then(|()| {
        args.matmul.as_deref().map_or(Ok(()), |name| {
            terse_train::matmul_agrees_with_precision(name, args.precision)?;
            terse_train::matmul_machine_lacks(name, &args.device).map_or(Ok(()), Err)
        })
    }) {
        eprintln!("model_step: error: --matmul: {e}");
        std::process::exit(1)
    }
    terse_train::allocator::tune_for_training();
    let device = args
        .device
        .open(args.precision)
        .unwrap_or_else(|e| {
            eprintln!("model_step: error: {e}");
            std::process::exit(1)
        })
        .autodiff();
    // On a worker of rayon's pool, as `terse` trains (launch.rs): from
    // outside the pool each parallel loop is handed over and waited for.
    rayon::scope(|_| {
        if args.matmul_precision {
            matmul_precision(&args.device, &device);
        }
        for bench in &presets {
            device.seed(0);
            match *bench {
                Bench::Bert(preset) => bert(&args, preset, &device),
                Bench::Resnet20 => resnet20(&args, &device),
            }
        }
    });
}

/// One `[m, k] × [k, n]` f32 product on `device` (BERT-base's FFN shape at
/// batch 4, seq 128) against the same product in float64 on the host; prints
/// the error relative to the product's RMS. Full f32 arithmetic stays near
/// 1e-6 here; TF32 (10-bit mantissa operands) lands near 1e-3.
fn matmul_precision(choice: &terse_train::DeviceChoice, device: &Device) {
    let (m, k, n) = (512, 768, 3072);
    let mut rng = SplitMix64::new(11);
    let mut uniform = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.symmetric()).collect() };
    let (a, b) = (uniform(m * k), uniform(k * n));
    let on = |x: &[f32], rows: usize, cols: usize| {
        Tensor::<2>::from_data(TensorData::new(x.to_vec(), [rows, cols]), device)
    };
    let product: Vec<f32> = on(&a, m, k)
        .matmul(on(&b, k, n))
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32 product");
    let (mut err2, mut ref2) = (0.0f64, 0.0f64);
    let mut exact = vec![0.0f64; n];
    for i in 0..m {
        exact.iter_mut().for_each(|e| *e = 0.0);
        for p in 0..k {
            let x = f64::from(a[i * k + p]);
            for (e, y) in exact.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *e += x * f64::from(*y);
            }
        }
        for (j, e) in exact.iter().enumerate() {
            err2 += (f64::from(product[i * n + j]) - e).powi(2);
            ref2 += e * e;
        }
    }
    let relative = (err2 / ref2).sqrt();
    let arithmetic = if relative > 1e-4 { "tf32-like" } else { "f32" };
    println!(
        "{{\"check\": \"matmul_precision\", \"device\": \"{choice}\", \"m\": {m}, \"k\": {k}, \"n\": {n}, \"relative_rms_error\": {relative:.3e}, \"arithmetic\": \"{arithmetic}\"}}"
    );
}

fn bert(args: &Args, preset: BertPreset, device: &Device) {
    let mut config = preset.config();
    if args.no_dropout {
        config.hidden_dropout_prob = 0.0;
        config.attention_probs_dropout_prob = 0.0;
    }
    let (b, t) = (args.batch, args.seq);
    let mut rng = SplitMix64::new(7);
    let mut ids: Vec<i64> = (0..b * t)
        .map(|_| 999 + (rng.next_u64() % (config.vocab_size as u64 - 999)) as i64)
        .collect();
    let types: Vec<i64> = (0..b * t).map(|i| i64::from(i % t >= t / 2)).collect();
    let mask = vec![1i64; b * t];
    let mut masked = Vec::new();
    let mut labels = Vec::new();
    for (j, id) in ids.iter_mut().enumerate() {
        if rng.next_u64() % 100 < 15 {
            masked.push(j as i64);
            labels.push(*id);
            *id = 103;
        }
    }
    let nsp: Vec<i64> = (0..b).map(|_| (rng.next_u64() % 2) as i64).collect();
    let input = BertInput::from_rows(ids, types, mask, [b, t], device);
    let ints =
        |v: &Vec<i64>| Tensor::<1, Int>::from_data(TensorData::new(v.clone(), [v.len()]), device);
    let (masked, labels, nsp) = (ints(&masked), ints(&labels), ints(&nsp));
    let model = BertForPreTraining::new(&config, device);
    let timings = time_steps(
        model,
        args.warmup(),
        args.steps(),
        Watch::of(args),
        args.sync_phases,
        args.precision.scales_loss(),
        |model| {
            // The trainer's autocast (micro_batches.rs): half matmuls under
            // bf16/fp16, none under fp32.
            fused::with_half(args.precision.half(), || {
                let out = model.forward(input.clone(), masked.clone());
                model.loss(&out, labels.clone(), nsp.clone())
            })
        },
    );
    let extra = format!(" \"seq\": {t}, \"precision\": \"{}\",", args.precision);
    report(preset.name(), &args.device, b, &extra, &timings);
}

fn resnet20(args: &Args, device: &Device) {
    let b = args.resnet_batch;
    let mut rng = SplitMix64::new(7);
    let pixels: Vec<f32> = (0..b * 3 * 32 * 32)
        .map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let images = Tensor::<4>::from_data(TensorData::new(pixels, [b, 3, 32, 32]), device);
    let labels: Vec<i64> = (0..b).map(|_| (rng.next_u64() % 10) as i64).collect();
    let labels = Tensor::<1, Int>::from_data(TensorData::new(labels, [b]), device);
    let model = ResnetConfig {
        depth: ResnetDepth::Resnet20,
        in_channels: 3,
        classes: 10,
        small_stem: false,
    }
    .init(device);
    let timings = time_steps(
        model,
        args.warmup(),
        args.steps(),
        Watch::of(args),
        args.sync_phases,
        false,
        |model| fused::cross_entropy(model.forward(images.clone()), labels.clone()),
    );
    report(
        "resnet20",
        &args.device,
        b,
        " \"image\": [3, 32, 32],",
        &timings,
    );
}
