//! `terse export`: a checkpoint written out in HuggingFace's layout, as the
//! run's own export/ holds it. The real binary pre-trains BERT-Tiny for 2
//! steps, then exports the run's newest checkpoint into another directory:
//! the same files, and the same tensors as the run's export; without
//! `--out` it says what is missing. `--dtype bf16` writes every weight
//! rounded to the nearest bf16 and config.json's torch_dtype.
//! `eval --out` and `--dtype` outside `export` are refused, not ignored.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::{tensors, workspace};

fn terse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_terse"))
        .args(args)
        .current_dir(workspace())
        .output()
        .expect("terse starts")
}

/// A scratch directory holding BERT-Tiny pre-trained for 2 steps (`run`),
/// and where an export into `out_name` goes.
fn trained(out_name: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let scratch = tempfile::tempdir().unwrap();
    let (run, out) = (scratch.path().join("run"), scratch.path().join(out_name));
    let trained = terse(&[
        "pretrain",
        "--no-progress",
        "--config",
        "configs/pretrain-bert-tiny.toml",
        "--set",
        "train.steps=2",
        "--run-dir",
        run.to_str().unwrap(),
    ]);
    assert!(
        trained.status.success(),
        "{}",
        String::from_utf8_lossy(&trained.stderr)
    );
    (scratch, run, out)
}

#[test]
fn a_checkpoint_exports_as_the_run_did() {
    let (_scratch, run, out) = trained("out");
    let (run_s, out_s) = (run.to_str().unwrap(), out.to_str().unwrap());
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

#[test]
fn a_bf16_export_rounds_every_weight_to_the_nearest_bf16() {
    let (_scratch, run, out) = trained("bf16");
    let (run_s, out_s) = (run.to_str().unwrap(), out.to_str().unwrap());
    let config = run.join("config.toml");
    let exported = terse(&[
        "export",
        "--config",
        config.to_str().unwrap(),
        "--checkpoint",
        run_s,
        "--out",
        out_s,
        "--dtype",
        "bf16",
    ]);
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "bfloat16");

    // Against the run's fp32 export: each weight's bf16 is its f32 rounded
    // to nearest, ties to even (bits + 0x7fff + the kept part's lowest bit,
    // then the top 16 bits: the rule written out here, not `half`'s call).
    let fp32_bytes = std::fs::read(run.join("export/model.safetensors")).unwrap();
    let bf16_bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let fp32 = safetensors::SafeTensors::deserialize(&fp32_bytes).unwrap();
    let bf16 = safetensors::SafeTensors::deserialize(&bf16_bytes).unwrap();
    assert_eq!(fp32.names().len(), bf16.names().len());
    let mut checked = 0;
    for (name, view) in fp32.tensors() {
        let half = bf16.tensor(&name).unwrap();
        assert_eq!(half.dtype(), safetensors::Dtype::BF16, "{name}");
        assert_eq!(half.shape(), view.shape(), "{name}");
        for (f, h) in view.data().chunks_exact(4).zip(half.data().chunks_exact(2)) {
            let bits = u32::from_le_bytes([f[0], f[1], f[2], f[3]]);
            let rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
            assert_eq!(u16::from_le_bytes([h[0], h[1]]), rounded as u16, "{name}");
            checked += 1;
        }
    }
    assert!(checked > 4_000_000, "BERT-Tiny's weights: {checked}");
}

#[test]
fn flags_an_action_does_not_use_are_refused_before_anything_loads() {
    let refusals = [
        (
            ["eval", "--out", "metrics.txt"],
            "--out is for `predict` and `export`",
        ),
        (["eval", "--dtype", "bf16"], "--dtype is for `export` only"),
        (
            ["predict", "--dtype", "bf16"],
            "--dtype is for `export` only",
        ),
    ];
    for (args, said) in refusals {
        let mut all = args.to_vec();
        all.extend(["--config", "no-such.toml", "--checkpoint", "no-such-dir"]);
        let refused = terse(&all);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{all:?} ran");
        assert!(stderr.contains(said), "{all:?}: {stderr}");
    }
}
