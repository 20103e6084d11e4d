//! `cargo xtask finetune`: fine-tune a pre-trained BERT on SQuAD or GLUE.
//!
//! Fine-tuning is how the papers show that a model pre-trained with a
//! compressed optimizer is as good as one pre-trained with Adam or LAMB. It
//! builds and launches `terse finetune` with `configs/finetune-<task>.toml`
//! (or `--config`), which fetches and checks the data and the pretrained
//! MiniLM, trains, and prints the task's metric (SQuAD: EM/F1 from
//! predictions.json in the run directory).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Subcommand, ValueEnum};

use crate::cli_name::cli_name;
use crate::run_args::RunArgs;

/// Arguments of `cargo xtask finetune`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub benchmark: Benchmark,
}

/// The downstream benchmark to fine-tune on.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Benchmark {
    /// SQuAD v1.1 question answering (reports exact match and F1)
    Squad(Common),
    /// A GLUE task or one of its stand-ins (reports the task's metric)
    Glue {
        /// The task to fine-tune on
        #[arg(long, value_enum)]
        task: GlueTask,

        #[command(flatten)]
        common: Common,
    },
}

/// Options every fine-tuning benchmark takes.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Common {
    /// Checkpoint directory to start from (a `pretrain` output or imported
    /// HuggingFace weights); defaults to the one the config names
    #[arg(long, value_name = "CHECKPOINT")]
    pub from: Option<PathBuf>,

    #[command(flatten)]
    pub run: RunArgs,
}

/// A GLUE task, or a stand-in for one whose data these machines can reach
/// (see DATA.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GlueTask {
    /// SST-2 sentiment (accuracy)
    Sst2,
    /// MNLI entailment, matched and mismatched (accuracy)
    Mnli,
    /// Rotten Tomatoes sentences, the source SST-2 was built from (accuracy)
    RtPolarity,
    /// SNLI entailment, the MNLI stand-in (accuracy)
    Snli,
    /// IMDB review sentiment (accuracy)
    Imdb,
    /// CoLA acceptability (Matthews correlation)
    Cola,
    /// MRPC paraphrase (F1 and accuracy)
    Mrpc,
    /// STS-B similarity (Pearson and Spearman correlation)
    Stsb,
    /// QQP duplicate questions (accuracy and F1)
    Qqp,
    /// QNLI question entailment (accuracy)
    Qnli,
    /// RTE entailment (accuracy)
    Rte,
    /// WNLI coreference entailment (accuracy)
    Wnli,
}

/// Runs `finetune`.
pub fn run(args: &Args) -> Result<()> {
    let (benchmark, common, default) = match &args.benchmark {
        Benchmark::Squad(common) => ("squad", common, "configs/finetune-squad.toml".to_string()),
        Benchmark::Glue { task, common } => {
            let name = cli_name(task);
            let default = format!("configs/finetune-{name}.toml");
            if common.run.config.is_none() && !std::path::Path::new(&default).exists() {
                bail!(
                    "GLUE's {name} data cannot be downloaded on these machines, so there is no \
                     default config for it: copy configs/paper-glue-sst2.toml, point glue_dir at \
                     the task's TSVs and pass it with --config (rt-polarity, imdb and snli run \
                     as they are)"
                );
            }
            ("glue", common, default)
        }
    };
    let config = common.run.config_or(&default)?;
    let mut terse = vec!["finetune".to_string(), benchmark.to_string()];
    if let Benchmark::Glue { task, .. } = &args.benchmark {
        // terse checks that the config is this task's.
        terse.extend(["--task".into(), cli_name(task)]);
    }
    terse.extend(common.run.terse_args(&config));
    if let Some(from) = &common.from {
        terse.extend(["--from".into(), from.display().to_string()]);
    }
    common.run.launch(&terse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;
    use crate::testing;

    fn benchmark(argv: &[&str]) -> Benchmark {
        match testing::command(argv) {
            Command::Finetune(args) => args.benchmark,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn squad_takes_checkpoint_and_run_options() {
        let parsed = benchmark(&[
            "finetune",
            "squad",
            "--from",
            "runs/bert/step-1000",
            "--optimizer",
            "adam",
            "--ranks",
            "2",
        ]);
        let Benchmark::Squad(common) = parsed else {
            panic!("parsed as {parsed:?}");
        };
        assert_eq!(common.from, Some(PathBuf::from("runs/bert/step-1000")));
        assert_eq!(common.run.optimizer, Some("adam".to_string()));
        assert_eq!(common.run.ranks, 2);
        assert_eq!(common.run.config, None);
    }

    #[test]
    fn glue_parses_every_task_name() {
        let names = [
            ("sst2", GlueTask::Sst2),
            ("mnli", GlueTask::Mnli),
            ("rt-polarity", GlueTask::RtPolarity),
            ("snli", GlueTask::Snli),
            ("imdb", GlueTask::Imdb),
            ("cola", GlueTask::Cola),
            ("mrpc", GlueTask::Mrpc),
            ("stsb", GlueTask::Stsb),
            ("qqp", GlueTask::Qqp),
            ("qnli", GlueTask::Qnli),
            ("rte", GlueTask::Rte),
            ("wnli", GlueTask::Wnli),
        ];
        assert_eq!(names.len(), GlueTask::value_variants().len());
        for (name, expected) in names {
            let parsed = benchmark(&["finetune", "glue", "--task", name]);
            let Benchmark::Glue { task, common } = parsed else {
                panic!("parsed as {parsed:?}");
            };
            assert_eq!(task, expected);
            assert_eq!(common.run.ranks, 1);
        }
    }

    #[test]
    fn glue_requires_a_known_task() {
        let missing = testing::rejection(&["finetune", "glue"]);
        assert!(missing.contains("--task"), "{missing}");
        let unknown = testing::rejection(&["finetune", "glue", "--task", "sst5"]);
        for valid in ["sst2", "mnli", "rt-polarity", "snli", "wnli"] {
            assert!(unknown.contains(valid), "{valid} not listed:\n{unknown}");
        }
    }

    #[test]
    fn requires_a_benchmark() {
        testing::rejection(&["finetune"]);
        testing::rejection(&["finetune", "ner"]);
    }
}
