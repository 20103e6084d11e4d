//! `terse finetune glue|squad`: fine-tune a pretrained BERT (MiniLM by
//! default, or a pre-training run's `export/`) and report the task's metric
//! on its held-out split.

use anyhow::{Result, bail};
use clap::Subcommand;
use terse_train::{RunConfig, TaskConfig};

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
    Glue(GlueArgs),
    /// SQuAD v1.1: trains on the training windows, writes predictions.json
    /// into the run directory and prints exact match and F1 on the dev
    /// questions
    Squad(RunOptions),
}

/// Arguments of `terse finetune glue`.
#[derive(Debug, clap::Args)]
struct GlueArgs {
    /// The task (e.g. rt-polarity, snli, sst2): must be the task of
    /// --config (a check, so that a command line and its config cannot
    /// silently disagree)
    #[arg(long, value_name = "NAME")]
    task: Option<String>,

    #[command(flatten)]
    run: RunOptions,
}

pub fn run(args: &Args) -> Result<()> {
    match &args.benchmark {
        Benchmark::Glue(glue) => glue
            .run
            .flags
            .run_checked(&glue.run.config, "glue", |resolved| {
                task_agrees(glue.task.as_deref(), resolved)
            }),
        Benchmark::Squad(options) => options.flags.run(&options.config, "squad"),
    }
}

/// Refuses a config whose task is not the one `--task` names (`sst2` and
/// `SST-2` are one name).
fn task_agrees(wanted: Option<&str>, config: &RunConfig) -> Result<()> {
    let key = |name: &str| -> String {
        name.chars()
            .filter(|c| c.is_alphanumeric())
            .collect::<String>()
            .to_lowercase()
    };
    if let (Some(wanted), TaskConfig::Glue { task, .. }) = (wanted, &config.task)
        && key(wanted) != key(task)
    {
        bail!("task.task is {task}, but --task names {wanted}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(task: &str) -> RunConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../configs/finetune-rt-polarity.toml");
        let mut config = RunConfig::load(&path).unwrap();
        if let TaskConfig::Glue { task: t, .. } = &mut config.task {
            *t = task.to_string();
        }
        config
    }

    #[test]
    fn a_task_that_contradicts_the_config_is_refused_naming_both() {
        assert!(task_agrees(None, &config("snli")).is_ok());
        assert!(task_agrees(Some("sst2"), &config("SST-2")).is_ok());
        let error = task_agrees(Some("snli"), &config("rt-polarity"))
            .unwrap_err()
            .to_string();
        assert_eq!(error, "task.task is rt-polarity, but --task names snli");
    }
}
