//! The step line's `device_memory_mb` on a cubecl device (lavapipe): what
//! the device holds at each step's end, as cubecl's memory manager counts
//! it. A step on the device keeps only the run's state between steps — the
//! flat parameters (the model's parameters are views of them), the flat
//! gradient and the optimizer's state — so with AdamW the live bytes are
//! four times the parameters' (the checkpoint's model file is their f32
//! bytes), and they stay put from step to step: an activation, a copy or a
//! per-step allocation that outlived its step would show here (a 4 MB
//! buffer leaked per step adds 44 MB over the 12 steps; one kept copy of
//! the parameters adds a fifth of the total). A CPU step line has no such
//! field. And a micro-batch too large for the device ends the run with one
//! error line saying so, not a panic.

mod common;

use std::path::Path;
use std::process::Command;

use common::{checkpoint, step_lines, succeeded, text, workspace};

/// `terse pretrain` of BERT-Tiny with AdamW on `device` into `run_dir`,
/// evaluating never; each test adds its sizes.
fn pretrain_command(device: &str, run_dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_terse"));
    command
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(["--device", device, "--optimizer", "adam"])
        .args(["--set", "train.eval_every=0"])
        .arg("--run-dir")
        .arg(run_dir)
        .current_dir(workspace());
    command
}

fn pretrain(device: &str, run_dir: &Path, steps: usize) {
    succeeded(
        pretrain_command(device, run_dir)
            .args(["--set", &format!("train.steps={steps}")])
            .args(["--set", "train.global_batch=4", "--set", "task.max_seq=32"]),
    );
}

#[test]
fn a_device_run_holds_its_state_and_no_more_from_step_to_step() {
    let scratch = tempfile::tempdir().unwrap();
    let steps = 12;
    let run_dir = scratch.path().join("adam");
    pretrain("lavapipe", &run_dir, steps);

    let memory: Vec<(f64, f64)> = step_lines(&run_dir)
        .iter()
        .map(|line| {
            let mb = &line["device_memory_mb"];
            let field = |name: &str| mb[name].as_f64().unwrap_or_else(|| panic!("{line}"));
            (field("in_use"), field("reserved"))
        })
        .collect();
    assert_eq!(memory.len(), steps, "{memory:?}");

    let model = checkpoint(&run_dir, steps as u64).join("model-rank-0.safetensors");
    let parameters_mb = std::fs::metadata(&model).unwrap().len() as f64 / 1e6;
    // Parameters, gradient, Adam's two moments.
    let state_mb = 4.0 * parameters_mb;
    for (step, &(in_use, reserved)) in memory.iter().enumerate() {
        let step = step + 1;
        assert!(
            (0.99 * state_mb..=1.05 * state_mb).contains(&in_use),
            "step {step}: {in_use} MB in use; AdamW's state is {state_mb:.3} MB \
             (4 × the parameters' {parameters_mb:.3} MB)"
        );
        assert!(
            reserved >= in_use,
            "step {step}: {reserved} MB reserved < {in_use} in use"
        );
    }
    let (second, last) = (memory[1].0, memory[steps - 1].0);
    assert!(
        last - second < 1.0,
        "{} MB more in use at step {steps} than at step 2 ({second} → {last})",
        last - second
    );

    let cpu = scratch.path().join("cpu");
    pretrain("cpu", &cpu, 2);
    for line in step_lines(&cpu) {
        assert!(
            line.get("device_memory_mb").is_none(),
            "a CPU step line with device memory: {line}"
        );
    }
}

/// BERT-Tiny's micro-batch of 3072 sequences of 128 asks lavapipe for
/// buffers larger than it allows (cubecl's `BufferTooBig`, found when the
/// step's loss is read): the run ends with terse's one-line error naming
/// the step, the device, the size and the setting to lower, on one rank
/// and on each of two local ranks, without a panic or a backtrace. (On
/// CUDA the device's memory in all follows its name; WebGPU states none.)
#[test]
fn a_micro_batch_the_device_cannot_hold_is_one_error_line() {
    let scratch = tempfile::tempdir().unwrap();
    for ranks in [1usize, 2] {
        let output = pretrain_command("lavapipe", &scratch.path().join(format!("ranks-{ranks}")))
            .env("RUST_BACKTRACE", "1")
            .args(["--steps", "1", "--local-ranks", &ranks.to_string()])
            .args(["--set", "train.micro_batch=3072", "--set"])
            .arg(format!("train.global_batch={}", 3072 * ranks))
            .args(["--set", "task.held_out=0"])
            .output()
            .unwrap();
        let all = text(&output);
        assert!(!output.status.success(), "{all}");
        let error = all
            .lines()
            .find(|line| line.starts_with("terse: error:"))
            .unwrap_or_else(|| panic!("no error line: {all}"));
        let rank = if ranks > 1 { "rank 0: " } else { "" };
        assert!(
            error.starts_with(&format!(
                "terse: error: {rank}in step 1, on lavapipe: tried to allocate one buffer of "
            )) && error.contains("larger than any the device allows")
                && error.contains("Lower train.micro_batch (now 3072)"),
            "{error}"
        );
        for noise in ["panicked", "backtrace", "Caused by"] {
            assert!(!all.contains(noise), "{noise} in: {all}");
        }
    }
}
