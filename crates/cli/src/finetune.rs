//! `terse finetune glue|squad`: fine-tune a pretrained BERT (MiniLM by
//! default, or a pre-training run's `export/`) and report the task's metric
//! on its held-out split.

use anyhow::Result;
use clap::Subcommand;

use crate::launch::RunOptions;

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
        Benchmark::Glue(options) => options.flags.run(&options.config, "glue"),
        Benchmark::Squad(options) => options.flags.run(&options.config, "squad"),
    }
}
