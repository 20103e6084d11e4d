//! `terse`: the per-rank binary that `cargo xtask` builds and launches (one
//! process per rank, through `mpirun` for several).
//!
//! Every command takes a run config (see configs/); `--help` on each says
//! what it overrides.

mod finetune;
mod inspect;
mod launch;
mod pretrain;
mod sum_of_squares;
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
    /// Evaluate a checkpoint on its task's held-out data and print the metrics.
    Eval(inspect::Args),
    /// Write a checkpoint's predictions on its task's held-out data.
    Predict(inspect::Args),
    /// Minimise a sum of squares with one optimizer (the eps-fix toy problem).
    SumOfSquares(sum_of_squares::Args),
}

/// Exit status of a run whose loss stopped being a number, so a caller
/// (`cargo xtask reproduce`) can record the divergence as a result.
const DIVERGED: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    terse_train::logging::init();
    let result = match &cli.command {
        Command::Train(args) => train::run(args),
        Command::Pretrain(args) => pretrain::run(args),
        Command::Finetune(args) => finetune::run(args),
        Command::Eval(args) => inspect::run(args, inspect::Action::Eval),
        Command::Predict(args) => inspect::run(args, inspect::Action::Predict),
        Command::SumOfSquares(args) => sum_of_squares::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            let diverged = error.chain().any(|e| {
                matches!(
                    e.downcast_ref::<terse_train::TrainError>(),
                    Some(terse_train::TrainError::Diverged { .. })
                )
            });
            if diverged {
                ExitCode::from(DIVERGED)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
