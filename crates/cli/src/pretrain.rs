//! `terse pretrain`: masked-LM + next-sentence pre-training of BERT on the
//! corpus the config names.

use anyhow::{Result, bail};
use terse_train::TaskConfig;
use terse_train::tasks::PretrainTask;

use crate::launch::{RunOptions, train};

/// Arguments of `terse pretrain`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: RunOptions,
}

pub fn run(args: &Args) -> Result<()> {
    let config = args.run.resolve()?;
    if args.run.printed(&config) {
        return Ok(());
    }
    if !matches!(config.task, TaskConfig::Pretrain { .. }) {
        bail!(
            "{}: `terse pretrain` needs [task] kind = \"pretrain\"",
            args.run.config.display()
        );
    }
    train(&args.run, &config, |comm| {
        PretrainTask::prepare(&config, comm)
    })
}
