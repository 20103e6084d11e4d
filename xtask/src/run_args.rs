//! The launch options shared by every training command.
//!
//! `pretrain`, `finetune` and `train` all pick an optimizer, a number of ranks
//! and a config the same way; keeping those flags in one place keeps their
//! names, defaults and validation identical across commands.

use std::path::PathBuf;

use clap::value_parser;

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

/// How a training run is launched: optimizer, ranks, config.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct RunArgs {
    /// Optimizer to train with, replacing the one the config names (e.g.
    /// onebit-adam; crates/optim/optimizer-names.txt lists them all)
    #[arg(long, value_name = "NAME", value_parser = optimizer_name)]
    pub optimizer: Option<String>,

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

    /// TOML experiment config (see configs/); the flags above override its fields
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Directory for metrics.jsonl, checkpoints/ and export/ (default
    /// runs/<config>-<optimizer>)
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,

    /// Continue from the newest checkpoint in the run directory, or from
    /// the checkpoint directory given (bit-identically, in any optimizer
    /// stage)
    #[arg(long, value_name = "CHECKPOINT", num_args = 0..=1)]
    pub resume: Option<Option<PathBuf>>,

    /// Start over in a run directory that holds an earlier run, deleting
    /// its metrics, checkpoints and export (without this or --resume, such
    /// a directory is refused)
    #[arg(long, conflicts_with = "resume")]
    pub overwrite: bool,

    /// Train on this device: cpu (the default), wgpu (the best Vulkan
    /// adapter: a GPU, else lavapipe), wgpu:N (the N-th discrete GPU),
    /// lavapipe, cuda or cuda:N (an NVIDIA GPU through burn's CUDA backend:
    /// the driver, NVRTC and CUDA's headers at run time; f32 matmuls run as
    /// TF32 on sm_80 and newer); passed to `terse` as is
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,

    /// Compute the model in fp32 (the default), tf32 (CUDA), bf16 or fp16
    /// (half-type matmuls and activations, fp32 master weights and
    /// optimizer states; fp16 with dynamic loss scaling); passed to `terse`
    /// as is
    #[arg(long, value_name = "PRECISION")]
    pub precision: Option<String>,

    /// A DeepSpeed ds_config.json read on top of the config (batch sizes,
    /// clipping, optimizer and params, warmup schedulers; what terse cannot
    /// follow is refused by name); passed to `terse` as is
    #[arg(long, value_name = "DS_CONFIG")]
    pub deepspeed: Option<PathBuf>,

    /// The communicator: auto (mpi with --ranks N > 1, local threads with
    /// --local-ranks N > 1, else one rank), local, mpi, nccl (NCCL between
    /// GPUs; needs a build with the terse-train/nccl feature); passed to
    /// `terse` as is
    #[arg(long, value_name = "BACKEND")]
    pub comm: Option<String>,

    /// Ranks as threads of one process (the `local` communicator), with
    /// --ranks 1: under mpirun each process is one rank and terse ignores
    /// it; passed to `terse` as is
    #[arg(long, value_name = "N", value_parser = value_parser!(u32).range(1..))]
    pub local_ranks: Option<u32>,

    /// Optimizer steps to run (a resume may extend a run this way);
    /// defaults to the config's train.steps
    #[arg(long, value_name = "N", value_parser = value_parser!(u64).range(1..))]
    pub steps: Option<u64>,

    /// No progress bar (logs and CI); passed to `terse` as is
    #[arg(long)]
    pub no_progress: bool,

    /// Set a config field, passed to `terse` as is (e.g. `--set
    /// train.steps=100`, `--set optimizer.freeze_step=20`; repeatable)
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,

    /// With --optimizer, run a 1-bit optimizer whose freeze the run never
    /// reaches (refused otherwise)
    #[arg(long)]
    pub allow_no_compression: bool,

    /// Print the resolved config (every flag and --set applied, every
    /// default filled in) and exit without loading data or training
    #[arg(long)]
    pub print_config: bool,
}

impl RunArgs {
    /// `terse` flags for these options, `--config` among them when given
    /// (`--ranks` is the launcher's business, not the binary's).
    pub fn terse_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(config) = &self.config {
            args.extend(["--config".to_string(), config.display().to_string()]);
        }
        if let Some(optimizer) = &self.optimizer {
            args.extend(["--optimizer".into(), optimizer.clone()]);
        }
        if let Some(dir) = &self.run_dir {
            args.extend(["--run-dir".into(), dir.display().to_string()]);
        }
        if let Some(from) = &self.resume {
            args.push("--resume".into());
            if let Some(checkpoint) = from {
                args.push(checkpoint.display().to_string());
            }
        }
        if self.overwrite {
            args.push("--overwrite".into());
        }
        if let Some(device) = &self.device {
            args.extend(["--device".into(), device.clone()]);
        }
        if let Some(precision) = &self.precision {
            args.extend(["--precision".into(), precision.clone()]);
        }
        if let Some(comm) = &self.comm {
            args.extend(["--comm".into(), comm.clone()]);
        }
        if let Some(n) = self.local_ranks {
            args.extend(["--local-ranks".into(), n.to_string()]);
        }
        if let Some(steps) = self.steps {
            args.extend(["--steps".into(), steps.to_string()]);
        }
        if self.no_progress {
            args.push("--no-progress".into());
        }
        if let Some(ds) = &self.deepspeed {
            args.extend(["--deepspeed".into(), ds.display().to_string()]);
        }
        for o in &self.overrides {
            args.extend(["--set".into(), o.clone()]);
        }
        if self.allow_no_compression {
            args.push("--allow-no-compression".into());
        }
        if self.print_config {
            args.push("--print-config".into());
        }
        args
    }

    /// Runs `terse <terse…>` on `--ranks` processes (on `--hostfile`'s
    /// nodes), or once when it only prints the config.
    pub fn launch(&self, terse: &[String]) -> anyhow::Result<()> {
        self.check_config()?;
        if self.print_config {
            return crate::terse_binary::run_binary("terse", terse);
        }
        train(self.ranks as usize, self.hostfile.as_deref(), terse)
    }

    /// Refuses a `--config` that does not exist before any process starts
    /// (terse reads it; without `--config` terse picks its shipped one).
    fn check_config(&self) -> anyhow::Result<()> {
        if let Some(path) = &self.config
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
