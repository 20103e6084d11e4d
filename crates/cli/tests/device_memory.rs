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
//! field.

mod common;

use std::path::Path;
use std::process::Command;

use common::{checkpoint, step_lines, succeeded, workspace};

fn pretrain(device: &str, run_dir: &Path, steps: usize) {
    succeeded(
        Command::new(env!("CARGO_BIN_EXE_terse"))
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .args(["pretrain", "--no-progress", "--config"])
            .arg("configs/pretrain-bert-tiny.toml")
            .args(["--device", device, "--optimizer", "adam"])
            .args(["--set", &format!("train.steps={steps}")])
            .args([
                "--set",
                "train.eval_every=0",
                "--set",
                "train.global_batch=4",
            ])
            .args(["--set", "task.max_seq=32"])
            .arg("--run-dir")
            .arg(run_dir)
            .current_dir(workspace()),
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
