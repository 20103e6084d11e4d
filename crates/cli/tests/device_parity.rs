//! Training on burn's wgpu backend (`--device lavapipe`: Mesa's Vulkan
//! driver on the CPU, the same code path a GPU takes) against the same run
//! on `cpu` (flex): BERT-Tiny pre-training on 2 thread ranks, 6 steps of
//! global batch 4 at sequence length 32, the 1-bit optimizers' freeze at
//! step 3, for adam, lamb, onebit_adam, onebit_lamb and slamb (the Adam
//! family at BERT's Adam learning rate, 1e-4: at the config's LAMB rate,
//! 5e-3, 1-bit Adam diverges on both devices, loss 16 by step 6).
//!
//! - every step's loss within 1e-4 relative (SLAMB: 1e-3), the same bytes
//!   sent every step, and the ranks' weights bit-identical on the device
//!   wherever they are on the CPU;
//! - parameters within 1e-4 relative L2 after every uncompressed step: adam
//!   and lamb at step 6 (there within 5e-7: GELU's exact derivative on the
//!   device), the 1-bit optimizers' warmup at step 3. The
//!   compressed steps are only reported: a sign (1-bit) is discontinuous,
//!   so an element whose compensated momentum lies within float noise of
//!   zero goes the other way on the other device, and 1-bit Adam's
//!   variance, frozen after 3 steps, turns each such flip into a large
//!   step; SLAMB divides the averaged momentum by each rank's own variance,
//!   so an element with a near-zero local gradient gets a huge direction
//!   from its noise-level bits (measured: onebit_adam 0.18, onebit_lamb
//!   5.8e-4, slamb 2.8e-3 relative L2 at step 6);
//! - a checkpoint written on wgpu continues on wgpu bit-identically, and on
//!   the CPU (and the reverse) within the same tolerance;
//! - a device that is not there is one clear error line;
//! - no step reads device memory back before its update is queued.
//!
//! Every optimizer steps on the device (flat buffers and optimizer state
//! there; the run's log says so, and the test checks it).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{checkpoint, workspace};

const STEPS: u64 = 6;
const TOLERANCE: f64 = 1e-4;
/// The parameters of an optimizer that never compresses (adam, lamb) after
/// all its steps, relative L2 from the CPU's: 9.5e-8 and 8.8e-8 measured
/// (stop 80), 2.1e-6 and 1.0e-6 while GELU's backward pass on the device
/// was burn's (the tanh approximation's derivative; `device_gelu.rs`).
const UNCOMPRESSED_PARAMETERS: f64 = 5e-7;

fn terse(device: &str, optimizer: &str, run_dir: &Path, extra: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_terse"));
    command
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args([
            "--device",
            device,
            "--local-ranks",
            "2",
            "--optimizer",
            optimizer,
        ])
        .args(["--set", &format!("train.steps={STEPS}")])
        .args([
            "--set",
            "train.global_batch=4",
            "--set",
            "train.micro_batch=2",
        ])
        .args([
            "--set",
            "train.eval_every=0",
            "--set",
            "train.checkpoint_every=3",
        ])
        .args(["--set", "task.max_seq=32"])
        .arg("--run-dir")
        .arg(run_dir)
        .args(extra)
        .current_dir(workspace());
    if optimizer.starts_with("onebit") {
        command.args(["--set", "optimizer.freeze_step=3"]);
    }
    if optimizer.ends_with("adam") {
        command.args(["--set", "schedule.peak=1e-4"]);
    }
    command.output().expect("terse runs")
}

fn succeed(output: Output) -> String {
    let text = common::text(&output);
    assert!(output.status.success(), "{text}");
    text
}

/// `(step, loss, bytes sent)` of every logged step.
fn steps(run_dir: &Path) -> Vec<(u64, f64, u64)> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("loss").is_some())
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap(),
                v["bytes_sent"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn model(run_dir: &Path, step: u64, rank: usize) -> Vec<(String, Vec<u8>)> {
    common::tensors(&checkpoint(run_dir, step).join(format!("model-rank-{rank}.safetensors")))
}

/// ‖a − b‖ / ‖b‖ over every f32 tensor of two saved modules.
fn relative_l2(a: &[(String, Vec<u8>)], b: &[(String, Vec<u8>)]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for ((name_a, a), (name_b, b)) in a.iter().zip(b) {
        assert_eq!(name_a, name_b);
        for (x, y) in a.chunks_exact(4).zip(b.chunks_exact(4)) {
            let x = f64::from(f32::from_le_bytes(x.try_into().unwrap()));
            let y = f64::from(f32::from_le_bytes(y.try_into().unwrap()));
            diff += (x - y) * (x - y);
            norm += y * y;
        }
    }
    (diff / norm).sqrt()
}

fn losses_agree(
    what: &str,
    device: &[(u64, f64, u64)],
    cpu: &[(u64, f64, u64)],
    tolerance: f64,
) -> f64 {
    assert_eq!(device.len(), cpu.len(), "{what}: steps logged");
    let mut worst = 0.0f64;
    for (d, c) in device.iter().zip(cpu) {
        assert_eq!(d.0, c.0, "{what}: step numbers");
        let relative = (d.1 - c.1).abs() / c.1.abs();
        assert!(
            relative <= tolerance,
            "{what}: step {} loss {} vs {}",
            d.0,
            d.1,
            c.1
        );
        worst = worst.max(relative);
    }
    worst
}

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("terse-device-")
        .tempdir()
        .unwrap()
}

/// The optimizers whose end-to-end check is tighter than the default:
/// (optimizer, its last uncompressed step, loss tolerance).
const CHECKED_CLOSER: [(&str, u64, f64); 4] = [
    ("adam", STEPS, TOLERANCE),
    ("lamb", STEPS, TOLERANCE),
    ("onebit_adam", 3, TOLERANCE),
    ("onebit_lamb", 3, TOLERANCE),
];

/// The registry's optimizers not trained here, with why a BERT run of
/// their own adds nothing (each is also stepped on the device against the
/// host in `crates/optim/tests/device_optimizers.rs`).
const KERNEL_LEVEL_ONLY: [(&str, &str); 5] = [
    (
        "sgd",
        "the image models' optimizer; its device pass has no BERT-specific path",
    ),
    (
        "zero_one_adam",
        "the compression stage's passes plus two synchronisation kernels; the trainer's \
         path for ranks with their own parameters is SLAMB's, run end to end above",
    ),
    (
        "onebit_adam_fp32",
        "1-bit Adam's own passes, only its momentum exchange is fp32",
    ),
    (
        "adam_onebit_naive",
        "1-bit Adam's own passes with compression from step 1",
    ),
    (
        "lamb_onebit_basic",
        "1-bit LAMB's own passes minus momentum scaling and fresh variance (the ablation)",
    ),
];

/// The optimizers trained end to end on both devices: every one the
/// registry lists but those above, so a rule added there is trained here
/// too, by default with its losses within 1e-3 and its parameters
/// compared only through them (SLAMB's terms); (optimizer, its last
/// uncompressed step, loss tolerance).
fn end_to_end() -> Vec<(&'static str, u64, f64)> {
    terse_optim::OPTIMIZER_NAMES
        .lines()
        .filter(|name| !KERNEL_LEVEL_ONLY.iter().any(|(o, _)| o == name))
        .map(|name| {
            CHECKED_CLOSER
                .into_iter()
                .find(|(o, _, _)| *o == name)
                .unwrap_or((name, 0, 1e-3))
        })
        .collect()
}

/// Two runs at once, one per core of CI's two (a run alone keeps them
/// busy only part of the time).
fn both(a: impl FnOnce() -> Output + Send, b: impl FnOnce() -> Output) {
    std::thread::scope(|scope| {
        let a = scope.spawn(a);
        succeed(b());
        succeed(a.join().expect("terse ran"));
    })
}

/// One test for the parity of every optimizer's runs and for the
/// checkpoints moved between devices, because the latter resume the former
/// (3 of 16 BERT runs fewer than with runs of their own).
#[test]
fn every_optimizer_trains_on_lavapipe_as_on_the_cpu_and_checkpoints_move_between_devices() {
    let scratch = scratch();
    let optimizers = end_to_end();
    for resumed in ["onebit_adam", "lamb"] {
        assert!(
            optimizers.iter().any(|(o, _, _)| *o == resumed),
            "{resumed}: its checkpoints are moved below"
        );
    }
    for (optimizer, uncompressed, loss_tolerance) in optimizers {
        let dir =
            |device: &str| -> PathBuf { scratch.path().join(format!("{optimizer}-{device}")) };
        both(
            || terse("cpu", optimizer, &dir("cpu"), &[]),
            || terse("lavapipe", optimizer, &dir("lavapipe"), &[]),
        );
        trains_as_on_the_cpu(
            optimizer,
            uncompressed,
            loss_tolerance,
            &dir("cpu"),
            &dir("lavapipe"),
        );
        match optimizer {
            "onebit_adam" => resumes_bit_identically(optimizer, &dir("lavapipe"), scratch.path()),
            "lamb" => resumes_on_the_other_device(&dir("cpu"), &dir("lavapipe"), scratch.path()),
            _ => {}
        }
    }
}

/// The lavapipe run `gpu` of `optimizer` against its CPU run `cpu`.
fn trains_as_on_the_cpu(
    optimizer: &str,
    uncompressed: u64,
    loss_tolerance: f64,
    cpu: &Path,
    gpu: &Path,
) {
    // Where the optimizer stepped, as the run's log says.
    let log = std::fs::read_to_string(gpu.join("terse.log")).unwrap();
    assert!(
        log.contains("on lavapipe (llvmpipe") && log.contains("optimizer state on the device"),
        "{optimizer}: not stepped on the device, or its hardware unnamed\n{log}"
    );
    // Nothing read back before the update is queued (the loss and the
    // logged norm after it; device_step_reads.rs has the counts).
    for line in common::step_lines(gpu) {
        let reads = &line["host_reads"];
        assert_eq!(
            (
                reads["before_update"].as_u64(),
                reads["after_update"].as_u64()
            ),
            (Some(0), Some(2)),
            "{optimizer}: {line}"
        );
    }
    let (cpu_steps, gpu_steps) = (steps(cpu), steps(gpu));
    let worst = losses_agree(optimizer, &gpu_steps, &cpu_steps, loss_tolerance);
    let sent = |log: &[(u64, f64, u64)]| log.iter().map(|s| s.2).collect::<Vec<_>>();
    assert_eq!(
        sent(&gpu_steps),
        sent(&cpu_steps),
        "{optimizer}: bytes sent"
    );
    let apart = |step| relative_l2(&model(gpu, step, 0), &model(cpu, step, 0));
    if uncompressed > 0 {
        let l2 = apart(uncompressed);
        let bound = if uncompressed == STEPS {
            UNCOMPRESSED_PARAMETERS
        } else {
            TOLERANCE
        };
        assert!(
            l2 <= bound,
            "{optimizer}: parameters {l2:e} apart at step {uncompressed}"
        );
    }
    let ranks_equal = |d: &Path| model(d, STEPS, 1) == model(d, STEPS, 0);
    assert_eq!(
        ranks_equal(gpu),
        ranks_equal(cpu),
        "{optimizer}: the ranks agree on one device only"
    );
    println!(
        "{optimizer}: losses within {worst:.1e}; parameters {:.1e} relative L2 at step 3, \
         {:.1e} at step {STEPS}; ranks identical: {}",
        apart(3),
        apart(STEPS),
        ranks_equal(cpu)
    );
}

/// The steps after the checkpoint of step 3.
fn after(log: Vec<(u64, f64, u64)>) -> Vec<(u64, f64, u64)> {
    log.into_iter().filter(|s| s.0 > 3).collect()
}

/// The checkpoint of step 3 of the run in `run_dir`, as `--resume` takes it.
fn step_3(run_dir: &Path) -> String {
    checkpoint(run_dir, 3).display().to_string()
}

/// wgpu → wgpu, from a compression-stage checkpoint of the lavapipe run
/// `gpu` (1-bit Adam's error buffers included): bit-identical.
fn resumes_bit_identically(optimizer: &str, gpu: &Path, scratch: &Path) {
    let resumed = scratch.join("gpu-gpu");
    succeed(terse(
        "lavapipe",
        optimizer,
        &resumed,
        &["--resume", &step_3(gpu)],
    ));
    for rank in 0..2 {
        assert!(
            model(&resumed, STEPS, rank) == model(gpu, STEPS, rank),
            "rank {rank}: the resume on wgpu differs"
        );
    }
    assert_eq!(after(steps(&resumed)), after(steps(gpu)));
}

/// wgpu → cpu and cpu → wgpu of LAMB's runs `cpu` and `gpu` (no
/// discontinuous step to amplify the devices' float differences): within
/// the devices' tolerance.
fn resumes_on_the_other_device(cpu: &Path, gpu: &Path, scratch: &Path) {
    let (gpu_cpu, cpu_gpu) = (scratch.join("gpu-cpu"), scratch.join("cpu-gpu"));
    both(
        || terse("cpu", "lamb", &gpu_cpu, &["--resume", &step_3(gpu)]),
        || terse("lavapipe", "lamb", &cpu_gpu, &["--resume", &step_3(cpu)]),
    );
    for (resumed, on, written) in [(&gpu_cpu, "cpu", gpu), (&cpu_gpu, "lavapipe", cpu)] {
        let what = resumed.file_name().unwrap().to_string_lossy();
        losses_agree(
            &what,
            &after(steps(resumed)),
            &after(steps(written)),
            TOLERANCE,
        );
        let l2 = relative_l2(&model(resumed, STEPS, 0), &model(written, STEPS, 0));
        assert!(l2 <= TOLERANCE, "{what}: {l2:e}");
        println!(
            "{} step 3 resumed on {on}: parameters {l2:.1e} relative L2 at step {STEPS}",
            written.file_name().unwrap().to_string_lossy()
        );
    }
}

#[test]
fn a_device_that_is_not_there_is_one_clear_error() {
    let scratch = scratch();
    for (device, says) in [
        (
            "wgpu:7",
            "no discrete GPU number 7 among the adapters wgpu finds here",
        ),
        (
            "cuda",
            "`cuda` cannot be used: no NVIDIA driver: libcuda.so was not found",
        ),
        ("gpu3", "unknown device `gpu3`"),
    ] {
        let output = terse(device, "adam", &scratch.path().join("run"), &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(if device == "gpu3" { 2 } else { 1 }),
            "{stderr}"
        );
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(errors[0].contains(says), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        println!("--device {device}: {}", errors[0]);
    }
}
