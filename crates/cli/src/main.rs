//! `terse`: the per-rank binary that `cargo xtask` builds and launches (one
//! process per rank, through `mpirun` for several).
//!
//! `pretrain` and `train mlp` work; `finetune`, `eval` and `predict` are not
//! there yet and say so, exiting non-zero.

mod finetune;
mod launch;
mod pretrain;
mod train;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// One rank of a terse run.
#[derive(Parser, Debug)]
#[command(name = "terse", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Pre-train BERT (masked LM + next sentence) with the configured optimizer.
    Pretrain(pretrain::Args),
    /// Fine-tune a checkpoint on SQuAD or a GLUE task.
    Finetune(finetune::Args),
    /// Train an image classifier and report its test accuracy after every epoch.
    Train(train::Args),
    /// Evaluate a checkpoint.
    Eval,
    /// Write predictions of a checkpoint.
    Predict,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Train(args) => train::run(args),
        Command::Pretrain(args) => pretrain::run(args),
        Command::Finetune(args) => finetune::run(args),
        other => {
            let name = format!("{other:?}").to_lowercase();
            eprintln!(
                "terse: `{name}` is not implemented yet \
                 (tracked in issue 8: the distributed trainer and user commands)"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("terse: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
