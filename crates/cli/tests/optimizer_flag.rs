//! `--optimizer NAME` with the real `terse` binary: it swaps the algorithm
//! and keeps the config's shared hyper-parameters (read back from the
//! config.toml the run wrote), and it refuses a 1-bit optimizer whose
//! freeze the run never reaches, naming freeze_step and the steps.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn terse(config: &Path, run_dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_terse"))
        .args(["pretrain", "--no-progress", "--config"])
        .arg(config)
        .arg("--run-dir")
        .arg(run_dir)
        .args([
            "--set",
            "train.eval_every=0",
            "--set",
            "train.checkpoint_every=0",
        ])
        .args(extra)
        .current_dir(common::workspace())
        .output()
        .unwrap()
}

/// The BERT-Tiny config with `optimizer` as its optimizer section.
fn config_with(dir: &Path, optimizer: &str) -> std::path::PathBuf {
    let shipped =
        std::fs::read_to_string(common::workspace().join("configs/pretrain-bert-tiny.toml"))
            .unwrap();
    let mut table: toml::Table = shipped.parse().unwrap();
    table.insert(
        "optimizer".into(),
        optimizer.parse::<toml::Table>().unwrap().into(),
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, toml::to_string(&table).unwrap()).unwrap();
    path
}

#[test]
fn optimizer_keeps_the_configs_weight_decay_and_bias_correction() {
    let scratch = tempfile::tempdir().unwrap();
    // Adam with settings that differ from 1-bit Adam's defaults (weight
    // decay 0, bias correction off, β₂ 0.999).
    let config = config_with(
        scratch.path(),
        "name = \"adam\"\nweight_decay = 0.03\nbias_correction = true\nbeta_2 = 0.98\n",
    );
    let run_dir = scratch.path().join("run");
    let output = terse(
        &config,
        &run_dir,
        &[
            "--optimizer",
            "onebit-adam",
            "--set",
            "optimizer.freeze_step=1",
            "--steps",
            "2",
        ],
    );
    assert!(output.status.success(), "{}", common::text(&output));
    let resolved: toml::Table = std::fs::read_to_string(run_dir.join("config.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let optimizer = resolved["optimizer"].as_table().unwrap();
    println!("resolved [optimizer]: {optimizer}");
    assert_eq!(optimizer["name"].as_str(), Some("onebit_adam"));
    assert_eq!(optimizer["weight_decay"].as_float(), Some(0.03));
    assert_eq!(optimizer["bias_correction"].as_bool(), Some(true));
    assert_eq!(optimizer["beta_2"].as_float(), Some(0.98));
    assert_eq!(optimizer["freeze_step"].as_integer(), Some(1));
    // The schedule is the config's, untouched.
    assert_eq!(resolved["schedule"]["peak"].as_float(), Some(5e-3));
}

#[test]
fn a_freeze_the_run_never_reaches_is_refused_naming_freeze_step_and_steps() {
    let scratch = tempfile::tempdir().unwrap();
    let config = config_with(scratch.path(), "name = \"adam\"\n");
    let run_dir = scratch.path().join("run");
    // 1-bit Adam's default freeze (step 1000) lies past a 30-step run.
    let output = terse(&config, &run_dir, &["--optimizer", "onebit-adam"]);
    let text = common::text(&output);
    println!("{}", text.lines().last().unwrap_or(""));
    assert_eq!(output.status.code(), Some(1), "{text}");
    for said in [
        "freeze_step = 1000",
        "steps 1–30",
        "never compresses",
        "--set optimizer.freeze_step=6",
        "--allow-no-compression",
    ] {
        assert!(text.contains(said), "{said:?} not in:\n{text}");
    }
    assert!(!run_dir.join("metrics.jsonl").exists(), "nothing trained");
    // Asked explicitly, it runs (as the uncompressed baseline it is).
    let output = terse(
        &config,
        &run_dir,
        &[
            "--optimizer",
            "onebit-adam",
            "--allow-no-compression",
            "--steps",
            "1",
        ],
    );
    assert!(output.status.success(), "{}", common::text(&output));
}

/// Every registered optimizer, as `--optimizer` spells it (`zero-one-adam`),
/// resolves on every command's shipped config: the config it would train
/// with names it, and the plan line says what each part of the run sends.
#[test]
fn every_optimizer_resolves_on_every_command() {
    let commands: [(&[&str], &str); 4] = [
        (&["train"], "configs/train-mlp-fashion-mnist.toml"),
        (&["pretrain"], "configs/pretrain-bert-tiny.toml"),
        (&["finetune", "glue"], "configs/finetune-rt-polarity.toml"),
        (&["finetune", "squad"], "configs/finetune-squad.toml"),
    ];
    for (command, config) in commands {
        let command = command.join(" ");
        for name in terse_optim::OPTIMIZER_NAMES.lines() {
            let flag = name.replace('_', "-");
            let output = Command::new(env!("CARGO_BIN_EXE_terse"))
                .args(command.split(' '))
                .args(["--config", config, "--optimizer", &flag])
                .args(["--allow-no-compression", "--print-config"])
                .current_dir(common::workspace())
                .output()
                .unwrap();
            let text = common::text(&output);
            assert!(
                output.status.success(),
                "{command} --optimizer {flag}:\n{text}"
            );
            let printed = String::from_utf8_lossy(&output.stdout);
            let resolved: toml::Table = printed
                .parse()
                .unwrap_or_else(|e| panic!("{command} --optimizer {flag}: {e}\n{printed}"));
            assert_eq!(
                resolved["optimizer"]["name"].as_str(),
                Some(name),
                "{command} --optimizer {flag}"
            );
        }
    }
}
