//! `--resume CHECKPOINT`: continue from a chosen checkpoint. The real
//! `terse` binary pre-trains BERT-Tiny for 6 steps with a checkpoint every
//! 2 (the last two, steps 4 and 6, are kept); continuing from step 4 into
//! another run directory ends with the same weights as the uninterrupted
//! run, and continuing from step 4 inside the original directory (where
//! step 6 follows), or into a directory with checkpoints of its own, is
//! refused naming them. A checkpoint whose `trainer.json`
//! says another layout version is refused by `--resume`, `--resume
//! CHECKPOINT` and `terse eval`, naming the file and both versions.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{checkpoint, tensors, workspace};

fn terse(run_dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_terse"))
        .args([
            "pretrain",
            "--no-progress",
            "--config",
            "configs/pretrain-bert-tiny.toml",
        ])
        .args([
            "--set",
            "train.steps=6",
            "--set",
            "train.checkpoint_every=2",
        ])
        .arg("--run-dir")
        .arg(run_dir)
        .args(extra)
        .current_dir(workspace())
        .output()
        .expect("terse starts")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Every tensor of rank 0's model at step 6, by name.
fn weights(run_dir: &Path) -> Vec<(String, Vec<u8>)> {
    tensors(&checkpoint(run_dir, 6).join("model-rank-0.safetensors"))
}

#[test]
fn a_chosen_checkpoint_continues_bit_identically_and_an_overtaken_one_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let base = scratch.path();
    let (whole, branch) = (base.join("whole"), base.join("branch"));
    let output = terse(&whole, &[]);
    assert!(output.status.success(), "{}", stderr(&output));

    let from = checkpoint(&whole, 4);
    let output = terse(&branch, &["--resume", from.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("resumed from"),
        "{}",
        stderr(&output)
    );
    let (a, b) = (weights(&whole), weights(&branch));
    let differing: Vec<&String> = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x != y)
        .map(|(x, _)| &x.0)
        .collect();
    assert!(
        a.len() == b.len() && differing.is_empty(),
        "the continued run differs in {differing:?} ({} and {} tensors)",
        a.len(),
        b.len()
    );

    let output = terse(&whole, &["--resume", from.to_str().unwrap()]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("newer checkpoints of this run follow it"),
        "{message}"
    );
    assert!(message.contains("step-00000006"), "{message}");

    // A run directory where a step's is meant is named as one.
    let output = terse(&base.join("third"), &["--resume", whole.to_str().unwrap()]);
    let message = stderr(&output);
    assert!(
        !output.status.success() && message.contains("a run directory, not a checkpoint"),
        "{message}"
    );

    // The branch now has checkpoints of its own: continuing another run's
    // step 4 there again is refused (a later plain --resume would pick
    // the branch's newest, not the continuation's).
    let output = terse(&branch, &["--resume", from.to_str().unwrap()]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("holds checkpoints of another run"),
        "{message}"
    );
}

#[test]
fn a_checkpoint_of_another_layout_version_is_refused_naming_the_file_and_versions() {
    let scratch = tempfile::tempdir().unwrap();
    let run = scratch.path().join("run");
    let output = terse(&run, &["--set", "train.checkpoint_every=0"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let step = checkpoint(&run, 6);
    let meta = step.join("trainer.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    assert!(text.contains("\"version\": 2"), "{text}");
    std::fs::write(&meta, text.replace("\"version\": 2", "\"version\": 0")).unwrap();

    let refused = |output: &Output| {
        let message = stderr(output);
        assert!(!output.status.success(), "accepted:\n{message}");
        let line = message
            .lines()
            .find(|l| l.contains("trainer.json"))
            .unwrap_or_else(|| panic!("trainer.json not named:\n{message}"));
        assert!(
            line.contains("version 0") && line.contains("`terse-checkpoint` version 2"),
            "{line}"
        );
        line.to_string()
    };
    let steps_8 = [
        "--set",
        "train.steps=8",
        "--set",
        "train.checkpoint_every=0",
    ];
    let plain = refused(&terse(&run, &[&steps_8[..], &["--resume"]].concat()));
    let chosen = refused(&terse(
        &scratch.path().join("branch"),
        &[&steps_8[..], &["--resume", step.to_str().unwrap()]].concat(),
    ));
    let eval = Command::new(env!("CARGO_BIN_EXE_terse"))
        .args(["eval", "--config"])
        .arg(run.join("config.toml"))
        .arg("--checkpoint")
        .arg(&step)
        .current_dir(workspace())
        .output()
        .expect("terse starts");
    let eval = refused(&eval);
    println!("--resume: {plain}\n--resume CHECKPOINT: {chosen}\neval: {eval}");
}
