//! `terse finetune glue|squad`: fine-tune a pretrained BERT (MiniLM by
//! default, or a pre-training run's `export/`) and report the task's metric
//! on its held-out split, from `configs/finetune-<task>.toml` or `--config`.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::Subcommand;
use terse_train::{RunConfig, TaskConfig};

use crate::launch::RunFlags;

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
    Squad(SquadArgs),
}

/// Arguments of `terse finetune glue`.
#[derive(Debug, clap::Args)]
struct GlueArgs {
    /// The task: a stand-in (rt-polarity, imdb, snli), which picks the
    /// shipped config configs/finetune-<TASK>.toml, or a GLUE task (cola,
    /// sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli), whose data has no
    /// public download and which therefore needs --config naming your
    /// TSVs; must be the task of --config when both are given
    #[arg(long, value_name = "NAME")]
    task: Option<String>,

    /// TOML run config [default: configs/finetune-<TASK>.toml]
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,

    #[command(flatten)]
    flags: RunFlags,
}

/// Arguments of `terse finetune squad`.
#[derive(Debug, clap::Args)]
struct SquadArgs {
    /// TOML run config [default: configs/finetune-squad.toml]
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,

    #[command(flatten)]
    flags: RunFlags,
}

pub fn run(args: &Args) -> Result<()> {
    let dir = &crate::shipped::dir();
    match &args.benchmark {
        Benchmark::Glue(glue) => {
            let config = match (&glue.config, &glue.task) {
                (Some(config), _) => config.clone(),
                (None, Some(task)) => glue_config(dir, task)?,
                (None, None) => {
                    bail!(
                        "name a task (e.g. `terse finetune glue --task rt-polarity`) or pass --config"
                    )
                }
            };
            glue.flags.run_checked(&config, "glue", |resolved| {
                task_agrees(glue.task.as_deref(), resolved)
            })
        }
        Benchmark::Squad(squad) => {
            let config = squad
                .config
                .clone()
                .unwrap_or_else(|| dir.join("finetune-squad.toml"));
            squad.flags.run(&config, "squad")
        }
    }
}

/// The comparison key of a task name: `sst2`, `SST-2` and `sst-2` are one.
fn key(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_alphanumeric())
        .collect::<String>()
        .to_lowercase()
}

/// The shipped config of `task` in `dir`, or an error saying why there is
/// none: an unknown task lists the known ones; a GLUE task whose data terse
/// cannot fetch says how to run it from its TSVs.
fn glue_config(dir: &Path, task: &str) -> Result<PathBuf> {
    let stand_in = terse_train::tasks::STAND_IN_TASKS
        .iter()
        .find(|name| key(name) == key(task));
    let glue = terse_data::GlueTask::ALL
        .into_iter()
        .find(|t| key(t.dir_name()) == key(task));
    let name = match (stand_in, glue) {
        (Some(name), _) => name.to_string(),
        (None, Some(glue)) => key(glue.dir_name()),
        (None, None) => bail!(
            "no task `{task}`; known: {}, {}",
            terse_train::tasks::STAND_IN_TASKS.join(", "),
            terse_data::GlueTask::ALL
                .map(|t| key(t.dir_name()))
                .join(", ")
        ),
    };
    let path = dir.join(format!("finetune-{name}.toml"));
    if !path.exists() {
        bail!(
            "{}: no such config: GLUE's {name} data has no public download terse can fetch and \
             checksum (docs/DATA.md), so no config ships for it; copy \
             configs/paper-glue-sst2.toml, point glue_dir at the task's TSVs and pass it with \
             --config (rt-polarity, imdb and snli run as they are)",
            path.display()
        );
    }
    Ok(path)
}

/// Refuses a config whose task is not the one `--task` names (`sst2` and
/// `SST-2` are one name).
fn task_agrees(wanted: Option<&str>, config: &RunConfig) -> Result<()> {
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
    fn a_task_names_its_shipped_config_and_says_why_another_has_none() {
        let configs = crate::shipped::for_tests();
        let path = glue_config(&configs, "rt-polarity").unwrap();
        assert!(path.ends_with("finetune-rt-polarity.toml"), "{path:?}");
        let error = glue_config(&configs, "SST-2").unwrap_err().to_string();
        assert!(
            error.contains("finetune-sst2.toml: no such config"),
            "{error}"
        );
        assert!(error.contains("paper-glue-sst2.toml"), "{error}");
        let error = glue_config(&configs, "squad").unwrap_err().to_string();
        assert!(
            error.starts_with("no task `squad`; known: rt-polarity"),
            "{error}"
        );
        assert!(error.contains("wnli"), "{error}");
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
