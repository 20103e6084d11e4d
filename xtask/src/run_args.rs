//! The launch options shared by every training command.
//!
//! `pretrain`, `finetune` and `train` all pick an optimizer, a number of ranks
//! and a config the same way; keeping those flags in one place keeps their
//! names, defaults and validation identical across commands.

use std::path::PathBuf;

use clap::{ValueEnum, value_parser};

/// An optimizer, named as in ALGORITHMS.md (CLI spelling in kebab case; the
/// config spelling with underscores is accepted too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Optimizer {
    /// Adam / AdamW with an fp32 gradient allreduce (the 1-bit Adam baseline)
    Adam,
    /// LAMB with an fp32 gradient allreduce (the 1-bit LAMB and SLAMB baseline)
    Lamb,
    /// Momentum SGD with an fp32 gradient allreduce
    Sgd,
    /// 1-bit Adam (Tang et al.): compressed momentum after the warm-up stage
    #[value(alias = "onebit_adam")]
    OnebitAdam,
    /// 1-bit LAMB (Li et al.): compressed momentum, frozen-variance scaling
    #[value(alias = "onebit_lamb")]
    OnebitLamb,
    /// SLAMB (Xu et al.): sparse masked momentum with periodic model averaging
    Slamb,
}

/// How a training run is launched: optimizer, ranks, config.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct RunArgs {
    /// Optimizer to train with; overrides the one the config names
    #[arg(long, value_enum, value_name = "NAME")]
    pub optimizer: Option<Optimizer>,

    /// Number of ranks (worker processes); more than 1 launches through mpirun
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = value_parser!(u32).range(1..)
    )]
    pub ranks: u32,

    /// TOML experiment config (see configs/); the flags above override its fields
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Directory for metrics.jsonl, checkpoints/ and export/ (default
    /// runs/<config>-<optimizer>)
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,

    /// Continue from the newest checkpoint in the run directory
    /// (bit-identically, in any optimizer stage)
    #[arg(long)]
    pub resume: bool,
}

impl Optimizer {
    /// The name configs and the `terse` binary use.
    pub fn config_name(self) -> &'static str {
        match self {
            Optimizer::Adam => "adam",
            Optimizer::Lamb => "lamb",
            Optimizer::Sgd => "sgd",
            Optimizer::OnebitAdam => "onebit_adam",
            Optimizer::OnebitLamb => "onebit_lamb",
            Optimizer::Slamb => "slamb",
        }
    }
}

impl RunArgs {
    /// `terse` flags for these options, with `config` as the run config
    /// (`--ranks` is the launcher's business, not the binary's).
    pub fn terse_args(&self, config: &std::path::Path) -> Vec<String> {
        let mut args = vec!["--config".to_string(), config.display().to_string()];
        if let Some(optimizer) = self.optimizer {
            args.extend(["--optimizer".into(), optimizer.config_name().into()]);
        }
        if let Some(dir) = &self.run_dir {
            args.extend(["--run-dir".into(), dir.display().to_string()]);
        }
        if self.resume {
            args.push("--resume".into());
        }
        args
    }

    /// The config to run: `--config`, else `default` (relative to the
    /// workspace root, where xtask runs).
    pub fn config_or(&self, default: &str) -> anyhow::Result<PathBuf> {
        let path = self
            .config
            .clone()
            .unwrap_or_else(|| PathBuf::from(default));
        if !path.exists() {
            anyhow::bail!(
                "{}: no such config (configs/ lists the ones that exist)",
                path.display()
            );
        }
        Ok(path)
    }
}
