//! `cargo xtask eval`, `predict` and `export`: score a saved run, write its
//! predictions, or export its model, with the `terse` binary (one rank).

use std::path::PathBuf;

use anyhow::Result;

use crate::forward::forwarded;
use crate::terse_binary;

/// Arguments of `cargo xtask eval` / `predict` / `export`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// A run directory (its newest checkpoint) or a checkpoint directory
    #[arg(value_name = "CHECKPOINT")]
    pub checkpoint: PathBuf,

    /// The run's config; default: the config.toml the run wrote
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub terse: OutputFlags,
}

forwarded! {
    /// Where the output goes, passed to `terse` as is.
    pub struct OutputFlags {
        /// Where `predict` writes (SQuAD: predictions.json, GLUE: a TSV), or `export` (required there)
        #[arg(long = "out", value_name = "PATH")] out: Option<String>,
        /// `export` only: fp32 (the master weights as saved) or bf16 (rounded to the nearest bf16)
        #[arg(long = "dtype", value_name = "DTYPE")] dtype: Option<String>,
    }
}

/// The run directory a checkpoint path belongs to.
fn run_dir(checkpoint: &std::path::Path) -> PathBuf {
    if checkpoint.join("trainer.json").exists() {
        // runs/<name>/checkpoints/step-N
        checkpoint
            .parent()
            .and_then(|p| p.parent())
            .map_or_else(|| checkpoint.to_path_buf(), std::path::Path::to_path_buf)
    } else {
        checkpoint.to_path_buf()
    }
}

/// Runs `terse eval|predict|export`.
pub fn run(command: &str, args: &Args) -> Result<()> {
    let config = args
        .config
        .clone()
        .unwrap_or_else(|| run_dir(&args.checkpoint).join("config.toml"));
    let mut terse = vec![
        command.to_string(),
        "--config".into(),
        config.display().to_string(),
        "--checkpoint".into(),
        args.checkpoint.display().to_string(),
    ];
    args.terse.forward(&mut terse);
    terse_binary::launch(1, &terse).map(drop)
}
