//! How a training run becomes one or more ranks and runs its task.
//!
//! Started by `mpirun`, each process is one MPI rank; otherwise `ranks`
//! threads of this process form a `local` world (the same algorithms, error
//! feedback and masks, on one machine), and one rank runs alone. The task is
//! prepared once per process ([`with_task`]) and shared by its ranks.

use std::path::{Path, PathBuf};

use terse_comm::{Communicator, LocalComm, MpiComm, SingleRank};

use crate::collective_deadline::CollectiveDeadline;
use crate::comm_choice::{Backend, CommChoice, Placement};
use crate::dispatch::{TaskAction, with_task};
use crate::run_dir::{self, Existing, RunDirClaim};
use crate::run_summary::RunSummary;
use crate::stuck_ranks::{self, StuckRanks};
use crate::trainer::RunOutcome;
use crate::{
    DeviceChoice, RunConfig, Task, TrainError, Trainer, logging, out_of_memory, rank_phase, signals,
};

/// Where and how a run goes, beyond its config.
#[derive(Debug, Clone)]
pub struct Launch {
    /// metrics.jsonl, config.toml, terse.log, checkpoints/ and export/.
    pub run_dir: PathBuf,
    /// Continue from the run directory's newest checkpoint.
    pub resume: bool,
    /// Delete an earlier run's outputs in the run directory first (without
    /// it or `resume`, an earlier run there is refused).
    pub overwrite: bool,
    /// With `resume`: continue from this checkpoint directory instead.
    pub resume_from: Option<PathBuf>,
    /// Ranks as threads of this process when not started by `mpirun`.
    pub ranks: usize,
    /// The communicator (`--comm`; `auto` picks from how the process was
    /// started and `ranks`).
    pub comm: CommChoice,
    /// Show a progress bar.
    pub progress: bool,
}

/// Trains the task of `config` on every rank of the backend this process
/// was started for; returns the lead rank's summary (`None` on the other
/// MPI ranks).
pub fn train(config: &RunConfig, launch: &Launch) -> Result<Option<RunSummary>, TrainError> {
    signals::install();
    let trainer = Trainer {
        config,
        run_dir: &launch.run_dir,
        resume: launch.resume,
        resume_from: launch.resume_from.as_deref(),
        progress: launch.progress,
    };
    let predictions = launch.run_dir.join("predictions.json");
    let placement = Placement {
        local_ranks: launch.ranks,
        mpirun_processes: MpiComm::mpirun_processes(),
        on_cuda: matches!(config.train.device, DeviceChoice::Cuda(_)),
    };
    let backend = launch.comm.backend(placement)?;
    // Before the data is prepared (pre-training examples, SQuAD's
    // windows): a batch that does not split among the ranks would
    // otherwise be refused only when the trainer starts.
    let world = match backend {
        Backend::Threads(ranks) => ranks,
        Backend::Mpi | Backend::Nccl => placement.mpirun_processes.unwrap_or(1),
        Backend::Single => 1,
    };
    config.train.accumulation(world)?;
    match backend {
        Backend::Mpi => on_process_world(&MpiComm::init()?, config, launch, &trainer, &predictions),
        Backend::Nccl => on_nccl(config, launch, &trainer, &predictions),
        Backend::Threads(ranks) => {
            let _claim = claim(launch)?;
            let on = TrainOn::Threads(ranks, &trainer);
            with_task(config, &SingleRank::new(), &predictions, on)
        }
        Backend::Single => {
            let _claim = claim(launch)?;
            let comm = SingleRank::new();
            announce(&comm, config, &launch.run_dir);
            with_task(
                config,
                &comm,
                &predictions,
                TrainOn::Process(&comm, &trainer),
            )
        }
    }
}

/// A rank of a world of processes (MPI, or NCCL over MPI).
fn on_process_world(
    comm: &dyn Communicator,
    config: &RunConfig,
    launch: &Launch,
    trainer: &Trainer<'_>,
    predictions: &Path,
) -> Result<Option<RunSummary>, TrainError> {
    // Every wait for another rank, from the first (the claim below, the
    // data's preparation) on, under the run's deadline.
    comm.set_deadline(CollectiveDeadline::new(config.train.collective_timeout_s).initial());
    // Rank 0 claims the directory before any rank writes to it; if it
    // cannot, every rank ends with its reason.
    let _claim = if comm.rank() == 0 {
        match claim(launch) {
            Ok(claim) => Some(claim),
            Err(e) => {
                tracing::error!("rank 0: {e}");
                comm.abort(&e.to_string());
                return Err(e);
            }
        }
    } else {
        None
    };
    comm.barrier()?;
    announce(comm, config, &launch.run_dir);
    let result = with_task(config, comm, predictions, TrainOn::Process(comm, trainer));
    // A signal and a divergence end every rank at the same step (both
    // travel in the step's shared allreduce), so no rank is left waiting:
    // those exit on their own, with their own status (3 for a divergence,
    // which MPI_Abort would turn into 1).
    if let Err(e) = &result
        && !e.interrupted()
        && !e.diverged()
    {
        let rank = comm.rank();
        // Where this rank waited says where the missing ranks were: they
        // had not reached that point.
        let place = match (e.gave_up_waiting(), rank_phase::of(rank)) {
            (Some(_), Some(phase)) => format!(" (rank {rank} was {phase} when it gave up)"),
            _ => String::new(),
        };
        tracing::error!("rank {rank}: {e}{place}");
        comm.abort(&format!("{e}{place}"));
    }
    result
}

/// NCCL between the GPUs of an MPI job: each process on the GPU its model
/// trains on ([`terse_comm::gpu_of_process`]), or with the model on
/// another device on the GPU of its node-local rank.
fn on_nccl(
    config: &RunConfig,
    launch: &Launch,
    trainer: &Trainer<'_>,
    predictions: &Path,
) -> Result<Option<RunSummary>, TrainError> {
    // Wrapped around the node's GPUs either way: more processes than GPUs
    // then meet one_gpu_each's advice, not CUDA's "invalid device".
    let gpu = terse_comm::gpu_of_process(match config.train.device {
        DeviceChoice::Cuda(index) => index,
        _ => 0,
    });
    // `--comm auto` picked NCCL; a machine without it is told the way
    // that needs no NCCL, not only what NCCL lacks.
    if launch.comm == CommChoice::Auto
        && let Some(missing) = terse_comm::nccl_missing_libraries()
    {
        return Err(TrainError::InvalidRun {
            field: "--comm",
            reason: format!(
                "--comm auto picks NCCL for CUDA runs of several processes, but {missing}; \
                 `--comm mpi` runs this job over MPI instead (each exchange through the host)"
            ),
        });
    }
    let comm = terse_comm::NcclComm::start(gpu)?;
    on_process_world(&comm, config, launch, trainer, predictions)
}

/// Claims the run directory for this run (see [`run_dir`]).
fn claim(launch: &Launch) -> Result<RunDirClaim, TrainError> {
    let existing = if launch.resume {
        Existing::Resume
    } else if launch.overwrite {
        Existing::Overwrite
    } else {
        Existing::Refuse
    };
    run_dir::claim(&launch.run_dir, existing)
}

/// Training as a [`TaskAction`]: on this process's one rank, or on a world
/// of threads sharing the task.
enum TrainOn<'a> {
    Process(&'a dyn Communicator, &'a Trainer<'a>),
    Threads(usize, &'a Trainer<'a>),
}

impl TaskAction for TrainOn<'_> {
    type Output = Option<RunSummary>;

    fn act<T: Task>(self, task: T) -> Result<Self::Output, TrainError> {
        match self {
            Self::Process(comm, trainer) => {
                // On a worker of rayon's pool, as local ranks run on theirs:
                // called from outside the pool, every parallel loop of the
                // step was handed to the pool and waited for (a futex wake
                // and sleep each, hundreds per step). MPI is initialised
                // SERIALIZED, so any one thread may call it.
                let outcome = rayon::scope(|_| run_reporting_memory(trainer, &task, comm))?;
                Ok((comm.rank() == 0).then_some(outcome.summary))
            }
            Self::Threads(ranks, trainer) => {
                let threads = threads_per_rank(ranks);
                let deadline =
                    CollectiveDeadline::new(trainer.config.train.collective_timeout_s).initial();
                let watch = StuckRanks::watch(ranks, stuck_ranks::GRACE);
                let results = LocalComm::run(ranks, deadline, |comm| {
                    let result = rank_thread(comm, trainer, &task, threads);
                    watch.returned(comm.rank(), &result);
                    result
                });
                drop(watch);
                lead_result(results)
            }
        }
    }
}

/// One local rank: its log lines, its own pool of `threads`, its run.
fn rank_thread<T: Task>(
    comm: &LocalComm,
    trainer: &Trainer<'_>,
    task: &T,
    threads: usize,
) -> Result<Option<RunSummary>, TrainError> {
    announce(comm, trainer.config, trainer.run_dir);
    // The rank's own pool: its kernels and matmuls stay on its share of the
    // cores instead of queueing in rayon's one global pool behind the other
    // ranks' work.
    let rank = comm.rank();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("rank-{rank}-{i}"))
        .build()
        .map_err(|e| TrainError::Io {
            path: trainer.run_dir.to_path_buf(),
            source: std::io::Error::other(format!(
                "cannot start rank {rank}'s {threads} threads: {e}"
            )),
        })?;
    let outcome = pool.install(|| run_reporting_memory(trainer, task, comm))?;
    Ok((rank == 0).then_some(outcome.summary))
}

/// `trainer`'s run on `comm`'s rank, a device that ran out of memory
/// reported as [`TrainError::DeviceOutOfMemory`] instead of a panic.
fn run_reporting_memory<T: Task>(
    trainer: &Trainer<'_>,
    task: &T,
    comm: &dyn Communicator,
) -> Result<RunOutcome<T::Model>, TrainError> {
    let train = &trainer.config.train;
    out_of_memory::catch(
        comm.rank(),
        &train.device.to_string(),
        train.micro_batch,
        || train.device.memory_capacity(),
        || trainer.run(task, comm),
    )
}

/// Threads of each of `ranks` local ranks: the cores (or
/// `RAYON_NUM_THREADS`) divided among them, at least one each, as MPI ranks
/// get through `RAYON_NUM_THREADS`.
fn threads_per_rank(ranks: usize) -> usize {
    let cores = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    (cores / ranks.max(1)).max(1)
}

/// What the lead rank returned from a [`LocalComm::run`] whose ranks return
/// `Some` on the lead only, or a failure: the first rank's own error (one
/// that is not merely "another rank failed", which every rank waiting on the
/// failed one reports), named by its rank, else the first panic, else the
/// first error of any kind.
fn lead_result<T>(
    results: Vec<std::thread::Result<Result<Option<T>, TrainError>>>,
) -> Result<Option<T>, TrainError> {
    let mut lead = None;
    let mut errors = Vec::new();
    let mut panicked = None;
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Ok(Ok(Some(value))) => lead = Some(value),
            Ok(Ok(None)) => {}
            Ok(Err(error)) => errors.push((rank, error)),
            Err(_) => {
                panicked.get_or_insert(rank);
            }
        }
    }
    let own = errors
        .iter()
        .position(|(_, error)| !error.caused_by_another_rank());
    match (own, panicked, errors.is_empty()) {
        (Some(at), _, _) => {
            let (rank, error) = errors.swap_remove(at);
            Err(TrainError::Rank {
                rank,
                error: Box::new(error),
            })
        }
        (None, Some(rank), _) => Err(TrainError::Panicked { rank }),
        (None, None, false) => {
            let (rank, error) = errors.swap_remove(0);
            Err(TrainError::Rank {
                rank,
                error: Box::new(error),
            })
        }
        (None, None, true) => Ok(lead),
    }
}

/// Tags this thread's log lines with the rank, sends them to the run
/// directory's terse.log, and has rank 0 say what runs.
fn announce(comm: &dyn Communicator, config: &RunConfig, run_dir: &Path) {
    logging::set_rank(comm.rank());
    if let Err(e) = logging::attach_run_dir(run_dir) {
        tracing::warn!(
            "cannot write {}: {e}",
            run_dir.join(logging::LOG_FILE).display()
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

#[cfg(test)]
mod tests {
    use super::*;
    use terse_comm::CommError;

    fn peer_failed(rank: usize) -> TrainError {
        TrainError::Comm(CommError::PeerFailed {
            rank,
            reason: "left the world (its communicator was dropped)".into(),
        })
    }

    #[test]
    fn the_failing_rank_is_reported_not_the_ranks_that_waited_for_it() {
        let own = TrainError::InvalidRun {
            field: "task.dataset",
            reason: "shard 3 is damaged".into(),
        };
        let results: Vec<std::thread::Result<Result<Option<u32>, TrainError>>> = vec![
            Ok(Err(peer_failed(1))),
            Ok(Err(own)),
            Ok(Err(peer_failed(1))),
        ];
        let error = lead_result(results).unwrap_err().to_string();
        assert_eq!(
            error,
            "rank 1: invalid run setting `task.dataset`: shard 3 is damaged"
        );
        // Only waiting ranks' reports: the first of them, with its rank.
        let results: Vec<std::thread::Result<Result<Option<u32>, TrainError>>> =
            vec![Ok(Ok(Some(7))), Ok(Err(peer_failed(0)))];
        let error = lead_result(results).unwrap_err().to_string();
        assert!(error.starts_with("rank 1: rank 0 failed"), "{error}");
        // A panic beats a waiting rank's report.
        let results: Vec<std::thread::Result<Result<Option<u32>, TrainError>>> =
            vec![Ok(Err(peer_failed(1))), Err(Box::new("boom"))];
        assert_eq!(
            lead_result(results).unwrap_err().to_string(),
            "rank 1 panicked"
        );
        let results: Vec<std::thread::Result<Result<Option<u32>, TrainError>>> =
            vec![Ok(Ok(Some(7))), Ok(Ok(None))];
        assert_eq!(lead_result(results).unwrap(), Some(7));
    }
}
