//! `terse export`: a checkpoint written out in HuggingFace's layout, as the
//! run's own export/ holds it. The real binary pre-trains BERT-Tiny for 2
//! steps, then exports the run's newest checkpoint into another directory:
//! the same files, and the same tensors as the run's export; without
//! `--out` it says what is missing.

mod common;

use std::process::{Command, Output};

use common::{tensors, workspace};

fn terse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_terse"))
        .args(args)
        .current_dir(workspace())
        .output()
        .expect("terse starts")
}

#[test]
fn a_checkpoint_exports_as_the_run_did() {
    let scratch = tempfile::Builder::new()
        .prefix("terse-export-cmd-")
        .tempdir()
        .unwrap();
    let base = scratch.path();
    let (run, out) = (base.join("run"), base.join("out"));
    let (run_s, out_s) = (run.to_str().unwrap(), out.to_str().unwrap());
    let trained = terse(&[
        "pretrain",
        "--no-progress",
        "--config",
        "configs/pretrain-bert-tiny.toml",
        "--set",
        "train.steps=2",
        "--run-dir",
        run_s,
    ]);
    assert!(
        trained.status.success(),
        "{}",
        String::from_utf8_lossy(&trained.stderr)
    );
    let config = run.join("config.toml");
    let config_s = config.to_str().unwrap();

    let refused = terse(&["export", "--config", config_s, "--checkpoint", run_s]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--out"));

    let exported = terse(&[
        "export",
        "--config",
        config_s,
        "--checkpoint",
        run_s,
        "--out",
        out_s,
    ]);
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    assert_eq!(
        tensors(&out.join("model.safetensors")),
        tensors(&run.join("export/model.safetensors")),
        "the exported checkpoint differs from the run's export"
    );
}
