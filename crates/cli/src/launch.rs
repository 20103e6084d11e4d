//! How `terse` becomes one or more ranks, and the options every training
//! command shares: the config and its overrides, the run directory, resume.
//!
//! Started by `mpirun`, each process is one MPI rank; otherwise `--ranks N`
//! runs N ranks as threads of this process (the `local` backend: the same
//! algorithms, error feedback and masks, on one machine), and one rank runs
//! alone.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use terse_comm::{Communicator, LocalComm, MpiComm, SingleRank};
use terse_optim::OptimizerConfig;
use terse_train::{Init, Override, RunConfig, RunOutcome, Task, TaskConfig, TrainError, Trainer};

/// Options of every training command.
#[derive(Debug, Clone, clap::Args)]
pub struct RunOptions {
    /// TOML run config (see configs/)
    #[arg(long, value_name = "PATH")]
    pub config: PathBuf,

    /// Override train.steps (a resume may extend a run this way)
    #[arg(long, value_name = "N")]
    pub steps: Option<u64>,

    /// Replace the config's optimizer by this one with its default settings
    /// (adam, lamb, sgd, onebit_adam, onebit_adam_fp32, adam_onebit_naive,
    /// onebit_lamb, lamb_onebit_basic, slamb)
    #[arg(long, value_name = "NAME")]
    pub optimizer: Option<String>,

    /// Set any config field, e.g. `--set train.seed=3` or
    /// `--set 'optimizer={ name = "adam", lr = 1e-3 }'` (TOML values; repeatable,
    /// applied before the flags above)
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = Override::parse)]
    pub overrides: Vec<Override>,

    /// Fine-tuning: start from this HuggingFace-layout directory (e.g. a
    /// pre-training run's export/) instead of the config's init
    #[arg(long, value_name = "DIR")]
    pub from: Option<PathBuf>,

    /// Directory for metrics.jsonl, config.toml, checkpoints/ and export/
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,

    /// Continue from the newest checkpoint in the run directory
    #[arg(long)]
    pub resume: bool,

    /// Ranks as threads of this process (ignored under mpirun, where each
    /// process is a rank)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub ranks: usize,

    /// No progress bar (logs and CI)
    #[arg(long)]
    pub no_progress: bool,

    /// Print the resolved config (the file with every override applied and
    /// every default filled in, as config.toml would hold it) and exit
    /// without loading data or training
    #[arg(long)]
    pub print_config: bool,
}

impl RunOptions {
    /// The config file with the command line's overrides applied.
    pub fn resolve(&self) -> Result<RunConfig> {
        let mut config = RunConfig::load_with(&self.config, &self.overrides)?;
        if let Some(steps) = self.steps {
            if steps == 0 {
                bail!("--steps must be at least 1");
            }
            config.train.steps = steps;
        }
        if let Some(name) = &self.optimizer {
            let name = name.replace('-', "_");
            config.optimizer = toml::from_str::<OptimizerConfig>(&format!("name = \"{name}\""))
                .with_context(|| format!("--optimizer {name}"))?;
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
            .map_err(|e| anyhow::anyhow!("{}: {e}", self.config.display()))?;
        Ok(config)
    }

    /// Prints `config` when `--print-config` asked for it; true then, and
    /// the command stops there.
    pub fn printed(&self, config: &RunConfig) -> bool {
        if self.print_config {
            print!("{}", config.to_toml());
        }
        self.print_config
    }

    /// The run directory: `--run-dir`, else `runs/<config name>-<optimizer>`.
    pub fn run_dir(&self, config: &RunConfig) -> PathBuf {
        self.run_dir.clone().unwrap_or_else(|| {
            let stem = self
                .config
                .file_stem()
                .map_or("run".into(), |s| s.to_string_lossy().into_owned());
            PathBuf::from("runs").join(format!("{stem}-{}", config.optimizer.name()))
        })
    }
}

/// Runs `make_task` + the trainer on every rank of the chosen backend and
/// prints rank 0's summary.
pub fn train<T, F>(options: &RunOptions, config: &RunConfig, make_task: F) -> Result<()>
where
    T: Task,
    F: Fn(&dyn Communicator) -> Result<T, TrainError> + Sync,
{
    terse_train::signals::install();
    let run_dir = options.run_dir(config);
    let trainer = Trainer {
        config,
        run_dir: &run_dir,
        resume: options.resume,
        progress: !options.no_progress,
    };
    let one = |comm: &dyn Communicator| -> Result<Option<RunOutcome<T::Model>>, TrainError> {
        let task = make_task(comm)?;
        let outcome = trainer.run(&task, comm)?;
        Ok((comm.rank() == 0).then_some(outcome))
    };
    let outcome = if MpiComm::launched_by_mpirun() {
        let comm = MpiComm::init()?;
        announce(&comm, config, &run_dir);
        let result = one(&comm);
        if let Err(e) = &result
            && !matches!(e, TrainError::Interrupted { .. })
        {
            tracing::error!("rank {}: {e}", comm.rank());
            comm.abort(&e.to_string());
        }
        result?
    } else if options.ranks > 1 {
        // No rank waits for another longer than a whole evaluation.
        let results = LocalComm::run(options.ranks, Duration::from_secs(6 * 3600), |comm| {
            announce(comm, config, &run_dir);
            one(comm)
        });
        lead_result(results)?
    } else {
        let comm = SingleRank::new();
        announce(&comm, config, &run_dir);
        one(&comm)?
    };
    if let Some(outcome) = outcome {
        println!("terse: {}", outcome.summary.render());
        println!("terse: run directory {}", run_dir.display());
    }
    Ok(())
}

/// What the lead rank returned from a [`LocalComm::run`] whose ranks return
/// `Some` on the lead only, or the first failure: a rank's error (named by
/// its rank) or its panic.
pub fn lead_result<T, E: Into<anyhow::Error>>(
    results: Vec<std::thread::Result<Result<Option<T>, E>>>,
) -> Result<Option<T>> {
    let mut lead = None;
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Ok(Ok(Some(value))) => lead = Some(value),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => return Err(e.into()).with_context(|| format!("rank {rank}")),
            Err(_) => bail!("rank {rank} panicked"),
        }
    }
    Ok(lead)
}

/// Tags this thread's log lines with the rank, sends them to the run
/// directory's terse.log, and has rank 0 say what runs.
fn announce(comm: &dyn Communicator, config: &RunConfig, run_dir: &std::path::Path) {
    terse_train::logging::set_rank(comm.rank());
    if let Err(e) = terse_train::logging::attach_run_dir(run_dir) {
        tracing::warn!(
            "cannot write {}: {e}",
            run_dir.join(terse_train::logging::LOG_FILE).display()
        );
    }
    if comm.rank() == 0 {
        tracing::info!(
            "{} rank(s) ({}), optimizer {}, {} steps of global batch {} (micro-batch {}), run directory {}",
            comm.world_size(),
            comm.backend(),
            config.optimizer.name(),
            config.train.steps,
            config.train.global_batch,
            config.train.micro_batch,
            run_dir.display()
        );
    }
}
