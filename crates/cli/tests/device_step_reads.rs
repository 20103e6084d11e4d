//! Where a training step on a cubecl device reads device memory back to
//! the host (lavapipe: Mesa's Vulkan driver on the CPU, the path a GPU
//! takes). Each read waits for the device to finish all it was given, so a
//! step reads only where a decision or the network needs it: the loss of
//! every micro-batch and the gradient norm it only logs are read once the
//! optimizer's update is queued. The step line's `host_reads` counts rank
//! 0's reads by phase (`terse_kernels::host_reads`), `device_wait_ms` the
//! wait at the step's end.
//!
//! BERT-Tiny, one rank, 3 steps of 2 micro-batches:
//! - AdamW: nothing read before or inside the update, two reads after it
//!   (the micro-batches' losses together, the squared gradient norm);
//! - AdamW with `train.max_grad_norm`: the same, the clipping judged and
//!   applied on the device; its losses and logged norms within 1e-4 of the
//!   same run on the CPU (which clips on the host), and apart from the
//!   unclipped run's (at a max norm of 1e-3 the clipped gradient falls
//!   below Adam's ε, so the clipping shows in the loss);
//! - LAMB: the same, its per-layer trust coefficients computed on the
//!   device between its two passes (the host used to read the norms and
//!   compute them, one read inside the update);
//! - 1-bit LAMB (freeze at step 1): the same in the warmup, its running
//!   trust average kept on the device, except at the freeze, which reads
//!   that average and each segment's `Σm²` for the momentum scales (two
//!   reads inside the update, once); the compression stage's variance
//!   ratios clipped and turned into rates on the device (it used to read
//!   each segment's largest ratio inside every update);
//! - the CPU run has neither field.

mod common;

use std::path::Path;
use std::process::Command;

use common::{step_lines, succeeded, workspace};

fn run(device: &str, optimizer: &str, run_dir: &Path, extra: &[&str]) {
    succeeded(
        Command::new(env!("CARGO_BIN_EXE_terse"))
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .args(["pretrain", "--no-progress", "--config"])
            .arg("configs/pretrain-bert-tiny.toml")
            .args(["--device", device, "--optimizer", optimizer])
            .args(["--set", "train.steps=3", "--set", "train.eval_every=0"])
            .args([
                "--set",
                "train.global_batch=4",
                "--set",
                "train.micro_batch=2",
            ])
            .args(["--set", "task.max_seq=32"])
            .arg("--run-dir")
            .arg(run_dir)
            .args(extra)
            .current_dir(workspace()),
    );
}

/// `(before_update, update, after_update)` of every step line.
fn reads(run_dir: &Path) -> Vec<(u64, u64, u64)> {
    step_lines(run_dir)
        .iter()
        .map(|line| {
            let reads = &line["host_reads"];
            assert!(
                line["device_wait_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
                "no device wait in {line}"
            );
            let count = |phase: &str| reads[phase].as_u64().unwrap_or_else(|| panic!("{line}"));
            (
                count("before_update"),
                count("update"),
                count("after_update"),
            )
        })
        .collect()
}

/// `(loss, grad_norm)` of every step line.
fn losses_and_norms(run_dir: &Path) -> Vec<(f64, f64)> {
    step_lines(run_dir)
        .iter()
        .map(|l| {
            (
                l["loss"].as_f64().unwrap(),
                l["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

#[test]
fn a_device_step_reads_only_after_its_update_is_queued() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = |name: &str| scratch.path().join(name);
    let clipped = ["--set", "train.max_grad_norm=1e-3"];

    run("lavapipe", "adam", &dir("adam"), &[]);
    assert_eq!(reads(&dir("adam")), vec![(0, 0, 2); 3], "adam on lavapipe");

    run("lavapipe", "adam", &dir("adam-clipped"), &clipped);
    assert_eq!(
        reads(&dir("adam-clipped")),
        vec![(0, 0, 2); 3],
        "adam clipped on lavapipe"
    );
    run("cpu", "adam", &dir("cpu-clipped"), &clipped);
    for line in step_lines(&dir("cpu-clipped")) {
        assert!(
            line.get("host_reads").is_none() && line.get("device_wait_ms").is_none(),
            "a CPU step line with device fields: {line}"
        );
    }
    let device = losses_and_norms(&dir("adam-clipped"));
    let cpu = losses_and_norms(&dir("cpu-clipped"));
    let unclipped = losses_and_norms(&dir("adam"));
    for (step, ((d, c), u)) in device.iter().zip(&cpu).zip(&unclipped).enumerate() {
        assert!(
            relative(d.0, c.0) <= 1e-4 && relative(d.1, c.1) <= 1e-4,
            "step {}: lavapipe (loss, norm) {d:?}, cpu {c:?}",
            step + 1
        );
        assert!(d.1 > 1e-3, "step {}: the clipping never binds", step + 1);
        if step == 2 {
            assert!(
                relative(d.0, u.0) > 1e-3,
                "step 3: clipped loss {} as the unclipped {}",
                d.0,
                u.0
            );
        }
    }

    run("lavapipe", "lamb", &dir("lamb"), &[]);
    assert_eq!(reads(&dir("lamb")), vec![(0, 0, 2); 3], "lamb on lavapipe");

    let freeze = ["--set", "optimizer.freeze_step=1"];
    run("lavapipe", "onebit_lamb", &dir("onebit-lamb"), &freeze);
    assert_eq!(
        reads(&dir("onebit-lamb")),
        vec![(0, 2, 2), (0, 0, 2), (0, 0, 2)],
        "onebit_lamb on lavapipe (freeze at step 1)"
    );
}
