//! `terse eval`, `terse predict` and `terse export`: the task of a run
//! config, scored, answered or exported with the weights of a checkpoint
//! (or of a run directory's newest one), checked against the checkpoint's
//! checksums first.

use std::path::PathBuf;

use anyhow::Result;
use terse_comm::SingleRank;
use terse_train::{
    RunConfig, Task, TaskAction, TrainError, evaluate_checkpoint, export_checkpoint,
    predict_checkpoint, with_task,
};

/// Arguments of `terse eval` and `terse predict`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run config the checkpoint was trained with (its run directory
    /// holds a copy: config.toml)
    #[arg(long, value_name = "PATH")]
    config: PathBuf,

    /// A checkpoint directory (checkpoints/step-N) or a run directory (its
    /// newest checkpoint)
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,

    /// Where `predict` writes (SQuAD: predictions.json; GLUE: a TSV of
    /// index, prediction, label; default predictions.out), or the directory
    /// `export` writes (required)
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,

    /// `export` only: the weights' type in model.safetensors, fp32 (the
    /// checkpoint's master weights as they are) or bf16 (each rounded to
    /// the nearest bf16, and config.json's torch_dtype "bfloat16")
    #[arg(long, value_name = "DTYPE", value_parser = ["fp32", "bf16"])]
    dtype: Option<String>,
}

/// What to do with the loaded checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Print the task's metrics.
    Eval,
    /// Write predictions.
    Predict,
    /// Write the HuggingFace-layout export.
    Export,
}

/// `action` with the checkpoint of `args`, as a [`TaskAction`].
struct Inspect<'a> {
    args: &'a Args,
    action: Action,
}

impl TaskAction for Inspect<'_> {
    type Output = ();

    fn trains(&self) -> bool {
        false
    }

    fn act<T: Task>(self, task: T) -> Result<(), TrainError> {
        let args = self.args;
        match self.action {
            Action::Eval => {
                let (meta, metrics) = evaluate_checkpoint(&task, &args.checkpoint)?;
                println!("terse: checkpoint at step {} ({})", meta.step, meta.stage);
                for (name, value) in metrics {
                    println!("{name}\t{value:.4}");
                }
            }
            Action::Predict => {
                let out = args.out.clone().unwrap_or_else(|| "predictions.out".into());
                let n = predict_checkpoint(&task, &args.checkpoint, &out)?;
                println!("terse: {n} predictions written to {}", out.display());
            }
            Action::Export => {
                let out = args.out.as_ref().expect("checked in run");
                export_checkpoint(&task, &args.checkpoint, out)?;
                if args.dtype.as_deref() == Some("bf16") {
                    terse_models::bert::export_in_bf16(out)?;
                }
                println!("terse: export written to {}", out.display());
            }
        }
        Ok(())
    }
}

pub fn run(args: &Args, action: Action) -> Result<()> {
    if action == Action::Export && args.out.is_none() {
        anyhow::bail!("export needs --out DIR (the directory to write the model into)");
    }
    if action != Action::Export && args.dtype.is_some() {
        anyhow::bail!("--dtype is for `export` only");
    }
    if action == Action::Eval && args.out.is_some() {
        // eval prints its metrics; a path it accepted and never wrote
        // would leave the user looking for a file.
        anyhow::bail!("--out is for `predict` and `export`: `eval` prints its metrics");
    }
    let config = RunConfig::load(&args.config)?;
    // SQuAD writes its predictions while it evaluates: `eval` and `export`
    // keep them out of the way, in a directory of their own (two evals at
    // once wrote one fixed temporary file) removed when they end.
    let scratch = tempfile::Builder::new()
        .prefix("terse-eval-")
        .tempdir()
        .map_err(|e| anyhow::anyhow!("creating a temporary directory: {e}"))?;
    let predictions = match action {
        Action::Predict => args.out.clone().unwrap_or_else(|| "predictions.out".into()),
        Action::Eval | Action::Export => scratch.path().join("predictions.json"),
    };
    let inspect = Inspect { args, action };
    with_task(&config, &SingleRank::new(), &predictions, inspect)?;
    Ok(())
}
