//! Runs the real `cargo xtask` binary to pin what a user and CI see: a
//! training command that cannot run says why before building anything, in
//! one line; `--help` succeeds.

use std::process::{Command, Output};

/// `cargo xtask ARGS` from the checkout's root, where it runs (anywhere
/// else it refuses to).
fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("NO_COLOR", "1")
        .output()
        .expect("the xtask binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("stderr is UTF-8")
}

/// Runs xtask with `args`, which must exit 1: its standard error.
fn fails(args: &[&str]) -> String {
    let output = xtask(args);
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{message}");
    message
}

#[test]
fn an_unknown_dataset_fails_listing_the_known_ones() {
    let stderr = fails(&["data", "fetch", "squad-v2"]);
    assert!(
        stderr.contains("no dataset named \"squad-v2\"; known: squad-v1.1, minilm, sotu"),
        "{stderr}"
    );
}

/// Training commands check what they can before building anything: a
/// missing config, or a GLUE task whose data cannot be fetched here, fails
/// at once with one line saying what to do.
#[test]
fn training_commands_fail_early_on_what_they_cannot_run() {
    let message = fails(&["pretrain", "--config", "configs/no-such.toml"]);
    assert_eq!(
        message,
        "terse: configs/no-such.toml: no such config (configs/ lists the ones that exist)\n"
    );
    let message = fails(&["finetune", "glue", "--task", "sst2"]);
    assert!(
        message.contains("configs/paper-glue-sst2.toml"),
        "{message}"
    );
    let message = fails(&["train", "resnet110", "--dataset", "mnist"]);
    assert!(
        message.contains("configs/train-resnet110-mnist.toml: no such config"),
        "{message}"
    );
}

#[test]
fn help_succeeds_and_lists_every_command() {
    let output = xtask(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let help = String::from_utf8(output.stdout).expect("help is UTF-8");
    assert!(help.contains("Usage: cargo xtask <COMMAND>"), "{help}");
    for name in [
        "pretrain",
        "finetune",
        "train",
        "reproduce",
        "bench",
        "data",
    ] {
        assert!(
            help.contains(&format!("\n  {name} ")),
            "{name} missing:\n{help}"
        );
    }
}

#[test]
fn a_model_or_dataset_without_a_config_lists_the_shipped_ones() {
    let message = fails(&["train", "resnet20", "--dataset", "svhn"]);
    assert_eq!(
        message,
        "terse: configs/train-resnet20-svhn.toml: no such config; models shipped for svhn: \
         none (or pass --config)\n"
    );
    let message = fails(&["train", "alexnet"]);
    assert!(
        message.contains("models shipped for fashion-mnist: mlp, resnet20"),
        "{message}"
    );
}

/// From a subdirectory the shipped configs and runs/ are not where its
/// relative paths point: refused, naming the root.
#[test]
fn a_subdirectory_of_the_checkout_is_refused_naming_the_root() {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["train", "alexnet"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{message}");
    assert!(
        message.contains("cargo xtask runs from the checkout's root"),
        "{message}"
    );
}
