//! `--deepspeed ds_config.json` with the real `terse` binary and
//! DeepSpeedExamples' BERT 1-bit LAMB config
//! (`tests/fixtures/deepspeed/`). As published (fp16 on) it resolves to
//! `train.precision = "fp16"` with its loss scaling. With fp16 off, its
//! values reach the resolved config:
//! `--print-config`, and the config.toml a short run writes; the values it
//! set are printed once on stderr. The keys it left
//! out are listed once, and `--set` still wins over it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const DS_CONFIG: &str =
    "crates/cli/tests/fixtures/deepspeed/deepspeed_bsz64k_onebitlamb_config_seq128_nccl.json";

fn terse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_terse"))
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(args)
        .current_dir(common::workspace())
        .output()
        .unwrap()
}

/// The published config with fp16 turned off.
fn fp32_copy(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(common::workspace().join(DS_CONFIG)).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["fp16"]["enabled"] = false.into();
    let path = dir.join("ds_config.json");
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

#[test]
fn the_published_config_trains_in_fp16_with_its_loss_scaling() {
    // Its freeze (step 1000) lies past BERT-Tiny's 30 steps: refused, the
    // run would never compress, unless allowed.
    let output = terse(&["--deepspeed", DS_CONFIG, "--print-config"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("would train as the uncompressed baseline"),
        "{stderr}"
    );
    let output = terse(&[
        "--deepspeed",
        DS_CONFIG,
        "--allow-no-compression",
        "--print-config",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let resolved: toml::Table = String::from_utf8_lossy(&output.stdout).parse().unwrap();
    assert_eq!(resolved["train"]["precision"].as_str(), Some("fp16"));
    assert_eq!(
        resolved["train"]["loss_scaling"]["initial_scale_power"].as_integer(),
        Some(16)
    );
    // `loss_scale: 0` is DeepSpeed's dynamic scaling: no static scale.
    assert!(
        resolved["train"]["loss_scaling"]
            .get("static_scale")
            .is_none()
    );
}

#[test]
fn its_values_reach_the_resolved_config_and_a_run() {
    let scratch = tempfile::tempdir().unwrap();
    let ds = fp32_copy(scratch.path());
    let ds = ds.to_str().unwrap();
    let output = terse(&[
        "--deepspeed",
        ds,
        "--allow-no-compression",
        "--print-config",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let resolved: toml::Table = String::from_utf8_lossy(&output.stdout).parse().unwrap();
    let optimizer = resolved["optimizer"].as_table().unwrap();
    assert_eq!(optimizer["name"].as_str(), Some("onebit_lamb"));
    for (field, value) in [
        ("c_max", 0.3),
        ("c_min", 0.01),
        ("beta_3", 0.9),
        ("r_max", 4.0),
        ("r_min", 0.5),
        ("r_threshold", 0.1),
        ("weight_decay", 0.01),
    ] {
        assert_eq!(optimizer[field].as_float(), Some(value), "{field}");
    }
    // DeepSpeed's freeze_step 1000 counts its set-up step: 999 of warmup.
    assert_eq!(optimizer["freeze_step"].as_integer(), Some(999));
    assert_eq!(resolved["train"]["global_batch"].as_integer(), Some(65536));
    assert_eq!(resolved["train"]["micro_batch"].as_integer(), Some(64));
    assert_eq!(resolved["train"]["max_grad_norm"].as_float(), Some(1.0));
    assert_eq!(resolved["schedule"]["kind"].as_str(), Some("constant"));
    assert_eq!(resolved["schedule"]["lr"].as_float(), Some(0.011));
    // What it set, with the values, said once before the run.
    let sets: Vec<&str> = stderr.lines().filter(|l| l.contains(": sets ")).collect();
    assert_eq!(sets.len(), 1, "{stderr}");
    for value in [
        "train.max_grad_norm = 1.0",
        "train.global_batch = 65536",
        "name = \"onebit_lamb\"",
        "freeze_step = 999",
    ] {
        assert!(sets[0].contains(value), "{value}: {stderr}");
    }
    let notes: Vec<&str> = stderr.lines().filter(|l| l.contains("left out")).collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    for key in ["steps_per_print", "cuda_aware", "comm_backend_name", "fp16"] {
        assert!(notes[0].contains(key), "{key}: {stderr}");
    }

    // A run of BERT-Tiny under it, at a batch that fits: --set wins, and the
    // run's own config.toml holds the DeepSpeed values.
    let run_dir = scratch.path().join("run");
    let output = terse(&[
        "--deepspeed",
        ds,
        "--set",
        "train.global_batch=8",
        "--set",
        "train.micro_batch=4",
        "--set",
        "optimizer.freeze_step=2",
        "--set",
        "train.eval_every=0",
        "--set",
        "train.checkpoint_every=0",
        "--steps",
        "3",
        "--run-dir",
        run_dir.to_str().unwrap(),
    ]);
    let text = common::text(&output);
    assert!(output.status.success(), "{text}");
    let written: toml::Table = std::fs::read_to_string(run_dir.join("config.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(written["optimizer"]["name"].as_str(), Some("onebit_lamb"));
    assert_eq!(written["optimizer"]["r_max"].as_float(), Some(4.0));
    assert_eq!(written["optimizer"]["freeze_step"].as_integer(), Some(2));
    assert_eq!(written["train"]["global_batch"].as_integer(), Some(8));
    assert_eq!(written["train"]["max_grad_norm"].as_float(), Some(1.0));
}

#[test]
fn a_check_its_settings_fail_names_the_ds_config() {
    // Its WarmupDecayLR ends at step 10; BERT-Tiny's config runs 30 steps.
    let scratch = tempfile::tempdir().unwrap();
    let ds = scratch.path().join("short.json");
    std::fs::write(
        &ds,
        r#"{"optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
            "scheduler": {"type": "WarmupDecayLR",
                          "params": {"total_num_steps": 10, "warmup_num_steps": 2,
                                     "warmup_type": "linear"}}}"#,
    )
    .unwrap();
    let output = terse(&["--deepspeed", ds.to_str().unwrap(), "--print-config"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("with what --deepspeed {} sets", ds.display())),
        "{stderr}"
    );
}
