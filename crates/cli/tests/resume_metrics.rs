//! What a resumed run leaves in its metrics.jsonl. The real `terse`
//! binary pre-trains BERT-Tiny for 4 steps, evaluating and checkpointing
//! every 2: evaluations at steps 0, 2 and 4, each once. Resuming the
//! finished run (its export failed, say) evaluates and exports again
//! without logging step 4's evaluation twice, and says no step was left;
//! a run stopped after step 2's checkpoint but before its evaluation (a
//! signal at an evaluation step) makes that evaluation when resumed; a
//! `--resume` before the first checkpoint starts over, replacing the
//! earlier lines and TensorBoard event files rather than adding to them;
//! on 2 local ranks, the ranks agree to skip an evaluation the log holds.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{checkpoint, text, workspace};

fn terse(run_dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_terse"))
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(["--set", "train.steps=4", "--set", "train.eval_every=2"])
        .args(["--set", "train.checkpoint_every=2"])
        .arg("--run-dir")
        .arg(run_dir)
        .args(extra)
        .current_dir(workspace())
        .output()
        .expect("terse starts")
}

/// The steps of the run's evaluation lines, in the file's order.
fn evaluated_steps(run_dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|v| v.get("eval").is_some())
        .map(|v| v["step"].as_u64().unwrap())
        .collect()
}

/// How many TensorBoard event files the run directory holds.
fn event_files(run_dir: &Path) -> usize {
    std::fs::read_dir(run_dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("events.out.tfevents.")
        })
        .count()
}

/// Keeps the lines of metrics.jsonl that `keep` accepts.
fn keep_lines(run_dir: &Path, keep: impl Fn(&serde_json::Value) -> bool) {
    let path = run_dir.join("metrics.jsonl");
    let kept: String = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter(|line| keep(&serde_json::from_str(line).unwrap()))
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(path, kept).unwrap();
}

fn succeeded(output: &Output) {
    assert!(output.status.success(), "{}", text(output));
}

#[test]
fn a_resumed_run_logs_each_evaluation_once() {
    let scratch = tempfile::tempdir().unwrap();
    let run = scratch.path().join("run");
    succeeded(&terse(&run, &[]));
    assert_eq!(evaluated_steps(&run), [0, 2, 4]);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 4, "{summary}");

    // The finished run resumed: nothing to train, step 4 evaluated again
    // but logged once.
    let resumed = terse(&run, &["--resume"]);
    succeeded(&resumed);
    assert!(
        text(&resumed).contains("no step left to take"),
        "{}",
        text(&resumed)
    );
    assert_eq!(evaluated_steps(&run), [0, 2, 4]);

    // Stopped after step 2's checkpoint, before its evaluation: the
    // resumed run makes it, then goes on.
    std::fs::remove_dir_all(checkpoint(&run, 4)).unwrap();
    keep_lines(&run, |v| {
        let step = v["step"].as_u64().unwrap();
        step < 2 || (step == 2 && v.get("eval").is_none())
    });
    assert_eq!(evaluated_steps(&run), [0]);
    succeeded(&terse(&run, &["--resume"]));
    assert_eq!(evaluated_steps(&run), [0, 2, 4]);

    // --resume with no checkpoint yet: a run from step 0, the earlier
    // lines and event files replaced.
    assert!(event_files(&run) > 1);
    std::fs::remove_dir_all(run.join("checkpoints")).unwrap();
    succeeded(&terse(&run, &["--resume"]));
    assert_eq!(evaluated_steps(&run), [0, 2, 4]);
    assert_eq!(event_files(&run), 1);
}

/// On 2 local ranks, resumed where the log holds the checkpoint step's
/// evaluation: only the lead rank reads the log, and every rank takes
/// part in an evaluation, so the ranks must agree to skip it (rank 1
/// evaluating while rank 0 went on to step 3 ended the job).
#[test]
fn ranks_resumed_after_a_logged_evaluation_agree_to_skip_it() {
    let scratch = tempfile::tempdir().unwrap();
    let run = scratch.path().join("run");
    let ranks = [
        "--local-ranks",
        "2",
        "--set",
        "train.collective_timeout_s=60",
    ];
    succeeded(&terse(&run, &ranks));
    std::fs::remove_dir_all(checkpoint(&run, 4)).unwrap();
    keep_lines(&run, |v| v["step"].as_u64().unwrap() <= 2);
    assert_eq!(evaluated_steps(&run), [0, 2]);
    succeeded(&terse(&run, &[&ranks[..], &["--resume"]].concat()));
    assert_eq!(evaluated_steps(&run), [0, 2, 4]);
}
