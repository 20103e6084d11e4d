//! The held-out evaluation split between a run's ranks scores what one
//! rank scores alone, for every kind of task: the real `terse` binary
//! evaluates the fresh model before step 1 on 1 and on 3 local ranks, and
//! the two `metrics.jsonl` lines of step 0 are equal, bit for bit. Three
//! ranks over batch counts that 3 does not divide, so that the lead rank
//! must put interleaved shares back in order. Whether the ranks really
//! share the batches is `shared_evaluation.rs`'s unit tests (each batch
//! evaluated once). SQuAD is left out: its runs featurise the training set
//! first, ~25 s of one core each; its evaluation goes through the same
//! functions, checked by hand against the build before (stop 95's note).
//! Where the ranks' parameters differ (SLAMB between averagings) rank 0
//! evaluates its own model alone, as before: the logged evaluation is
//! `terse eval`'s of rank 0's checkpoint.

mod common;

use std::path::Path;
use std::process::Command;

use common::{succeeded, workspace};

/// The step-0 evaluation of `command` with `config` and `extra` settings on
/// `ranks` local ranks (one step, evaluated before it and at the end).
fn evaluation_before(command: &[&str], config: &str, ranks: usize, extra: &[&str]) -> String {
    let scratch = tempfile::tempdir().unwrap();
    let run_dir = scratch.path().join("run");
    succeeded(
        Command::new(env!("CARGO_BIN_EXE_terse"))
            .args(command)
            .args(["--no-progress", "--config", config])
            .args(["--local-ranks", &ranks.to_string()])
            .args(["--set", "train.steps=1", "--set", "train.eval_every=1"])
            .args(["--set", "train.checkpoint_every=0"])
            .args(extra.iter().flat_map(|setting| ["--set", setting]))
            .arg("--run-dir")
            .arg(&run_dir)
            .current_dir(workspace()),
    );
    step_0(&run_dir)
}

/// `metrics.jsonl`'s line of the evaluation before step 1.
fn step_0(run_dir: &Path) -> String {
    let log = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let line = log
        .lines()
        .find(|line| line.starts_with(r#"{"step":0,"eval""#))
        .unwrap_or_else(|| panic!("no evaluation before step 1 in\n{log}"));
    assert!(!line.contains("null"), "{line}");
    line.to_string()
}

/// The two runs side by side.
fn same_on_1_and_3_ranks(command: &[&str], config: &str, extra: &[&str]) {
    let (alone, shared) = std::thread::scope(|scope| {
        let alone = scope.spawn(|| evaluation_before(command, config, 1, extra));
        let shared = evaluation_before(command, config, 3, extra);
        (alone.join().expect("the run alone"), shared)
    });
    assert_eq!(shared, alone, "{config}");
}

#[test]
fn pre_training_s_held_out_loss_and_accuracies() {
    // 160 held-out sequences: 5 batches of 32.
    same_on_1_and_3_ranks(
        &["pretrain"],
        "configs/pretrain-bert-tiny.toml",
        &[
            "task.held_out=160",
            "task.max_seq=32",
            "train.global_batch=6",
            "train.micro_batch=2",
        ],
    );
}

#[test]
fn a_glue_task_s_accuracy_and_f1() {
    same_on_1_and_3_ranks(
        &["finetune", "glue"],
        "configs/finetune-rt-polarity.toml",
        &[
            "task.max_seq=16",
            "train.global_batch=6",
            "train.micro_batch=2",
        ],
    );
}

#[test]
fn an_image_classifier_s_test_accuracy() {
    same_on_1_and_3_ranks(
        &["train"],
        "configs/train-mlp-fashion-mnist.toml",
        &["train.global_batch=6", "train.micro_batch=2"],
    );
}

/// SLAMB's ranks step their own parameters between averagings (every 100
/// steps by default): its evaluation after step 2 is rank 0's model's, the
/// one `terse eval` reads from the step-2 checkpoint, not a mixture of the
/// ranks' models over their shares of the batches (held-out loss 10.9657
/// against rank 0's 10.9701, stop 95).
#[test]
fn ranks_with_their_own_parameters_log_rank_0_s_evaluation() {
    let scratch = tempfile::tempdir().unwrap();
    let run_dir = scratch.path().join("run");
    let terse = || Command::new(env!("CARGO_BIN_EXE_terse"));
    succeeded(
        terse()
            .args(["pretrain", "--no-progress", "--config"])
            .arg("configs/pretrain-bert-tiny.toml")
            .args(["--local-ranks", "2", "--optimizer", "slamb"])
            .args(["--set", "train.steps=3", "--set", "train.eval_every=2"])
            .args([
                "--set",
                "train.checkpoint_every=2",
                "--set",
                "task.max_seq=32",
            ])
            .args([
                "--set",
                "train.global_batch=4",
                "--set",
                "train.micro_batch=2",
            ])
            .arg("--run-dir")
            .arg(&run_dir)
            .current_dir(workspace()),
    );
    let log = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let logged: serde_json::Value = log
        .lines()
        .find(|line| line.starts_with(r#"{"step":2,"eval""#))
        .map(|line| serde_json::from_str(line).unwrap())
        .expect("an evaluation after step 2");
    let output = succeeded(
        terse()
            .args(["eval", "--config"])
            .arg(run_dir.join("config.toml"))
            .arg("--checkpoint")
            .arg(run_dir.join("checkpoints/step-00000002"))
            .current_dir(workspace()),
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    let mut compared = 0;
    // `name<TAB>value` lines, after the checkpoint's description.
    for (name, value) in printed.lines().filter_map(|line| line.split_once('\t')) {
        let logged = logged["eval"][name].as_f64().expect(name);
        assert_eq!(format!("{logged:.4}"), value, "{name}: {printed}");
        compared += 1;
    }
    assert_eq!(compared, 4, "{printed}");
}
