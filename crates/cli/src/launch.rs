//! The flags every training command shares (the config and its overrides,
//! the run directory, resume, ranks) and the one way they start a run:
//! resolve the config, check it is the command's kind of task, and hand it
//! to [`terse_train::train`], which picks the backend and the task.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use terse_train::{Init, Launch, Override, RunConfig, TaskConfig};

/// The flags of every training command besides its config.
#[derive(Debug, Clone, clap::Args)]
pub struct RunFlags {
    /// Override train.steps (a resume may extend a run this way)
    #[arg(long, value_name = "N")]
    pub steps: Option<u64>,

    /// Train on this device: cpu (the default), wgpu (burn's wgpu backend
    /// on the best Vulkan adapter: a GPU, else lavapipe), wgpu:N (the N-th
    /// discrete GPU), lavapipe (the CPU adapter), cuda or cuda:N (NVIDIA GPU
    /// N through burn's CUDA backend, N + the node-local rank (modulo the
    /// node's GPUs) in a process of an mpirun job; needs the driver, NVRTC
    /// and CUDA's headers; its f32 matmuls run as TF32 on sm_80 and newer,
    /// README "Devices");
    /// sets train.device, and a resume may change it
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<terse_train::DeviceChoice>,

    /// Compute the model in this precision: fp32 (the default), tf32
    /// (CUDA's TF32 matmuls), bf16 or fp16 (matmuls and activations in the
    /// half type, LayerNorm, softmax and losses in fp32, as PyTorch's
    /// autocast; parameters, gradients and optimizer states stay fp32; fp16
    /// with DeepSpeed's dynamic loss scaling, train.loss_scaling). A device
    /// without it refuses the run (cpu: fp32, bf16, fp16; wgpu and
    /// lavapipe: fp32, and fp16 where the adapter has shader-f16; cuda: all, its fp32 matmuls already TF32 unless
    /// train.matmul = "cublas" names cuBLAS's f32 products). Sets
    /// train.precision; a resume may change it
    #[arg(long, value_name = "PRECISION")]
    pub precision: Option<terse_train::Precision>,

    /// Train with this optimizer instead of the config's, keeping every
    /// hyper-parameter the two share (weight decay, betas, eps, bias
    /// correction, freeze step, …; the schedule is untouched) and this
    /// optimizer's defaults for the rest
    #[arg(long, value_name = "NAME", value_parser = optimizer_names())]
    pub optimizer: Option<String>,

    /// With --optimizer or --deepspeed: run a 1-bit optimizer even when its
    /// freeze lies at or after the last step (it then never compresses and
    /// trains as its uncompressed baseline); without it such a run is
    /// refused
    #[arg(long)]
    pub allow_no_compression: bool,

    /// Set any config field, e.g. `--set train.seed=3` or
    /// `--set 'schedule={ kind = "constant", lr = 1e-3 }'` (TOML values; repeatable,
    /// applied before the flags above, except that with --optimizer a
    /// `--set optimizer.FIELD=…` sets a field of the new optimizer)
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = Override::parse)]
    pub overrides: Vec<Override>,

    /// A DeepSpeed ds_config.json read on top of the config: batch sizes,
    /// gradient_clipping, the optimizer (Adam, AdamW, Lamb, OneBitAdam,
    /// OneBitLamb, ZeroOneAdam) and its params, WarmupLR / WarmupDecayLR
    /// (linear), and its `fp16` / `bf16` blocks as train.precision (fp16 with
    /// its loss scaling). Keys that change nothing here are listed in one
    /// note. Keys terse cannot follow are refused by name: ZeRO stage 1-3,
    /// Apex AMP, fp16_master_weights_and_grads, log warmup. `--set` and the flags above still win
    #[arg(long, value_name = "DS_CONFIG")]
    pub deepspeed: Option<PathBuf>,

    /// Fine-tuning: start from this HuggingFace-layout directory (e.g. a
    /// pre-training run's export/) instead of the config's init
    #[arg(long, value_name = "DIR")]
    pub from: Option<PathBuf>,

    /// Directory for metrics.jsonl, config.toml, checkpoints/ and export/
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,

    /// Continue from the newest checkpoint in the run directory, or from
    /// the checkpoint directory given (e.g. `runs/x/checkpoints/step-00000200`)
    #[arg(long, value_name = "CHECKPOINT", num_args = 0..=1)]
    pub resume: Option<Option<PathBuf>>,

    /// Start over in a run directory that holds an earlier run, deleting its
    /// metrics, checkpoints and export (without this or --resume, such a
    /// directory is refused)
    #[arg(long, conflicts_with = "resume")]
    pub overwrite: bool,

    /// The communicator: auto (nccl for several mpirun processes training
    /// on cuda, mpi in any other process mpirun started, local threads for
    /// --local-ranks N > 1, else one rank), local, mpi (one rank per
    /// process), nccl (NCCL between the GPUs of an MPI job, each process on
    /// GPU N + its node-local rank, modulo the node's GPUs, for --device
    /// cuda:N; needs libcuda and NCCL as libnccl.so on LD_LIBRARY_PATH, e.g.
    /// a link to pip's nvidia-nccl-cu12 libnccl.so.2)
    #[arg(long, value_name = "BACKEND", default_value = "auto")]
    pub comm: terse_train::CommChoice,

    /// Ranks as threads of this process, the `local` backend (under
    /// mpirun, where each process is a rank, N > 1 is refused; `cargo xtask
    /// --ranks N` means N mpirun processes)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub local_ranks: usize,

    /// The old name of --local-ranks, refused with a pointer to both
    /// meanings (it meant threads here and processes in `cargo xtask`)
    #[arg(long = "ranks", value_name = "N", hide = true)]
    pub old_ranks: Option<usize>,

    /// No progress bar (logs and CI)
    #[arg(long)]
    pub no_progress: bool,

    /// Print the resolved config (the file with every override applied and
    /// every default filled in, as config.toml would hold it) and exit
    /// without loading data or training
    #[arg(long)]
    pub print_config: bool,
}

/// The registry's optimizer names as `--optimizer` values (a `-` may
/// stand for a `_`).
fn optimizer_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(terse_optim::OPTIMIZER_NAMES.lines().map(|name| {
        let kebab: &'static str = Box::leak(name.replace('_', "-").into_boxed_str());
        clap::builder::PossibleValue::new(name).alias(kebab)
    }))
}

impl RunFlags {
    /// Loads `path`, applies these flags, checks that it is a `kind` task
    /// (the command's), and trains it (or prints it, with
    /// `--print-config`).
    pub fn run(&self, path: &Path, kind: &str) -> Result<()> {
        self.run_checked(path, kind, |_| Ok(()))
    }

    /// [`RunFlags::run`], with `check` refusing a config the command's other
    /// arguments contradict.
    pub fn run_checked(
        &self,
        path: &Path,
        kind: &str,
        check: impl FnOnce(&RunConfig) -> Result<()>,
    ) -> Result<()> {
        if let Some(n) = self.old_ranks {
            bail!(
                "`terse --ranks` is now `--local-ranks {n}` ({n} ranks as threads of this \
                 process); `cargo xtask … --ranks {n}` starts {n} mpirun processes"
            );
        }
        let config = self.resolve(path)?;
        if config.task.kind() != kind {
            bail!(
                "{}: this command trains [task] kind = \"{kind}\", not \"{}\"",
                path.display(),
                config.task.kind()
            );
        }
        check(&config).with_context(|| path.display().to_string())?;
        if self.print_config {
            print!("{}", config.to_toml());
            return Ok(());
        }
        let launch = Launch {
            run_dir: self.run_dir(path, &config),
            resume: self.resume.is_some(),
            resume_from: self.resume.clone().flatten(),
            overwrite: self.overwrite,
            ranks: self.local_ranks,
            comm: self.comm,
            progress: !self.no_progress,
        };
        if let Some(summary) = terse_train::train(&config, &launch)? {
            println!("terse: {}", summary.render());
            println!("terse: run directory {}", launch.run_dir.display());
        }
        Ok(())
    }

    /// The config file at `path` with the command line's overrides applied.
    fn resolve(&self, path: &Path) -> Result<RunConfig> {
        // With --optimizer, `--set optimizer.FIELD=…` sets a field of the
        // new optimizer: applied after the swap, not to the config's own.
        let (after_swap, mut before_swap): (Vec<Override>, Vec<Override>) = self
            .overrides
            .iter()
            .cloned()
            .partition(|o| self.optimizer.is_some() && o.key().starts_with("optimizer."));
        if let Some(ds) = &self.deepspeed {
            // Under the command line's own overrides, which still win.
            // The job's ranks: DeepSpeed resolves its batch sizes with them.
            let world = terse_comm::MpiComm::mpirun_processes().unwrap_or(self.local_ranks);
            let mut read = deepspeed_overrides(ds, world)?;
            read.append(&mut before_swap);
            before_swap = read;
        }
        // As overrides, so that the config is checked with them in place
        // (a precision against the device that runs it).
        if let Some(device) = self.device {
            before_swap.push(Override::new("train.device", device.to_string()));
        }
        if let Some(precision) = self.precision {
            before_swap.push(Override::new("train.precision", precision.to_string()));
        }
        // An override too, so that the config is checked with the steps
        // the run takes (against its schedule's end).
        if let Some(steps) = self.steps {
            if steps == 0 {
                bail!("--steps must be at least 1");
            }
            let steps = i64::try_from(steps).context("--steps")?;
            before_swap.push(Override::new("train.steps", steps));
        }
        let mut config = RunConfig::load_with(path, &before_swap).map_err(|e| {
            let e = anyhow::Error::from(e);
            match &self.deepspeed {
                // A setting the ds_config made may be what the check refused.
                Some(ds) => e.context(format!(
                    "{} with what --deepspeed {} sets",
                    path.display(),
                    ds.display()
                )),
                None => e,
            }
        })?;
        if let Some(name) = &self.optimizer {
            let name = name.replace('-', "_");
            let swapped = config
                .optimizer
                .with_name(&name)
                .with_context(|| format!("--optimizer {name}"))?;
            if !swapped.dropped.is_empty() {
                tracing::info!(
                    "--optimizer {name}: the config's {} field(s) {} do not apply to {name} \
                     and are left out",
                    config.optimizer.name(),
                    swapped.dropped.join(", ")
                );
            }
            config.optimizer = swapped.config;
            if !after_swap.is_empty() {
                let mut document = toml::Table::new();
                document.insert(
                    "optimizer".into(),
                    toml::Value::try_from(&config.optimizer)
                        .context("the optimizer config serialises")?,
                );
                for o in &after_swap {
                    o.apply(&mut document)
                        .map_err(|e| anyhow::anyhow!("--set {}: {e}", o.key()))?;
                }
                config.optimizer = document
                    .remove("optimizer")
                    .expect("inserted above")
                    .try_into()
                    .map_err(|e: toml::de::Error| {
                        anyhow::anyhow!("{}: --optimizer {name} with --set: {e}", path.display())
                    })?;
            }
        }
        // A 1-bit optimizer named on the command line, or by a ds_config
        // (whose freeze_step defaults to DeepSpeed's 100000).
        let named = match (&self.optimizer, &self.deepspeed) {
            (Some(name), _) => Some(format!("--optimizer {name}")),
            (None, Some(ds)) => Some(format!("--deepspeed {}", ds.display())),
            (None, None) => None,
        };
        if let Some(named) = named {
            let plan = config.optimizer.plan(config.train.steps, &config.schedule);
            if plan.freeze_unreachable && !self.allow_no_compression {
                bail!(
                    "{named}: {plan}. This run would train as the uncompressed baseline under \
                     another name. Set a freeze inside the run (e.g. `--set \
                     optimizer.freeze_step={}`), or pass --allow-no-compression to run it anyway",
                    (config.train.steps / 5).max(1)
                );
            }
        }
        if let Some(dir) = &self.from {
            match &mut config.task {
                TaskConfig::Glue { init, .. } | TaskConfig::Squad { init, .. } => {
                    *init = Init::Path(dir.clone());
                }
                _ => bail!("--from is for fine-tuning (glue, squad) runs"),
            }
        }
        config
            .validate()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok(config)
    }

    /// The run directory: `--run-dir`, else `runs/<config name>-<optimizer>`.
    fn run_dir(&self, path: &Path, config: &RunConfig) -> PathBuf {
        self.run_dir
            .clone()
            .unwrap_or_else(|| default_run_dir(path, config.optimizer.name()))
    }
}

/// `runs/<config>-<optimizer>`, or `runs/<config>` when the config's name
/// already ends with the optimizer's (`finetune-rt-polarity-onebit-adam`,
/// not `…-onebit-adam-onebit_adam`).
fn default_run_dir(config: &Path, optimizer: &str) -> PathBuf {
    let stem = config
        .file_stem()
        .map_or("run".into(), |s| s.to_string_lossy().into_owned());
    let kebab = optimizer.replace('_', "-");
    let name = if stem.ends_with(&format!("-{kebab}")) || stem.ends_with(&format!("-{optimizer}")) {
        stem
    } else {
        format!("{stem}-{optimizer}")
    };
    PathBuf::from("runs").join(name)
}

/// `--deepspeed FILE` as overrides, what it set and what it left out said
/// once on stderr.
fn deepspeed_overrides(path: &Path, world: usize) -> Result<Vec<Override>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--deepspeed {}", path.display()))?;
    let read = terse_train::deepspeed_config::translate(&path.display().to_string(), &text, world)
        .map_err(|e| anyhow::anyhow!("--deepspeed {e}"))?;
    // The values, not only the keys: what the JSON became in terse's terms.
    let set: Vec<String> = read.overrides.iter().map(Override::to_string).collect();
    eprintln!(
        "terse: --deepspeed {}: sets {}",
        path.display(),
        if set.is_empty() {
            "nothing".into()
        } else {
            set.join("; ")
        }
    );
    if !read.ignored.is_empty() {
        eprintln!(
            "terse: --deepspeed {}: left out (no effect in terse): {}",
            path.display(),
            read.ignored.join("; ")
        );
    }
    Ok(read.overrides)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(argv: &[&str]) -> RunFlags {
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            flags: RunFlags,
        }
        <Line as clap::Parser>::try_parse_from([&["terse"], argv].concat())
            .unwrap()
            .flags
    }

    fn shipped(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../configs")
            .join(name)
    }

    #[test]
    fn an_optimizer_whose_freeze_the_run_never_reaches_is_refused_unless_allowed() {
        // The shipped BERT-Tiny config trains 1-bit LAMB with its freeze
        // at step 12.
        let path = shipped("pretrain-bert-tiny.toml");
        let argv = ["--optimizer", "onebit-adam", "--set", "train.steps=20"];
        // From 1-bit LAMB the freeze (step 12) is kept: reachable.
        flags(&argv).resolve(&path).unwrap();
        let unreachable = [&argv[..], &["--set", "optimizer.freeze_step=20"]].concat();
        let error = format!("{:#}", flags(&unreachable).resolve(&path).unwrap_err());
        assert!(error.contains("never compresses"), "{error}");
        assert!(error.contains("--allow-no-compression"), "{error}");
        let allowed = [&unreachable[..], &["--allow-no-compression"]].concat();
        flags(&allowed).resolve(&path).unwrap();
    }

    #[test]
    fn optimizer_keeps_the_configs_hyper_parameters_and_takes_its_own_fields_from_set() {
        // The fine-tuning config trains Adam-family optimizers with weight
        // decay; swapping to 1-bit LAMB must keep it, and a freeze step set
        // on the command line lands on the new optimizer.
        let path = shipped("finetune-rt-polarity-onebit-adam.toml");
        let original = RunConfig::load(&path).unwrap();
        let config = flags(&[
            "--optimizer",
            "onebit-lamb",
            "--set",
            "optimizer.freeze_step=7",
            "--set",
            "train.seed=5",
        ])
        .resolve(&path)
        .unwrap();
        let (before, after) = (
            toml::to_string(&original.optimizer).unwrap(),
            toml::to_string(&config.optimizer).unwrap(),
        );
        assert!(after.contains("name = \"onebit_lamb\""), "{after}");
        assert!(after.contains("freeze_step = 7"), "{after}");
        assert_eq!(config.train.seed, 5);
        for line in before.lines() {
            let key = line.split(" = ").next().unwrap();
            if ["weight_decay", "beta_1", "beta_2", "eps", "bias_correction"].contains(&key) {
                assert!(after.contains(line), "{line} not kept:\n{after}");
            }
        }
    }

    #[test]
    fn the_default_run_directory_names_the_optimizer_once() {
        let dir = |config: &str, optimizer: &str| default_run_dir(Path::new(config), optimizer);
        assert_eq!(
            dir(
                "configs/finetune-rt-polarity-onebit-adam.toml",
                "onebit_adam"
            ),
            Path::new("runs/finetune-rt-polarity-onebit-adam")
        );
        assert_eq!(
            dir("configs/train-mlp-fashion-mnist-lamb.toml", "lamb"),
            Path::new("runs/train-mlp-fashion-mnist-lamb")
        );
        assert_eq!(
            dir("configs/pretrain-bert-tiny.toml", "onebit_lamb"),
            Path::new("runs/pretrain-bert-tiny-onebit_lamb")
        );
        // Only a whole last word counts: "…-adam" is not "…-onebit-adam".
        assert_eq!(
            dir("configs/x-adam.toml", "onebit_adam"),
            Path::new("runs/x-adam-onebit_adam")
        );
    }
}
