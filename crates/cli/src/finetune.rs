//! `terse finetune glue|squad`: fine-tune a pretrained BERT (MiniLM by
//! default, or a pre-training run's `export/`) and report the task's metric
//! on its held-out split.

use anyhow::{Result, bail};
use clap::Subcommand;
use terse_train::TaskConfig;
use terse_train::tasks::{SentenceTask, SquadTask};

use crate::launch::{RunOptions, train};

/// Arguments of `terse finetune`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    benchmark: Benchmark,
}

#[derive(Debug, Subcommand)]
enum Benchmark {
    /// A GLUE task or a stand-in (rt-polarity, imdb, snli): the config's [task]
    Glue(RunOptions),
    /// SQuAD v1.1: trains on the training windows, writes predictions.json
    /// into the run directory and prints exact match and F1 on the dev
    /// questions
    Squad(RunOptions),
}

pub fn run(args: &Args) -> Result<()> {
    match &args.benchmark {
        Benchmark::Glue(options) => {
            let config = options.resolve()?;
            if options.printed(&config) {
                return Ok(());
            }
            if !matches!(config.task, TaskConfig::Glue { .. }) {
                bail!(
                    "{}: `terse finetune glue` needs [task] kind = \"glue\"",
                    options.config.display()
                );
            }
            let task = SentenceTask::prepare(&config)?;
            let (train_n, dev_n) = task.sizes();
            tracing::info!("{train_n} training and {dev_n} held-out examples");
            train(options, &config, |_| Ok(&task))
        }
        Benchmark::Squad(options) => {
            let config = options.resolve()?;
            if options.printed(&config) {
                return Ok(());
            }
            if !matches!(config.task, TaskConfig::Squad { .. }) {
                bail!(
                    "{}: `terse finetune squad` needs [task] kind = \"squad\"",
                    options.config.display()
                );
            }
            let predictions = options.run_dir(&config).join("predictions.json");
            let task = SquadTask::prepare(&config, predictions)?;
            let (train_n, questions, dev_n) = task.sizes();
            tracing::info!(
                "{train_n} training windows; {questions} dev questions in {dev_n} windows"
            );
            train(options, &config, |_| Ok(&task))
        }
    }
}
