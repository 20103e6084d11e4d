//! `cargo xtask finetune`: fine-tune a pre-trained BERT on SQuAD or GLUE.
//!
//! Fine-tuning is how the papers show that a model pre-trained with a
//! compressed optimizer is as good as one pre-trained with Adam or LAMB. It
//! builds and launches `terse finetune`, which picks
//! `configs/finetune-<task>.toml` (or takes `--config`), knows the tasks,
//! fetches and checks the data and the pretrained MiniLM, trains, and
//! prints the task's metric (SQuAD: EM/F1 from predictions.json in the run
//! directory). This command keeps no list of tasks: it passes the name on.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

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
        /// The task: a stand-in (rt-polarity, imdb, snli) or a GLUE task
        /// (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli; these need
        /// their TSVs and --config); runs configs/finetune-<TASK>.toml
        /// unless --config names another, which must be this task's
        #[arg(long, value_name = "NAME")]
        task: String,

        #[command(flatten)]
        common: Common,
    },
}

/// Options every fine-tuning benchmark takes.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Common {
    /// A HuggingFace-layout directory to start from (config.json and
    /// model.safetensors: a pre-training run's export/, or HuggingFace's
    /// weights); defaults to the config's init
    #[arg(long, value_name = "DIR")]
    pub from: Option<PathBuf>,

    #[command(flatten)]
    pub run: RunArgs,
}

/// The `terse` command line of `args`.
fn terse_command(args: &Args) -> Vec<String> {
    let (benchmark, common) = match &args.benchmark {
        Benchmark::Squad(common) => ("squad", common),
        Benchmark::Glue { common, .. } => ("glue", common),
    };
    let mut terse = vec!["finetune".to_string(), benchmark.to_string()];
    if let Benchmark::Glue { task, .. } = &args.benchmark {
        terse.extend(["--task".into(), task.clone()]);
    }
    terse.extend(common.run.terse_args());
    if let Some(from) = &common.from {
        terse.extend(["--from".into(), from.display().to_string()]);
    }
    terse
}

/// Runs `finetune`.
pub fn run(args: &Args) -> Result<()> {
    let common = match &args.benchmark {
        Benchmark::Squad(common) | Benchmark::Glue { common, .. } => common,
    };
    common.run.launch(&terse_command(args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    fn benchmark(argv: &[&str]) -> Benchmark {
        testing::parsed_as!(Finetune, argv).benchmark
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
        assert_eq!(common.run.terse.optimizer, Some("adam".to_string()));
        assert_eq!(common.run.ranks, 2);
        assert_eq!(common.run.terse.config, None);
    }

    #[test]
    fn glue_passes_the_task_to_terse_as_typed() {
        for name in ["sst2", "SST-2", "rt-polarity", "wnli", "sst5"] {
            let parsed = Args {
                benchmark: benchmark(&["finetune", "glue", "--task", name, "--ranks", "2"]),
            };
            assert_eq!(terse_command(&parsed), ["finetune", "glue", "--task", name]);
        }
        let missing = testing::rejection(&["finetune", "glue"]);
        assert!(missing.contains("--task"), "{missing}");
    }

    #[test]
    fn requires_a_benchmark() {
        testing::rejection(&["finetune"]);
        testing::rejection(&["finetune", "ner"]);
    }
}
