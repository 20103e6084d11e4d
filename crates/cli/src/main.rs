//! `terse`: the per-rank binary that `cargo xtask` builds and launches (one
//! process per rank, through `mpirun` for several).
//!
//! Every command takes a run config (see configs/); `--help` on each says
//! what it overrides.

mod finetune;
mod inspect;
mod launch;
mod pretrain;
mod resume_line;
mod shipped;
mod shipped_names;
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
    /// Train an image classifier and report its test accuracy every
    /// train.eval_every steps (an epoch in the shipped configs) and at the end.
    Train(train::Args),
    /// Evaluate a checkpoint on its task's held-out data and print the metrics.
    Eval(inspect::Args),
    /// Write a checkpoint's predictions on its task's held-out data (GLUE-style and SQuAD runs).
    Predict(inspect::Args),
    /// Write a checkpoint's model in HuggingFace's layout (with its
    /// tokenizer and labels), as a run's export/ holds it.
    Export(inspect::Args),
}

/// Exit status of a run whose loss stopped being a number, so a caller
/// (`cargo xtask reproduce`) can record the divergence as a result.
const DIVERGED: u8 = 3;

/// SIGTERM's number on Linux: the exit status of a rank that learned of
/// another rank's signal is 128 + this.
const SIGTERM: i32 = 15;

/// Whether `error` is a run stopped by SIGINT or SIGTERM.
fn interrupted(error: &anyhow::Error) -> bool {
    error.chain().any(|e| {
        e.downcast_ref::<terse_train::TrainError>()
            .is_some_and(terse_train::TrainError::interrupted)
    })
}

/// `error` and its causes in one line, as `{:#}` writes them, less the
/// causes its own message already quotes (terse's errors write their I/O
/// cause into the message, so `{:#}` alone says "No space left on device"
/// twice).
fn describe(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
    }
    text
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    terse_train::allocator::tune_for_training();
    terse_train::logging::init();
    let result = match &cli.command {
        Command::Train(args) => train::run(args),
        Command::Pretrain(args) => pretrain::run(args),
        Command::Finetune(args) => finetune::run(args),
        Command::Eval(args) => inspect::run(args, inspect::Action::Eval),
        Command::Predict(args) => inspect::run(args, inspect::Action::Predict),
        Command::Export(args) => inspect::run(args, inspect::Action::Export),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if interrupted(&error) => {
            // Not a failure: the run stopped where it was asked to, with a
            // checkpoint. The shell's convention for a signal's end.
            // Every MPI rank stopped at the same step; rank 0 says so for
            // all of them (the others' lines go to terse.log).
            let message = format!(
                "{}; resume with: {}",
                describe(&error),
                resume_line::for_this_process()
            );
            if terse_train::logging::rank().unwrap_or(0) == 0 {
                tracing::warn!("{message}");
                let signal = terse_train::signals::received().unwrap_or(SIGTERM);
                ExitCode::from(u8::try_from(128 + signal).unwrap_or(1))
            } else {
                tracing::debug!("{message}");
                // The other MPI ranks end with success, rank 0 alone with
                // the signal's status (which mpirun reports for the job):
                // mpirun kills the job's other processes as soon as one
                // exits non-zero, and a rank past MPI_Finalize first cut
                // rank 0 short before its line (xtask's signals test, CI
                // of stop 96: rank 1 exited 143, rank 0's line never came).
                ExitCode::SUCCESS
            }
        }
        Err(error) => {
            tracing::error!("{}", describe(&error));
            let diverged = error.chain().any(|e| {
                e.downcast_ref::<terse_train::TrainError>()
                    .is_some_and(terse_train::TrainError::diverged)
            });
            if diverged {
                ExitCode::from(DIVERGED)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_the_message_already_quotes_is_said_once() {
        let full = std::io::Error::from_raw_os_error(28);
        let error = anyhow::Error::new(terse_train::TrainError::Io {
            path: "runs/x/checkpoints".into(),
            source: full,
        })
        .context("config.toml");
        assert_eq!(
            describe(&error),
            "config.toml: runs/x/checkpoints: No space left on device (os error 28)"
        );
    }
}
