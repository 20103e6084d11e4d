//! `cargo xtask pretrain`: masked-LM pre-training of BERT, the workload all
//! three papers measure their optimizers on.
//!
//! It builds the `terse` binary and launches `terse pretrain` on `--ranks`
//! processes (through `mpirun` when there is more than one) with the
//! preset's config, `configs/pretrain-<preset>.toml`, unless `--config`
//! names another. The binary fetches and checks the corpus and the
//! tokenizer, and makes the examples once into the cache.

use anyhow::Result;
use clap::{ValueEnum, value_parser};

use crate::run_args::RunArgs;

/// Arguments of `cargo xtask pretrain`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// Model size to pre-train
    #[arg(value_enum, default_value_t = Preset::BertLarge)]
    pub preset: Preset,

    #[command(flatten)]
    pub run: RunArgs,

    /// Optimizer steps to run; defaults to the config's step count
    #[arg(long, value_name = "N", value_parser = value_parser!(u64).range(1..))]
    pub steps: Option<u64>,
}

/// A BERT size to pre-train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// BERT-Large: 24 layers, hidden 1024, 16 heads (the papers' model)
    BertLarge,
    /// BERT-Base: 12 layers, hidden 768, 12 heads
    BertBase,
    /// 6 layers, hidden 384, 12 heads: the all-MiniLM-L6-v2 shape, sized for one machine
    MinilmL6,
    /// BERT-Tiny: 2 layers, hidden 128 (seconds per run: tests and trials)
    BertTiny,
}

impl Preset {
    /// The preset's config file.
    pub fn config(self) -> &'static str {
        match self {
            Preset::BertLarge => "configs/pretrain-bert-large.toml",
            Preset::BertBase => "configs/pretrain-bert-base.toml",
            Preset::MinilmL6 => "configs/pretrain-minilm-l6.toml",
            Preset::BertTiny => "configs/pretrain-bert-tiny.toml",
        }
    }
}

/// Runs `pretrain`.
pub fn run(args: &Args) -> Result<()> {
    let config = args.run.config_or(args.preset.config())?;
    let mut terse = vec!["pretrain".to_string()];
    terse.extend(args.run.terse_args(&config));
    if let Some(steps) = args.steps {
        terse.extend(["--steps".into(), steps.to_string()]);
    }
    args.run.launch(&terse)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::Command;
    use crate::testing;

    fn args(argv: &[&str]) -> Args {
        match testing::command(argv) {
            Command::Pretrain(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_to_bert_large_on_one_rank() {
        let args = args(&["pretrain"]);
        assert_eq!(args.preset, Preset::BertLarge);
        assert_eq!(args.steps, None);
        assert_eq!(args.run.ranks, 1);
        assert_eq!(args.run.optimizer, None);
        assert_eq!(args.run.config, None);
    }

    #[test]
    fn parses_every_option() {
        let args = args(&[
            "pretrain",
            "minilm-l6",
            "--optimizer",
            "onebit-lamb",
            "--ranks",
            "4",
            "--steps",
            "1000",
            "--config",
            "configs/x.toml",
        ]);
        assert_eq!(args.preset, Preset::MinilmL6);
        assert_eq!(args.run.optimizer, Some("onebit_lamb".to_string()));
        assert_eq!(args.run.ranks, 4);
        assert_eq!(args.steps, Some(1000));
        assert_eq!(args.run.config, Some(PathBuf::from("configs/x.toml")));
    }

    #[test]
    fn accepts_the_config_spelling_of_optimizers() {
        let args = args(&["pretrain", "--optimizer", "onebit_adam"]);
        assert_eq!(args.run.optimizer, Some("onebit_adam".to_string()));
    }

    #[test]
    fn rejects_unknown_preset_listing_the_valid_ones() {
        let message = testing::rejection(&["pretrain", "bert-huge"]);
        assert!(message.contains("bert-huge"), "{message}");
        for valid in ["bert-large", "bert-base", "minilm-l6"] {
            assert!(message.contains(valid), "{valid} not listed:\n{message}");
        }
    }

    #[test]
    fn rejects_unknown_optimizer_and_zero_ranks_or_steps() {
        let message = testing::rejection(&["pretrain", "--optimizer", "adagrad"]);
        for valid in ["adam", "lamb", "sgd", "onebit-adam", "onebit-lamb", "slamb"] {
            assert!(message.contains(valid), "{valid} not listed:\n{message}");
        }
        testing::rejection(&["pretrain", "--ranks", "0"]);
        testing::rejection(&["pretrain", "--steps", "0"]);
        testing::rejection(&["pretrain", "--ranks", "two"]);
    }

    #[test]
    fn presets_name_existing_configs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for preset in Preset::value_variants() {
            assert!(root.join(preset.config()).exists(), "{}", preset.config());
        }
    }

    #[test]
    fn passes_the_run_options_to_terse() {
        let args = args(&[
            "pretrain",
            "--optimizer",
            "onebit-lamb",
            "--run-dir",
            "runs/x",
            "--resume",
            "--set",
            "train.steps=9",
            "--set",
            "optimizer.freeze_step=3",
            "--allow-no-compression",
        ]);
        assert_eq!(
            args.run.terse_args(std::path::Path::new("c.toml")),
            [
                "--config",
                "c.toml",
                "--optimizer",
                "onebit_lamb",
                "--run-dir",
                "runs/x",
                "--resume",
                "--set",
                "train.steps=9",
                "--set",
                "optimizer.freeze_step=3",
                "--allow-no-compression",
            ]
        );
    }
}
