//! `terse pretrain`: masked-LM + next-sentence pre-training of BERT on the
//! corpus the config names.

use anyhow::Result;

use crate::launch::RunOptions;

/// Arguments of `terse pretrain`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: RunOptions,
}

pub fn run(args: &Args) -> Result<()> {
    args.run.flags.run(&args.run.config, "pretrain")
}
