//! A run's losses do not depend on how many threads each local rank gets.
//!
//! The real `terse` binary pre-trains BERT-Tiny on the SOTU corpus (1-bit
//! LAMB's warmup, dropout 0.1) for a few steps on 1 and on 2 local ranks,
//! each with 1 and with 2 rayon threads per rank. terse's fused ops sum in
//! fixed blocks and gemm splits no reduction across threads, so the only
//! thread-dependent order left is in flex's own reductions; the per-step
//! losses must agree within `BOUND` relative (measured 2026-11-24: 0, the
//! runs were bit-identical).

mod common;

use std::process::Command;

use common::{succeeded, workspace, worst_relative};

const CONFIG: &str = "configs/pretrain-bert-tiny.toml";
const STEPS: usize = 6;
/// Largest relative difference allowed between per-step losses.
const BOUND: f64 = 1e-6;

/// Per-step losses of a run on `ranks` local ranks with `threads` rayon
/// threads in all (cores ÷ ranks each).
fn losses(ranks: usize, threads: usize) -> Vec<f64> {
    let scratch = tempfile::tempdir().unwrap();
    let run_dir = scratch.path().join("run");
    succeeded(
        Command::new(env!("CARGO_BIN_EXE_terse"))
            .env("RAYON_NUM_THREADS", threads.to_string())
            .args(["pretrain", "--no-progress", "--config", CONFIG])
            .args(["--local-ranks", &ranks.to_string()])
            .args(["--set", &format!("train.steps={STEPS}")])
            .arg("--run-dir")
            .arg(&run_dir)
            .current_dir(workspace()),
    );
    let losses: Vec<f64> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()))
        .collect();
    assert_eq!(losses.len(), STEPS, "one loss per step");
    losses
}

#[test]
fn losses_do_not_depend_on_threads_per_rank() {
    for ranks in [1, 2] {
        let one = losses(ranks, ranks);
        let two = losses(ranks, 2 * ranks);
        let worst = worst_relative(&one, &two);
        eprintln!("{ranks} rank(s): 1 vs 2 threads each, worst relative loss difference {worst:e}");
        assert!(
            worst <= BOUND,
            "{ranks} rank(s): losses with 1 thread per rank {one:?}, with 2 {two:?}"
        );
    }
}
