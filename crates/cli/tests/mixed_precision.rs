//! `train.precision` end to end, through the real `terse` binary on BERT-Tiny
//! (flex computes bf16 and fp16).
//!
//! - bf16 and fp16 runs follow the fp32 run's losses within `HALF_BOUND`
//!   over 30 steps, learn as it does, and do differ from it (the half types
//!   were really used).
//! - fp16 on 2 local ranks with an overflow injected on rank 1 only at
//!   step 5 (`TERSE_INJECT_OVERFLOW`): both ranks skip it, the scale halves,
//!   every rank's optimizer state (moments, step count, freeze, error
//!   feedback) and parameters after it are the bits they were before it;
//!   the run then goes on exactly as a run that starts from step 4's state
//!   at step 6's batch (step 5's batch consumed, nothing updated), built
//!   independently by renaming step 4's checkpoint; the scale grows after a
//!   window of clean steps; an fp16 run resumed from a checkpoint matches
//!   the uninterrupted one bit for bit. An overflow of the forward pass
//!   (an inf loss) is skipped the same way and the run goes on.
//! - 1-bit Adam sends the same number of bytes per step in fp16 as in fp32
//!   (freezing at step 5 of 7: with the config's LAMB learning rate an
//!   earlier freeze diverges in both precisions, the hazard of a freeze
//!   while v is still small).
//! - A device that lacks a precision refuses it by name.
//! - A bf16 run resumed from a checkpoint matches the uninterrupted one bit
//!   for bit.
//! - Checkpoints keep fp32 master weights, and a run moves between
//!   precisions on resume.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{checkpoint, step_lines, tensors, text, workspace, worst_relative};

const CONFIG: &str = "configs/pretrain-bert-tiny.toml";

/// Largest relative difference between a half-precision run's per-step
/// losses and the fp32 run's over 30 steps. bf16 keeps 8 significant bits
/// (a relative rounding of up to 2^-9 ≈ 2e-3 per matmul operand), but a
/// loss averages thousands of such products whose errors mostly cancel:
/// measured 2026-11-28, bf16 ≤ 8e-5 and fp16 ≤ 3e-5; the bound leaves
/// more than 10× room and is still far below the fall of the loss itself
/// (11.04 → 10.07, 9%).
const HALF_BOUND: f64 = 1e-3;

fn terse(run_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_terse"));
    command
        .args(["pretrain", "--no-progress", "--config", CONFIG])
        .args(args)
        .arg("--run-dir")
        .arg(run_dir)
        .current_dir(workspace());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("terse starts")
}

fn run_ok(run_dir: &Path, args: &[&str], env: &[(&str, &str)]) {
    let output = terse(run_dir, args, env);
    assert!(output.status.success(), "{}", text(&output));
}

fn losses(run_dir: &Path) -> Vec<f64> {
    step_lines(run_dir)
        .iter()
        .map(|v| v["loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn half_precision_runs_follow_the_fp32_losses() {
    let scratch = tempfile::tempdir().unwrap();
    let run = |precision: &str| {
        let dir = scratch.path().join(precision);
        run_ok(&dir, &["--precision", precision, "--steps", "30"], &[]);
        losses(&dir)
    };
    let fp32 = run("fp32");
    assert!(fp32[29] < fp32[0] - 0.5, "the model learns: {fp32:?}");
    for precision in ["bf16", "fp16"] {
        let half = run(precision);
        let worst = worst_relative(&half, &fp32);
        eprintln!("{precision}: worst relative loss difference from fp32 {worst:e}");
        assert!(
            worst > 0.0,
            "{precision}: the same bits as fp32: not computed in {precision}"
        );
        assert!(worst <= HALF_BOUND, "{precision}: {half:?}\nfp32: {fp32:?}");
    }
}

/// A small BERT-Tiny run on one rank (one micro-batch of 2 sequences of
/// 32 tokens a step, no evaluation) on `device` in `precision`, with
/// `extra` arguments, in `root/name`: lavapipe takes seconds a step.
fn small_run(root: &Path, name: &str, device: &str, precision: &str, extra: &[&str]) -> PathBuf {
    let dir = root.join(name);
    let mut args = vec!["--device", device, "--precision", precision];
    for setting in [
        "train.global_batch=2",
        "train.micro_batch=2",
        "train.eval_every=0",
        "task.max_seq=32",
    ] {
        args.extend(["--set", setting]);
    }
    args.extend(extra);
    let tmp = std::env::temp_dir();
    run_ok(&dir, &args, &[("XDG_RUNTIME_DIR", tmp.to_str().unwrap())]);
    dir
}

/// fp16 on lavapipe (its adapter has shader-f16): the cubecl path of a
/// half-precision run — the kernels, the autocast and the loss scaling a
/// bf16 run on CUDA takes, in the other half type — follows the CPU's fp32
/// losses within [`HALF_BOUND`], and is not fp32: lavapipe's fp32 gives
/// the CPU's losses to the bit over these 4 steps (1.8e-7 relative over 10
/// such steps; measured 2026-12-07), its fp16 differs by 6.6e-6 (4.6e-6
/// over 10 steps).
#[test]
fn fp16_on_lavapipe_follows_the_cpu_s_fp32_losses() {
    let scratch = tempfile::tempdir().unwrap();
    let steps = ["--steps", "4"];
    let fp32 = losses(&small_run(scratch.path(), "cpu", "cpu", "fp32", &steps));
    let dir = small_run(scratch.path(), "lavapipe", "lavapipe", "fp16", &steps);
    let fp16 = losses(&dir);
    let worst = worst_relative(&fp16, &fp32);
    eprintln!("fp16 on lavapipe: worst relative loss difference from the CPU's fp32 {worst:e}");
    assert!(
        worst > 1e-6,
        "as close as fp32 on another device: not computed in fp16: {fp16:?}\nfp32: {fp32:?}"
    );
    assert!(worst <= HALF_BOUND, "{fp16:?}\nfp32: {fp32:?}");
    // Loss scaling ran: DeepSpeed's initial scale, no overflow.
    for line in step_lines(&dir) {
        assert_eq!(line["loss_scale"], 65536.0, "{line}");
    }
}

/// A real fp16 overflow on lavapipe (no injection): at a loss scale of
/// 2^30 the backward pass's half activations overflow (on this model they
/// do from 2^17 or 2^18 on, measured on the CPU), the device's gradient
/// holds inf, and each step is skipped with the scale halved, as on the
/// CPU; nothing moves: after 3 skipped steps the device's model and
/// optimizer files are the CPU's to the bit (both the initial state).
#[test]
fn a_real_fp16_overflow_on_lavapipe_skips_the_step_as_on_the_cpu() {
    let scratch = tempfile::tempdir().unwrap();
    let overflowing = [
        "--steps",
        "3",
        "--set",
        "train.loss_scaling={ initial_scale_power = 30 }",
        "--set",
        "train.checkpoint_every=3",
    ];
    let run = |device: &str| small_run(scratch.path(), device, device, "fp16", &overflowing);
    let (cpu, lavapipe) = (run("cpu"), run("lavapipe"));
    let tried: Vec<(f64, bool)> = step_lines(&lavapipe)
        .iter()
        .map(|v| (v["loss_scale"].as_f64().unwrap(), v["skipped"] == true))
        .collect();
    let powers = [30, 29, 28].map(|p| (2f64.powi(p), true));
    assert_eq!(tried, powers, "{lavapipe:?}");
    let saved = read_json(&checkpoint(&lavapipe, 3).join("trainer.json"));
    assert_eq!(saved["loss_scaler"]["scale"], 2f64.powi(27));
    for file in [
        "model-rank-0.safetensors",
        "optimizer-rank-0.safetensors",
        "optimizer-own-rank-0.safetensors",
    ] {
        let (a, b) = (
            checkpoint(&cpu, 3).join(file),
            checkpoint(&lavapipe, 3).join(file),
        );
        if a.exists() || b.exists() {
            assert!(tensors(&a) == tensors(&b), "{file}: the device moved");
        }
    }
}

/// fp16 on 2 local ranks, 1-bit LAMB compressing from step 4, a scale
/// window of 3 clean steps.
const FP16: &[&str] = &[
    "--precision",
    "fp16",
    "--local-ranks",
    "2",
    "--set",
    "optimizer.freeze_step=3",
    "--set",
    "train.checkpoint_every=1",
    "--set",
    "train.loss_scaling={ scale_window = 3 }",
];
const OVERFLOW: (&str, &str) = ("TERSE_INJECT_OVERFLOW", "5:1");

fn with_steps(steps: &str) -> Vec<&str> {
    let mut args = FP16.to_vec();
    args.extend(["--steps", steps]);
    args
}

fn same_files(a: &Path, b: &Path, what: &str) {
    for rank in 0..2 {
        for file in [
            format!("model-rank-{rank}.safetensors"),
            format!("optimizer-rank-{rank}.safetensors"),
            format!("optimizer-own-rank-{rank}.safetensors"),
        ] {
            if !a.join(&file).exists() && !b.join(&file).exists() {
                continue; // no state of the rank's own (AdamW)
            }
            assert!(
                tensors(&a.join(&file)) == tensors(&b.join(&file)),
                "{what}: {file} differs between {} and {}",
                a.display(),
                b.display()
            );
        }
    }
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn an_fp16_overflow_on_one_rank_skips_the_step_on_every_rank() {
    let scratch = tempfile::tempdir().unwrap();
    let run = scratch.path().join("injected");
    run_ok(&run, &with_steps("5"), &[OVERFLOW]);

    // Skipped at step 5 only, the scale halving after it.
    let lines = step_lines(&run);
    let skipped: Vec<bool> = lines
        .iter()
        .map(|v| v.get("skipped").is_some_and(|s| s == true))
        .collect();
    assert_eq!(skipped, [false, false, false, false, true]);
    let tried: Vec<f64> = lines
        .iter()
        .map(|v| v["loss_scale"].as_f64().unwrap())
        .collect();
    // 2^16, doubled after the third clean step since none (stable
    // interval 3 at step 4), then step 5's overflow halves it.
    assert_eq!(tried, [65536.0, 65536.0, 65536.0, 65536.0, 131072.0]);
    let meta = read_json(&checkpoint(&run, 5).join("trainer.json"));
    assert_eq!(meta["loss_scaler"]["scale"], 65536.0);
    assert_eq!(meta["loss_scaler"]["skipped"], 1);
    assert_eq!(meta["stage"], "compression");

    // Every rank's optimizer state and parameters: step 5 = step 4.
    same_files(
        &checkpoint(&run, 4),
        &checkpoint(&run, 5),
        "the skipped step",
    );

    // The reference: step 4's state, continued at step 6's batch, made by
    // renaming step 4's checkpoint to step 5 (with step 5's scaler).
    let reference = scratch.path().join("reference");
    copy_dir(&run, &reference);
    let (four, five) = (checkpoint(&reference, 4), checkpoint(&reference, 5));
    std::fs::remove_dir_all(&five).unwrap();
    std::fs::rename(&four, &five).unwrap();
    for name in ["trainer.json", "rank-0.json", "rank-1.json"] {
        let mut record = read_json(&five.join(name));
        record["step"] = 5.into();
        record["loss_scaler"] = meta["loss_scaler"].clone();
        std::fs::write(five.join(name), record.to_string()).unwrap();
    }
    let mut resumed = with_steps("9");
    resumed.push("--resume");
    run_ok(&reference, &resumed, &[]);
    run_ok(&run, &resumed, &[OVERFLOW]);
    let (after, expected) = (losses(&run), losses(&reference));
    assert_eq!(after[5..], expected[5..], "steps 6–9 after the skip");
    same_files(&checkpoint(&run, 9), &checkpoint(&reference, 9), "step 9");

    // The scale grows again after 3 clean steps since the overflow.
    let tried: Vec<f64> = step_lines(&run)
        .iter()
        .map(|v| v["loss_scale"].as_f64().unwrap())
        .collect();
    assert_eq!(tried[5..], [65536.0, 65536.0, 65536.0, 65536.0]);
    assert_eq!(
        read_json(&checkpoint(&run, 9).join("trainer.json"))["loss_scaler"]["scale"],
        131072.0
    );

    // Uninterrupted, with the same overflow: the resumed run's bits.
    let straight = scratch.path().join("straight");
    run_ok(&straight, &with_steps("9"), &[OVERFLOW]);
    assert_eq!(losses(&straight), losses(&run));
    same_files(
        &checkpoint(&straight, 9),
        &checkpoint(&run, 9),
        "resumed fp16",
    );
}

/// A forward pass that overflows in fp16 (its loss inf; the hook's
/// `STEP:RANK:loss`) on one rank: the step is skipped on both, as a
/// gradient overflow is, and the run goes on, as DeepSpeed's
/// `FP16_Optimizer` does; it stopped as diverged before (stop 80).
#[test]
fn an_fp16_forward_overflow_skips_the_step_and_the_run_goes_on() {
    let scratch = tempfile::tempdir().unwrap();
    let run = scratch.path().join("forward");
    run_ok(
        &run,
        &with_steps("6"),
        &[("TERSE_INJECT_OVERFLOW", "4:0:loss")],
    );
    let lines = step_lines(&run);
    let skipped: Vec<bool> = lines
        .iter()
        .map(|v| v.get("skipped").is_some_and(|s| s == true))
        .collect();
    assert_eq!(skipped, [false, false, false, true, false, false]);
    let finite: Vec<bool> = lines.iter().map(|v| v["loss"].as_f64().is_some()).collect();
    assert_eq!(finite, [true, true, true, false, true, true], "{lines:?}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn onebit_adam_sends_the_same_bytes_in_fp16_as_in_fp32() {
    let scratch = tempfile::tempdir().unwrap();
    let bytes = |precision: &str| {
        let dir = scratch.path().join(precision);
        run_ok(
            &dir,
            &[
                "--precision",
                precision,
                "--local-ranks",
                "2",
                "--optimizer",
                "onebit_adam",
                "--set",
                "optimizer.freeze_step=5",
                "--steps",
                "7",
            ],
            &[],
        );
        step_lines(&dir)
            .iter()
            .map(|v| {
                (
                    v["stage"].as_str().unwrap().to_string(),
                    v["bytes_sent"].as_u64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let (fp32, fp16) = (bytes("fp32"), bytes("fp16"));
    assert!(
        fp32.iter().any(|(stage, _)| stage == "compression"),
        "{fp32:?}"
    );
    assert_eq!(fp16, fp32);
}

#[test]
fn a_device_without_the_precision_refuses_it_by_name() {
    let scratch = tempfile::tempdir().unwrap();
    let refused = |args: &[&str], expected: &[&str]| {
        let output = terse(&scratch.path().join("refused"), args, &[]);
        let message = text(&output);
        assert!(!output.status.success(), "{args:?} ran: {message}");
        for part in expected {
            assert!(
                message.contains(part),
                "{args:?}: no `{part}` in: {message}"
            );
        }
    };
    refused(
        &["--precision", "bf16", "--device", "lavapipe"],
        &["train.precision = \"bf16\"", "lavapipe", "computes in fp32"],
    );
    refused(
        &["--precision", "tf32"],
        &["train.precision = \"tf32\"", "cpu", "fp32, bf16, fp16"],
    );
    refused(
        &["--set", "train.loss_scaling={ scale_window = 3 }"],
        &["train.loss_scaling", "fp16 only"],
    );
}

/// The dtypes of a safetensors file's tensors.
fn dtypes(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut all: Vec<String> = file
        .tensors()
        .into_iter()
        .map(|(_, view)| format!("{:?}", view.dtype()))
        .collect();
    all.sort();
    all.dedup();
    all
}

#[test]
fn checkpoints_keep_fp32_masters_and_move_between_precisions() {
    let scratch = tempfile::tempdir().unwrap();
    let run = scratch.path().join("run");
    run_ok(
        &run,
        &[
            "--precision",
            "bf16",
            "--steps",
            "4",
            "--set",
            "train.checkpoint_every=2",
        ],
        &[],
    );
    let step = checkpoint(&run, 4);
    assert_eq!(dtypes(&step.join("model-rank-0.safetensors")), ["F32"]);
    // The optimizer's flat states in fp32, its scalars in f64.
    assert_eq!(
        dtypes(&step.join("optimizer-rank-0.safetensors")),
        ["F32", "F64"]
    );
    // bf16 → fp32 → fp16, each resumed from the last one's checkpoint.
    for (precision, steps) in [("fp32", "6"), ("fp16", "8")] {
        run_ok(
            &run,
            &[
                "--precision",
                precision,
                "--steps",
                steps,
                "--resume",
                "--set",
                "train.checkpoint_every=2",
            ],
            &[],
        );
    }
    let losses = losses(&run);
    assert_eq!(losses.len(), 8);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
}

#[test]
fn a_bf16_run_resumes_bit_identically() {
    let scratch = tempfile::tempdir().unwrap();
    let bf16 = ["--precision", "bf16", "--set", "train.checkpoint_every=2"];
    let (straight, resumed) = (
        scratch.path().join("straight"),
        scratch.path().join("resumed"),
    );
    run_ok(&straight, &[&bf16[..], &["--steps", "4"]].concat(), &[]);
    run_ok(&resumed, &[&bf16[..], &["--steps", "2"]].concat(), &[]);
    run_ok(
        &resumed,
        &[&bf16[..], &["--steps", "4", "--resume"]].concat(),
        &[],
    );
    assert_eq!(losses(&resumed), losses(&straight));
    let file = "model-rank-0.safetensors";
    assert!(
        tensors(&checkpoint(&resumed, 4).join(file))
            == tensors(&checkpoint(&straight, 4).join(file))
    );
    for file in [
        "optimizer-rank-0.safetensors",
        "optimizer-own-rank-0.safetensors",
    ] {
        let (a, b) = (checkpoint(&resumed, 4), checkpoint(&straight, 4));
        if !a.join(file).exists() && !b.join(file).exists() {
            continue; // no state of the rank's own (AdamW)
        }
        assert!(tensors(&a.join(file)) == tensors(&b.join(file)), "{file}");
    }
}
