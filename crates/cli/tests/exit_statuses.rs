//! A diverged run exits with status 3 whether it runs as one process or as
//! 2 `mpirun` ranks (an MPI_Abort would turn it into 1): the real `terse`
//! binary pre-trains BERT-Tiny with a learning rate of 10⁶, which takes the
//! loss to NaN within a few steps; its metrics end with the divergence
//! line that `cargo xtask plot` marks.

mod common;

use std::path::Path;
use std::process::Command;

fn diverging(run_dir: &Path) -> Vec<String> {
    [
        "pretrain",
        "--no-progress",
        "--config",
        "configs/pretrain-bert-tiny.toml",
        "--set",
        "schedule.peak=1e6",
        "--set",
        "train.steps=20",
        "--run-dir",
    ]
    .map(String::from)
    .into_iter()
    .chain([run_dir.display().to_string()])
    .collect()
}

/// The exit status, standard error and the last line of metrics.jsonl.
fn status(mut command: Command, run_dir: &Path) -> (Option<i32>, String, String) {
    let _ = std::fs::remove_dir_all(run_dir);
    let output = command
        .current_dir(common::workspace())
        .output()
        .expect("the command starts");
    let last = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .last()
        .unwrap_or("")
        .to_string();
    let _ = std::fs::remove_dir_all(run_dir);
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        last,
    )
}

/// Whether `line` is the divergence line of the step the log names.
fn marks_the_divergence(line: &str, stderr: &str) -> bool {
    let step = stderr
        .split("at step ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or("?");
    line == format!(r#"{{"step":{step},"diverged":true}}"#)
}

#[test]
fn a_diverged_run_exits_3_alone_and_under_mpirun() {
    let scratch = tempfile::tempdir().unwrap();
    let run_dir = scratch.path().join("run");
    let mut alone = Command::new(env!("CARGO_BIN_EXE_terse"));
    alone.args(diverging(&run_dir));
    let (code, stderr, last) = status(alone, &run_dir);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("diverged"), "{stderr}");
    assert!(marks_the_divergence(&last, &stderr), "{last}\n{stderr}");

    let mut mpi = Command::new("mpirun");
    mpi.args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .args(["-x", "RAYON_NUM_THREADS=1", env!("CARGO_BIN_EXE_terse")])
        .args(diverging(&run_dir));
    let (code, stderr, last) = status(mpi, &run_dir);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(marks_the_divergence(&last, &stderr), "{last}\n{stderr}");
}
