//! `cargo xtask pretrain`: masked-LM pre-training of BERT, the workload all
//! three papers measure their optimizers on.
//!
//! It builds the `terse` binary and launches `terse pretrain MODEL` on
//! `--ranks` processes (through `mpirun` when there is more than one).
//! Which models exist is terse's business (its shipped
//! `configs/pretrain-<MODEL>.toml`, or `--config`, which terse checks against
//! MODEL); this command only checks that the config is there before it
//! starts processes. The binary fetches and checks the corpus and the
//! tokenizer, and makes the examples once into the cache.

use std::path::Path;

use anyhow::{Result, anyhow};

use crate::run_args::RunArgs;

/// The model when neither MODEL nor `--config` is given: the papers'.
const DEFAULT_MODEL: &str = "bert-large";

/// Arguments of `cargo xtask pretrain`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// The model (bert-large, bert-base, minilm-l6, bert-tiny: the
    /// configs/pretrain-<MODEL>.toml there are) [default: bert-large, or
    /// the model of --config]; with --config, terse checks they agree
    #[arg(value_name = "MODEL")]
    pub model: Option<String>,

    #[command(flatten)]
    pub run: RunArgs,
}

/// The `terse` command line for these arguments, checking that the
/// config it will read exists (in `configs`, relative to where terse runs).
fn terse_command(args: &Args, configs: &Path) -> Result<Vec<String>> {
    let mut terse = vec!["pretrain".to_string()];
    let model = match (&args.model, &args.run.terse.config) {
        (Some(model), _) => Some(model.clone()),
        (None, None) => Some(DEFAULT_MODEL.to_string()),
        (None, Some(_)) => None,
    };
    if let (None, Some(model)) = (&args.run.terse.config, &model) {
        crate::shipped_configs::config(configs, "pretrain-", model, ".toml", "models shipped")
            .map_err(|e| anyhow!("{e} (or pass --config)"))?;
    }
    terse.extend(model);
    terse.extend(args.run.terse_args());
    Ok(terse)
}

/// Runs `pretrain`.
pub fn run(args: &Args) -> Result<()> {
    let terse = terse_command(args, Path::new("configs"))?;
    args.run.launch(&terse)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::testing;

    fn args(argv: &[&str]) -> Args {
        testing::parsed_as!(Pretrain, argv)
    }

    fn configs() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs")
    }

    #[test]
    fn defaults_to_bert_large_on_one_rank() {
        let args = args(&["pretrain"]);
        assert_eq!(args.model, None);
        assert_eq!(args.run.terse.steps, None);
        assert_eq!(args.run.ranks, 1);
        assert_eq!(args.run.terse.optimizer, None);
        assert_eq!(args.run.terse.config, None);
        assert_eq!(
            terse_command(&args, &configs()).unwrap(),
            ["pretrain", "bert-large"]
        );
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
        assert_eq!(args.model.as_deref(), Some("minilm-l6"));
        assert_eq!(args.run.terse.optimizer, Some("onebit_lamb".to_string()));
        assert_eq!(args.run.ranks, 4);
        assert_eq!(args.run.terse.steps, Some(1000));
        assert_eq!(args.run.terse.config, Some(PathBuf::from("configs/x.toml")));
    }

    #[test]
    fn passes_local_ranks_steps_and_no_progress_on() {
        let args = args(&[
            "pretrain",
            "bert-tiny",
            "--local-ranks",
            "2",
            "--steps",
            "3",
            "--no-progress",
            "--comm",
            "local",
        ]);
        assert_eq!(
            terse_command(&args, &configs()).unwrap(),
            [
                "pretrain",
                "bert-tiny",
                "--comm",
                "local",
                "--local-ranks",
                "2",
                "--steps",
                "3",
                "--no-progress"
            ]
        );
        testing::rejection(&["pretrain", "--local-ranks", "0"]);
    }

    #[test]
    fn accepts_the_config_spelling_of_optimizers() {
        let args = args(&["pretrain", "--optimizer", "onebit_adam"]);
        assert_eq!(args.run.terse.optimizer, Some("onebit_adam".to_string()));
    }

    /// Before a build or a process: the same refusal as terse's (whose
    /// tests check the list), from the same shipped_names.rs.
    #[test]
    fn a_model_without_a_config_is_refused_here() {
        let message = terse_command(&args(&["pretrain", "bert-huge"]), &configs())
            .unwrap_err()
            .to_string();
        let huge = configs().join("pretrain-bert-huge.toml");
        let listed = format!("{}: no such config; models shipped: bert-", huge.display());
        assert!(message.starts_with(&listed), "{message}");
        assert!(message.ends_with(" (or pass --config)"), "{message}");
    }

    #[test]
    fn a_model_and_a_config_both_go_to_terse_which_checks_them() {
        let config = configs().join("pretrain-bert-tiny.toml");
        let config = config.to_str().unwrap();
        let both = args(&["pretrain", "bert-base", "--config", config]);
        assert_eq!(
            terse_command(&both, &configs()).unwrap(),
            ["pretrain", "bert-base", "--config", config]
        );
        let config_only = args(&["pretrain", "--config", config]);
        assert_eq!(
            terse_command(&config_only, &configs()).unwrap(),
            ["pretrain", "--config", config]
        );
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
    fn passes_the_run_options_to_terse() {
        // The optimizer in the config's spelling, which terse gets as typed
        // (`onebit-lamb` becomes it, see above).
        let run = [
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
        ];
        let args = args(&[&["pretrain"][..], &run].concat());
        assert_eq!(args.run.terse_args(), run);
    }
}
