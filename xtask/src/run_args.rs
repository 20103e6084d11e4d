//! The launch options shared by every training command.
//!
//! `pretrain`, `finetune` and `train` all pick an optimizer, a number of ranks
//! and a config the same way; keeping those flags in one place keeps their
//! names, defaults and validation identical across commands. Only `--ranks`
//! and `--hostfile` are xtask's own; the rest are terse's, declared once
//! each with a one-line help ([`forwarded!`]) and passed on as given, so
//! that terse's `--help` alone explains them (issue 51: the two command
//! lines had drifted).

use std::path::PathBuf;

use clap::value_parser;

use crate::forward::forwarded;

/// Every optimizer's config name, one per line: terse-optim's registry list
/// (xtask links no workspace crate; terse-optim's tests keep the file equal
/// to its `OptimizerConfig` variants).
const OPTIMIZER_NAMES: &str = include_str!("../../crates/optim/optimizer-names.txt");

/// Parses `--optimizer`: a registry name in the CLI's spelling
/// (`onebit-adam`) or the config's (`onebit_adam`); returns the config's.
fn optimizer_name(text: &str) -> Result<String, String> {
    let name = text.replace('-', "_");
    if OPTIMIZER_NAMES.lines().any(|known| known == name) {
        return Ok(name);
    }
    let known: Vec<String> = OPTIMIZER_NAMES
        .lines()
        .map(|known| known.replace('_', "-"))
        .collect();
    Err(format!(
        "no optimizer `{text}`; known: {}",
        known.join(", ")
    ))
}

/// How a training run is launched: on how many processes, where, and with
/// which of terse's flags.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct RunArgs {
    /// Number of ranks (worker processes); more than 1 launches through mpirun
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = value_parser!(u32).range(1..)
    )]
    pub ranks: u32,

    /// An OpenMPI hostfile (`node01 slots=8` per line): the ranks run on
    /// those nodes through mpirun (README: "Several machines")
    #[arg(long, value_name = "FILE")]
    pub hostfile: Option<PathBuf>,

    #[command(flatten)]
    pub terse: TerseFlags,
}

forwarded! {
    /// The flags `terse <command>` takes, passed on in this order; the
    /// config, the optimizer, the local ranks and the steps are checked here
    /// first (before a build and before mpirun), the rest are passed as
    /// they are. `terse <command> --help` explains each in full.
    #[command(next_help_heading = "Passed on to terse (`terse <COMMAND> --help` explains each)")]
    pub struct TerseFlags {
        /// TOML experiment config (see configs/); the other flags override its fields
        #[arg(long = "config", value_name = "PATH")] config: Option<PathBuf>,
        /// Optimizer replacing the config's (e.g. onebit-adam; crates/optim/optimizer-names.txt)
        #[arg(long = "optimizer", value_name = "NAME", value_parser = optimizer_name)] optimizer: Option<String>,
        /// Directory for metrics.jsonl, checkpoints/ and export/ [default: runs/<config>-<optimizer>]
        #[arg(long = "run-dir", value_name = "DIR")] run_dir: Option<String>,
        /// Continue from the run directory's newest checkpoint, or from the one given
        #[arg(long = "resume", value_name = "CHECKPOINT", num_args = 0..=1)] resume: Option<Option<String>>,
        /// Start over in a run directory that holds an earlier run, deleting it
        #[arg(long = "overwrite", conflicts_with = "resume")] overwrite: bool,
        /// Train on cpu (the default), wgpu, wgpu:N, lavapipe, cuda or cuda:N
        #[arg(long = "device", value_name = "DEVICE")] device: Option<String>,
        /// Compute in fp32 (the default), tf32 (CUDA), bf16 or fp16
        #[arg(long = "precision", value_name = "PRECISION")] precision: Option<String>,
        /// The communicator: auto (the default), local, mpi or nccl
        #[arg(long = "comm", value_name = "BACKEND")] comm: Option<String>,
        /// Ranks as threads of one process (the `local` communicator), with --ranks 1 (refused with more)
        #[arg(long = "local-ranks", value_name = "N", value_parser = value_parser!(u32).range(1..))] local_ranks: Option<u32>,
        /// Optimizer steps to run (a resume may extend a run) [default: the config's train.steps]
        #[arg(long = "steps", value_name = "N", value_parser = value_parser!(u64).range(1..))] steps: Option<u64>,
        /// No progress bar (logs and CI)
        #[arg(long = "no-progress")] no_progress: bool,
        /// A DeepSpeed ds_config.json read on top of the config
        #[arg(long = "deepspeed", value_name = "DS_CONFIG")] deepspeed: Option<String>,
        /// Set a config field (e.g. `--set train.steps=100`; repeatable)
        #[arg(long = "set", value_name = "KEY=VALUE")] overrides: Vec<String>,
        /// With --optimizer or --deepspeed, run a 1-bit optimizer whose freeze the run never reaches
        #[arg(long = "allow-no-compression")] allow_no_compression: bool,
        /// Print the resolved config and exit without loading data or training
        #[arg(long = "print-config")] print_config: bool,
    }
}

impl RunArgs {
    /// `terse` flags for these options, `--config` among them when given
    /// (`--ranks` is the launcher's business, not the binary's).
    pub fn terse_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        self.terse.forward(&mut args);
        args
    }

    /// Runs `terse <terse…>` on `--ranks` processes (on `--hostfile`'s
    /// nodes), or once when it only prints the config.
    pub fn launch(&self, terse: &[String]) -> anyhow::Result<()> {
        self.check_config()?;
        if self.terse.print_config {
            return crate::terse_binary::run_binary("terse", terse);
        }
        train(self.ranks as usize, self.hostfile.as_deref(), terse)
    }

    /// Refuses a `--config` that does not exist before any process starts
    /// (terse reads it; without `--config` terse picks its shipped one).
    fn check_config(&self) -> anyhow::Result<()> {
        if let Some(path) = &self.terse.config
            && !path.exists()
        {
            anyhow::bail!(
                "{}: no such config (configs/ lists the ones that exist)",
                path.display()
            );
        }
        Ok(())
    }
}

/// Runs a training command (on the hosts of `hostfile`, if given) and draws
/// its loss plot into the run directory.
fn train(ranks: usize, hostfile: Option<&std::path::Path>, args: &[String]) -> anyhow::Result<()> {
    if let Some(dir) = crate::terse_binary::launch_on(ranks, hostfile, args)? {
        let plot = crate::run_plot::loss_plot(&dir)?;
        println!("terse: loss plot {}", plot.display());
    }
    Ok(())
}
