//! The distributed training loop, the same on every backend: one rank per
//! process (MPI), per thread (`local`) or alone.
//!
//! Each optimizer step, a rank takes its share of the global batch (a
//! function of `(seed, step, rank, world)`, so a resumed run reads what the
//! uninterrupted one read), runs forward and backward per micro-batch,
//! accumulates the flat gradient, and hands it to the optimizer, which owns
//! the step's communication. Dropout masks come from the backend's RNG,
//! re-seeded from `(seed, step, rank, micro-batch)` before every forward: a
//! resume continues bit-identically without saving RNG state. The backend's
//! RNG is one per process, so threads of the `local` backend take turns for
//! the forward pass (the backward pass, the bulk of the work, overlaps).

use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use burn::module::Module;
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::{Device, Tensor};
use terse_comm::{Communicator, ReduceOp};
use terse_optim::{FlatModel, Optimizer};

use crate::checkpoint::{self, model_file, optimizer_file};
use crate::collective_deadline::CollectiveDeadline;
use crate::grad_clip::{clip_gradient, global_norm};
use crate::logging;
use crate::metrics::{DivergedRecord, EvalRecord, MetricsLog, RunSummary, StepRecord};
use crate::micro_batches::{Lanes, StepPlace, local_gradient};
use crate::progress::{ProgressLines, step_bar};
use crate::rank_phase::{self, Phase};
use crate::step_order::StepOrder;
use crate::{RunConfig, TrainError, signals};

/// What the loop needs from a task: its examples, its model, and a loss.
pub trait Task: Sync {
    /// The model with its head.
    type Model: Module + ModuleSnapshot;

    /// Training examples; the loop addresses them as `0..examples()`.
    fn examples(&self) -> usize;

    /// A fresh model (pretrained weights loaded where the task says so);
    /// called with the backend's RNG seeded from the run's seed, so every
    /// rank builds the same one.
    fn init(&self, device: &Device) -> Result<Self::Model, TrainError>;

    /// The mean loss over `examples` (indices into `0..examples()`), in
    /// pass `epoch` over the data (augmentation may depend on it).
    fn loss(
        &self,
        model: &Self::Model,
        examples: &[usize],
        epoch: u64,
        device: &Device,
    ) -> Result<Tensor<1>, TrainError>;

    /// The task's metrics on its held-out data (run by rank 0).
    fn evaluate(
        &self,
        model: &Self::Model,
        device: &Device,
    ) -> Result<Vec<(String, f64)>, TrainError> {
        let _ = (model, device);
        Ok(Vec::new())
    }

    /// Writes the predictions on the held-out data to `path` (rank 0) and
    /// returns how many; tasks without a prediction format refuse.
    fn predict(
        &self,
        model: &Self::Model,
        device: &Device,
        path: &Path,
    ) -> Result<usize, TrainError> {
        let _ = (model, device);
        Err(TrainError::InvalidRun {
            field: "task.kind",
            reason: format!(
                "this task writes no predictions (asked for {})",
                path.display()
            ),
        })
    }

    /// Writes the trained model for other tools (HuggingFace layout for
    /// BERT) into `dir` (rank 0, at the end of the run).
    fn export(&self, model: &Self::Model, dir: &Path) -> Result<(), TrainError> {
        let _ = (model, dir);
        Ok(())
    }
}

/// A task shared by the threads of the `local` backend.
impl<T: Task> Task for &T {
    type Model = T::Model;

    fn examples(&self) -> usize {
        (**self).examples()
    }

    fn init(&self, device: &Device) -> Result<Self::Model, TrainError> {
        (**self).init(device)
    }

    fn loss(
        &self,
        model: &Self::Model,
        examples: &[usize],
        epoch: u64,
        device: &Device,
    ) -> Result<Tensor<1>, TrainError> {
        (**self).loss(model, examples, epoch, device)
    }

    fn evaluate(
        &self,
        model: &Self::Model,
        device: &Device,
    ) -> Result<Vec<(String, f64)>, TrainError> {
        (**self).evaluate(model, device)
    }

    fn predict(
        &self,
        model: &Self::Model,
        device: &Device,
        path: &Path,
    ) -> Result<usize, TrainError> {
        (**self).predict(model, device, path)
    }

    fn export(&self, model: &Self::Model, dir: &Path) -> Result<(), TrainError> {
        (**self).export(model, dir)
    }
}

/// Serialises seeding + parameter initialisation across the threads of one
/// process: burn draws initial weights from its one device generator.
/// Forward passes need no lock: dropout masks are counter-based
/// ([`DropoutStream`]), so local ranks run forward and backward concurrently.
static INIT: Mutex<()> = Mutex::new(());

/// One run of the loop.
pub struct Trainer<'a> {
    /// The resolved config.
    pub config: &'a RunConfig,
    /// Where metrics, checkpoints and the export go.
    pub run_dir: &'a Path,
    /// Continue from the newest checkpoint in `run_dir` (a fresh start when
    /// there is none).
    pub resume: bool,
    /// With `resume`: this checkpoint directory instead of the newest.
    pub resume_from: Option<&'a Path>,
    /// Show a progress bar (rank 0).
    pub progress: bool,
}

/// What a finished run hands back.
pub struct RunOutcome<M> {
    /// The trained model of this rank.
    pub model: M,
    /// Totals of this session's steps and the final evaluation.
    pub summary: RunSummary,
}

impl Trainer<'_> {
    /// Runs the loop on `comm`'s rank to `config.train.steps`.
    pub fn run<T: Task>(
        &self,
        task: &T,
        comm: &dyn Communicator,
    ) -> Result<RunOutcome<T::Model>, TrainError> {
        let cfg = self.config;
        let (rank, world) = (comm.rank(), comm.world_size());
        cfg.train.accumulation(world)?;
        let mut order = StepOrder::new(
            task.examples(),
            cfg.train.seed,
            rank,
            world,
            cfg.train.global_batch / world,
        )?;
        let lead = rank == 0;
        rank_phase::enter(rank, Phase::SetUp);
        logging::set_rank(rank);
        logging::attach_run_dir(self.run_dir).map_err(|source| TrainError::Io {
            path: self.run_dir.join(logging::LOG_FILE),
            source,
        })?;
        tracing::debug!(
            "rank {rank} of {world} starts, run directory {}",
            self.run_dir.display()
        );
        if lead {
            std::fs::create_dir_all(self.run_dir).map_err(|source| TrainError::Io {
                path: self.run_dir.to_path_buf(),
                source,
            })?;
            let path = self.run_dir.join("config.toml");
            std::fs::write(&path, cfg.to_toml())
                .map_err(|source| TrainError::Io { path, source })?;
        }

        let device = cfg.train.device.open()?.autodiff();
        let (mut model, mut flat) = {
            let _turn = INIT.lock().unwrap_or_else(|p| p.into_inner());
            // Initialised on the CPU whatever the device, so that every
            // device starts from the same weights.
            let host = Device::flex().autodiff();
            host.seed(cfg.train.seed);
            let model = task.init(&host)?;
            // burn initialises parameters lazily, on first use: draw them
            // all now, from this seed, while this thread holds the RNG.
            // The optimizer's view of the parameters, gathered once (again
            // only when a checkpoint replaced them): after each step it is
            // written into the model, so the model is never gathered again.
            let flat = FlatModel::gather(&model)?;
            (model.fork(&device), flat)
        };
        let mut optimizer = Optimizer::new(
            cfg.optimizer.clone(),
            cfg.schedule.clone(),
            flat.layout().clone(),
            comm,
        )?;
        if !cfg.train.device.is_cpu() {
            // Gathered again from the device copy of the same weights: the
            // flat buffers and the optimizer state live there.
            flat = FlatModel::gather_on_device(&model)?;
            if lead {
                tracing::info!(
                    "{} steps on {}: flat parameters, gradient and optimizer state on the \
                     device",
                    cfg.optimizer.name(),
                    cfg.train.device
                );
            }
        }
        if self.resume {
            rank_phase::enter(rank, Phase::Resume);
            model = self.restore(model, &mut optimizer, comm)?;
            flat.regather(&model)?;
            rank_phase::enter(rank, Phase::SetUp);
        } else {
            checkpoint::clear_own(self.run_dir, rank)?;
        }

        let plan = cfg.optimizer.plan(cfg.train.steps, &cfg.schedule);
        if lead && world == 1 {
            // One rank has nothing to average: no collective, no compression.
            tracing::info!(
                "{}: {} steps on one rank, nothing communicated",
                cfg.optimizer.name(),
                cfg.train.steps
            );
        } else if lead {
            tracing::info!("{}: {plan}", cfg.optimizer.name());
            if plan.freeze_unreachable {
                tracing::warn!(
                    "{}'s freeze is never reached in this {}-step run: it trains as its \
                     uncompressed baseline and sends fp32 gradients every step (lower \
                     optimizer.freeze_step or raise train.steps to see compression)",
                    cfg.optimizer.name(),
                    cfg.train.steps
                );
            }
        }
        let mut deadline = CollectiveDeadline::new(cfg.train.collective_timeout_s);
        comm.set_deadline(deadline.initial());
        let start_step = optimizer.step_count();
        let mut log = MetricsLog::open(self.run_dir, lead, start_step)?;
        let bar = step_bar(cfg.train.steps, self.progress && lead);
        bar.set_position(start_step);
        bar.set_prefix(cfg.optimizer.name());
        let lines = ProgressLines::new(cfg.train.steps, start_step, self.progress && lead);
        let mut summary = RunSummary::default();

        if lead && start_step == 0 && cfg.train.eval_every > 0 {
            // The starting point, for comparison (pretrained weights and an
            // untrained head, or random weights).
            rank_phase::enter(rank, Phase::EvaluateBefore);
            let eval = bar.suspend(|| task.evaluate(&model.valid(), &device.clone().inner()))?;
            bar.suspend(|| tracing::info!("before training: {}", render_eval(&eval)));
            summary.eval_before = eval.clone();
            log.line(&EvalRecord { step: 0, eval })?;
        }
        // Micro-batches run side by side where the rank has the threads
        // (micro_batches.rs).
        let per_step = (cfg.train.global_batch / world).div_ceil(cfg.train.micro_batch);
        let lanes = Lanes::for_run(
            per_step,
            cfg.train.device.is_cpu() && flat.params().is_some(),
        )?;
        // Ranks reach this point one after another (local ranks set up in
        // turn, ~60 ms apart for BERT-Tiny and up to 0.8 s): starting step 1
        // together puts every rank's one-time costs (heap growth, pages
        // touched for the first time) in step 1, not in step 2, the first
        // the ranks then ran side by side.
        if world > 1 {
            comm.barrier()?;
        }
        // Ranks whose parameters are the same bits after every step share
        // one copy of them where they are threads of one process (on the
        // CPU: flex tensors are plain shared memory).
        let share_params = world > 1 && cfg.train.device.is_cpu() && optimizer.params_replicated();
        let run_start = Instant::now();
        for t in start_step + 1..=cfg.train.steps {
            rank_phase::enter(rank, Phase::Step(t));
            let step_start = Instant::now();
            let (epoch, share) = order.share(t);
            let at = StepPlace {
                seed: cfg.train.seed,
                t,
                epoch,
                rank,
            };
            let micro_batch = cfg.train.micro_batch;
            let local = local_gradient(
                task,
                &mut model,
                share,
                micro_batch,
                &at,
                &device,
                &mut flat,
                lanes.as_ref(),
            )?;
            let (forward_ms, backward_ms) = (local.forward_ms, local.backward_ms);

            // Taken before the step: the optimizer works in the gradient.
            let squares = flat.grad_sum_of_squares() as f32;
            let clipped_norm = match cfg.train.max_grad_norm {
                Some(max_norm) => Some(clip_gradient(
                    |factor| flat.scale_grad(factor),
                    squares,
                    max_norm,
                    comm,
                )?),
                None => None,
            };
            let clock = Instant::now();
            let report = flat.step(&mut optimizer, comm)?;
            model = if share_params {
                flat.write_into_replicated(model, comm)?
            } else {
                flat.write_into(model)?
            };
            let step_ms = ms(clock);

            // The loss every rank saw, whether any rank was signalled and
            // the squared gradient norms, in one small allreduce outside the
            // optimizer's accounting.
            let mut shared = [
                local.loss as f32,
                f32::from(u8::from(signals::requested())),
                squares,
            ];
            if world > 1 {
                comm.allreduce_f32(&mut shared, ReduceOp::Mean)?;
            }
            let loss = f64::from(shared[0]);
            let grad_norm = clipped_norm.unwrap_or_else(|| global_norm(shared[2]));
            tracing::debug!(
                "step {t}: local loss {:.6}, {} stage, {} bytes sent, forward {forward_ms:.1} ms, \
                 backward {backward_ms:.1} ms, optimizer step {step_ms:.1} ms",
                local.loss,
                report.stage,
                report.traffic.sent()
            );
            if !loss.is_finite() {
                tracing::error!("step {t}: the loss is {loss}: the run diverged");
                log.line(&DivergedRecord {
                    step: t,
                    diverged: true,
                })?;
                return Err(TrainError::Diverged {
                    step: t,
                    loss: shared[0],
                });
            }
            let comm_ms = report.comm_time.as_secs_f64() * 1e3;
            let record = StepRecord {
                step: t,
                epoch,
                elapsed_s: run_start.elapsed().as_secs_f64(),
                loss,
                lr: report.lr,
                stage: report.stage.to_string(),
                bytes_sent: report.traffic.sent(),
                forward_ms,
                backward_ms,
                comm_ms,
                optimizer_ms: (step_ms - comm_ms).max(0.0),
                samples_per_s: cfg.train.global_batch as f64
                    / step_start.elapsed().as_secs_f64().max(1e-9),
                grad_norm,
            };
            log.line(&record)?;
            comm.set_deadline(deadline.after_step(step_start.elapsed()));
            summary.add(
                &record,
                cfg.train.global_batch as u64,
                flat.layout().len(),
                world,
            );
            bar.inc(1);
            bar.set_message(format!("loss {loss:.4} {}", record.stage));
            if let Some(lines) = &lines {
                lines.step(t, loss, &record.stage);
            }

            let stop = shared[1] > 0.0;
            let last = t == cfg.train.steps;
            if last {
                model = finish(&mut optimizer, model, &mut flat, comm)?;
            }
            let every = cfg.train.checkpoint_every;
            if stop || last || (every > 0 && t.is_multiple_of(every)) {
                rank_phase::enter(rank, Phase::Checkpoint(t));
                let dir = self.save(&model, &mut optimizer, comm)?;
                if stop && !last {
                    bar.abandon();
                    return Err(TrainError::Interrupted {
                        step: t,
                        checkpoint: dir,
                    });
                }
            }
            let eval_every = cfg.train.eval_every;
            if lead && !last && eval_every > 0 && t.is_multiple_of(eval_every) {
                rank_phase::enter(rank, Phase::Evaluate(t));
                let eval =
                    bar.suspend(|| task.evaluate(&model.valid(), &device.clone().inner()))?;
                bar.suspend(|| tracing::info!("step {t}: {}", render_eval(&eval)));
                log.line(&EvalRecord { step: t, eval })?;
            }
        }
        bar.finish_and_clear();
        rank_phase::enter(rank, Phase::Finish);
        if lead {
            summary.eval = task.evaluate(&model.valid(), &device.clone().inner())?;
            log.line(&EvalRecord {
                step: optimizer.step_count(),
                eval: summary.eval.clone(),
            })?;
            match task.export(&model, &self.run_dir.join("export")) {
                // A model with no export form: the run itself succeeded.
                Err(e @ TrainError::InvalidRun { .. }) => tracing::warn!("no export: {e}"),
                other => other?,
            }
        }
        // The other ranks wait for rank 0's final evaluation and export in
        // a collective, under the deadline: a rank 0 stuck there is named
        // instead of leaving the job waiting in the transport's shutdown.
        if world > 1 {
            comm.barrier()?;
        }
        Ok(RunOutcome { model, summary })
    }

    fn save<M: ModuleSnapshot>(
        &self,
        model: &M,
        optimizer: &mut Optimizer,
        comm: &dyn Communicator,
    ) -> Result<std::path::PathBuf, TrainError> {
        let rank = comm.rank();
        optimizer.sync_state(comm)?;
        checkpoint::write(
            self.run_dir,
            optimizer.step_count(),
            &optimizer.stage().to_string(),
            self.config,
            comm,
            |dir| {
                let path = dir.join(model_file(rank));
                let mut store = SafetensorsStore::from_file(&path);
                model
                    .save_into(&mut store)
                    .map_err(|e| TrainError::Checkpoint {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                optimizer.save(&dir.join(optimizer_file(rank)))?;
                Ok(())
            },
        )
    }

    /// `dir` as the checkpoint to continue from: it must exist, and when it
    /// is one of this run directory's own, no newer one may follow it (the
    /// continued run would write its checkpoints over them, and a later
    /// plain `--resume` would pick the stale newest).
    fn chosen_checkpoint(&self, dir: &Path) -> Result<std::path::PathBuf, TrainError> {
        let bad = |reason: String| TrainError::Checkpoint {
            path: dir.to_path_buf(),
            reason,
        };
        if !dir.is_dir() {
            return Err(bad("no such checkpoint directory".into()));
        }
        let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        let own = checkpoint::list(self.run_dir)?;
        if let Some(at) = own.iter().position(|(_, p)| canonical(p) == canonical(dir)) {
            let newer: Vec<String> = own[at + 1..]
                .iter()
                .map(|(_, p)| p.display().to_string())
                .collect();
            if !newer.is_empty() {
                return Err(bad(format!(
                    "newer checkpoints of this run follow it ({}): remove them to continue \
                     from here, or continue into another --run-dir",
                    newer.join(", ")
                )));
            }
        }
        Ok(dir.to_path_buf())
    }

    fn restore<M: ModuleSnapshot>(
        &self,
        mut model: M,
        optimizer: &mut Optimizer,
        comm: &dyn Communicator,
    ) -> Result<M, TrainError> {
        let chosen = match self.resume_from {
            Some(dir) => Some(self.chosen_checkpoint(dir)?),
            None => checkpoint::agree_on_latest(self.run_dir, comm)?,
        };
        let Some(dir) = chosen else {
            if comm.rank() == 0 {
                tracing::info!(
                    "no checkpoint in {} yet: starting from step 0",
                    checkpoint::checkpoints_dir(self.run_dir).display()
                );
            }
            return Ok(model);
        };
        let meta = checkpoint::verify_own(&dir, self.config, comm)?.meta;
        checkpoint::load_model(&mut model, &dir.join(model_file(comm.rank())))?;
        optimizer.load(&dir.join(optimizer_file(comm.rank())))?;
        if comm.rank() == 0 {
            tracing::info!(
                "resumed from {} (step {}, {})",
                dir.display(),
                meta.step,
                meta.stage
            );
        }
        Ok(model)
    }
}

fn render_eval(eval: &[(String, f64)]) -> String {
    eval.iter()
        .map(|(name, value)| format!("{name} {value:.4}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Ends the optimizer's run on a module: SLAMB averages the parameters
/// over ranks; the others leave them as they are.
fn finish<M: Module>(
    optimizer: &mut Optimizer,
    model: M,
    flat: &mut FlatModel,
    comm: &dyn Communicator,
) -> Result<M, TrainError> {
    flat.finish(optimizer, comm)?;
    Ok(flat.write_into(model)?)
}
