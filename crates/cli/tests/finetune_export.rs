//! A fine-tuned classifier's export loads as HuggingFace expects: the real
//! `terse` binary fine-tunes MiniLM on SNLI (3 classes) for two steps, and
//! the export directory holds the weights, a `config.json` naming the three
//! labels both ways (without `num_labels`, `transformers` builds a 2-label
//! head and refuses these weights) and the tokenizer the examples were made
//! with. That such a directory loads in `transformers` with the same
//! logits is `tests/minilm_hf.rs`'s three-class test (a committed fixture
//! written by the same functions and checked by
//! `models/tests/fixtures/check_hf_export.py`).

mod common;

use std::process::Command;

use common::{succeeded, workspace};

#[test]
fn a_three_class_export_names_its_labels_and_carries_its_tokenizer() {
    let workspace = workspace();
    let scratch = tempfile::tempdir().unwrap();
    let run_dir = scratch.path().join("run");
    succeeded(
        Command::new(env!("CARGO_BIN_EXE_terse"))
            .args(["finetune", "glue", "--no-progress", "--config"])
            .arg("configs/finetune-snli.toml")
            .args(["--set", "train.steps=2", "--set", "train.eval_every=0"])
            // Short sequences: the end-of-run evaluation reads all 10,000 test pairs.
            .args(["--set", "task.max_seq=16"])
            .arg("--run-dir")
            .arg(&run_dir)
            .current_dir(&workspace),
    );
    let export = run_dir.join("export");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(export.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["architectures"][0], "BertForSequenceClassification");
    assert_eq!(config["num_labels"], 3);
    assert_eq!(config["id2label"]["0"], "contradiction");
    assert_eq!(config["label2id"]["neutral"], 2);
    let tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(export.join("tokenizer.json")).unwrap())
            .unwrap();
    assert_eq!(tokenizer["model"]["type"], "WordPiece");
    assert!(export.join("model.safetensors").exists());
}
