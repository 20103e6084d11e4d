//! What the end-to-end tests of the `terse` binary share: where the
//! workspace is (the binary runs from there, so `configs/…` resolve), where
//! a run keeps a step's checkpoint, a saved module's tensors, a run's
//! logged steps and losses, and a run that must succeed.

// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The checkpoint directory of `step` in `run_dir`.
pub fn checkpoint(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join(format!("checkpoints/step-{step:08}"))
}

/// Every tensor of a saved module, by name, as raw bytes (compared this
/// way, not as files: two files' headers may order their metadata
/// differently).
pub fn tensors(path: &Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut all: Vec<(String, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect();
    all.sort();
    all
}

/// A finished command's standard output and error, as one text.
pub fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The step lines of a run's `metrics.jsonl` (the ones with a loss).
pub fn step_lines(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|v| v.get("loss").is_some())
        .collect()
}

/// The per-step losses of a run's `metrics.jsonl`, passing over any line
/// that is not JSON.
pub fn losses(run_dir: &Path) -> Vec<f64> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()))
        .collect()
}

/// Runs `command` (a `terse` binary), which must succeed: its output.
pub fn succeeded(command: &mut std::process::Command) -> std::process::Output {
    let output = command.output().expect("terse starts");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The largest relative difference between two runs' per-step values.
pub fn worst_relative(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs())
        .fold(0.0, f64::max)
}
