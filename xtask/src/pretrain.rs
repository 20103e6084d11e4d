//! `cargo xtask pretrain`: masked-LM pre-training of BERT, the workload all
//! three papers measure their optimizers on.
//!
//! It will build the `terse` binary and launch `terse pretrain` on `--ranks`
//! processes (through `mpirun` when there is more than one). Until issue 8
//! lands it parses its arguments and fails with [`NotImplemented`].

use anyhow::Result;
use clap::{ValueEnum, value_parser};

use crate::not_implemented::{ISSUE_8, NotImplemented, Tracking};
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
}

/// Runs `pretrain`: not implemented yet.
pub fn run(_args: &Args) -> Result<()> {
    Err(NotImplemented::new("pretrain", Tracking::In(ISSUE_8)).into())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::Command;
    use crate::run_args::Optimizer;
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
        assert_eq!(args.run.optimizer, Some(Optimizer::OnebitLamb));
        assert_eq!(args.run.ranks, 4);
        assert_eq!(args.steps, Some(1000));
        assert_eq!(args.run.config, Some(PathBuf::from("configs/x.toml")));
    }

    #[test]
    fn accepts_the_config_spelling_of_optimizers() {
        let args = args(&["pretrain", "--optimizer", "onebit_adam"]);
        assert_eq!(args.run.optimizer, Some(Optimizer::OnebitAdam));
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
    fn is_not_implemented_yet_issue_8() {
        let err = testing::not_implemented(&["pretrain", "bert-base", "--ranks", "2"]);
        assert_eq!(err.command, "pretrain");
        assert_eq!(err.tracking.issue().number, 8);
        assert_eq!(
            err.to_string(),
            "`pretrain` is not implemented yet \
             (tracked in issue 8: the distributed trainer and user commands)"
        );
    }
}
