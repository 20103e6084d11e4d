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
use burn::tensor::Device;
use terse_comm::{Communicator, ReduceOp};
use terse_optim::{FlatModel, Optimizer, StepReport};

use crate::checkpoint;
use crate::collective_deadline::CollectiveDeadline;
use crate::logging;
use crate::loss_scale::{LossScaler, LossScaling};
use crate::matmul_choice;
use crate::metrics::{DeviceMemoryMb, DivergedRecord, MetricsLog, StepRecord, ms};
use crate::micro_batches::{Lanes, StepPlace, local_gradient};
use crate::progress::{ProgressLines, step_bar};
use crate::rank_phase::{self, Phase};
use crate::ready_gradient::{ReadyGradient, ready_gradient};
use crate::run_summary::RunSummary;
use crate::step_order::StepOrder;
use crate::step_reads::StepReadCounter;
use crate::task::Task;
use crate::trainer_checkpoints::next_checkpoint;
use crate::{RunConfig, TrainError, signals};

mod evaluation;
mod finish;

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
    /// Runs the loop on `comm`'s rank to `config.train.steps`: prepare
    /// (run directory, model, flat buffers, optimizer, resume), then each
    /// step (its gradient, clipping, the optimizer's step), what it shows
    /// (metrics line, progress), a checkpoint when one is due or a signal
    /// came, an evaluation when one is due; at the end the final
    /// evaluation and the export.
    pub fn run<T: Task>(
        &self,
        task: &T,
        comm: &dyn Communicator,
    ) -> Result<RunOutcome<T::Model>, TrainError> {
        let (mut run, mut model) = self.prepare(task, comm)?;
        // The bar is drawn from here (a resumed run's position): this
        // thread's terminal lines go around it.
        let drawn = crate::logging::draw_around(&run.bar);
        self.warn_if_checkpoint_will_not_fit(&model, &mut run.optimizer, run.start_step, comm)?;
        run.evaluate_before(&model)?;
        // Ranks reach this point one after another (local ranks set up in
        // turn, ~60 ms apart for BERT-Tiny and up to 0.8 s): starting step 1
        // together puts every rank's one-time costs (heap growth, pages
        // touched for the first time) in step 1, not in step 2, the first
        // the ranks then ran side by side.
        if run.world > 1 {
            comm.barrier()?;
        }
        let run_start = Instant::now();
        // The ETA counts steps from here: not the evaluation before them,
        // nor (the bar's estimate) a resumed run's steps as done at once.
        run.bar.reset_eta();
        if let Some(lines) = &mut run.lines {
            lines.restart();
        }
        for t in run.start_step + 1..=self.config.train.steps {
            rank_phase::enter(run.rank, Phase::Step(t));
            let (stepped, record, stop) = run.step(model, t, run_start)?;
            model = stepped;
            run.observe(&record);
            let last = t == self.config.train.steps;
            if last {
                model = run.finish_optimizer(model)?;
            }
            let every = self.config.train.checkpoint_every;
            if stop || last || (every > 0 && t.is_multiple_of(every)) {
                rank_phase::enter(run.rank, Phase::Checkpoint(t));
                let dir = self.save(&model, &mut run.optimizer, t, run.scaler, comm)?;
                if stop && !last {
                    run.bar.abandon();
                    return Err(TrainError::Interrupted {
                        step: t,
                        checkpoint: dir,
                    });
                }
                if let Some(next) = next_checkpoint(t, every, self.config.train.steps) {
                    checkpoint::warn_if_next_will_not_fit(&dir, t, next, comm)?;
                }
            }
            let eval_every = self.config.train.eval_every;
            if !last && eval_every > 0 && t.is_multiple_of(eval_every) {
                run.evaluate(&model, t)?;
            }
        }
        run.bar.finish_and_clear();
        drop(drawn);
        let summary = run.finish(&model, &self.run_dir.join("export"))?;
        // A finished run resumed takes no step: its summary stays the
        // one the run wrote.
        if comm.rank() == 0 && summary.steps > 0 {
            self.write_summary(&summary)?;
        }
        Ok(RunOutcome { model, summary })
    }

    /// Everything before step 1: the run directory and its log, the model
    /// (initialised on the CPU whatever the device, so every device starts
    /// from the same weights), the flat buffers and the optimizer (on the
    /// device for a device run), the checkpoint resumed, the plan logged.
    fn prepare<'r, T: Task>(
        &'r self,
        task: &'r T,
        comm: &'r dyn Communicator,
    ) -> Result<(Run<'r, T>, T::Model), TrainError> {
        let cfg = self.config;
        let (rank, world) = (comm.rank(), comm.world_size());
        cfg.train.accumulation(world)?;
        let order = StepOrder::new(
            task.examples(),
            cfg.train.seed,
            rank,
            world,
            cfg.train.global_batch / world,
        )?;
        let lead = rank == 0;
        rank_phase::enter(rank, Phase::SetUp);
        self.open_run_dir(rank, world)?;

        let device = cfg.train.device.open(cfg.train.precision)?.autodiff();
        matmul_choice::name_for_run(cfg)?;
        let (mut model, mut flat) = {
            let _turn = INIT.lock().unwrap_or_else(|p| p.into_inner());
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
                log_device(cfg);
            }
        }
        let mut resumed = None;
        if self.resume {
            rank_phase::enter(rank, Phase::Resume);
            let meta;
            (model, meta) = self.restore(model, &mut optimizer, comm)?;
            resumed = meta;
            if lead {
                self.write_config()?;
            }
            flat.regather(&model)?;
            rank_phase::enter(rank, Phase::SetUp);
        } else {
            checkpoint::clear_own(self.run_dir, rank)?;
        }
        // fp16's scaler continues from the checkpoint's (a checkpoint of
        // another precision has none: DeepSpeed's initial scale).
        let scaling = cfg.train.loss_scaling.clone().unwrap_or_default();
        let scaler = cfg.train.precision.scales_loss().then(|| {
            resumed
                .as_ref()
                .and_then(|m: &checkpoint::CheckpointMeta| m.loss_scaler)
                .map_or_else(|| LossScaler::new(&scaling), |s| s.resumed_under(&scaling))
        });
        if lead {
            log_plan(cfg, world);
        }

        let deadline = CollectiveDeadline::new(cfg.train.collective_timeout_s);
        comm.set_deadline(deadline.initial());
        let start_step = resumed.map_or(0, |m| m.step);
        let log = MetricsLog::open(self.run_dir, lead, start_step)?;
        let bar = step_bar(cfg.train.steps, self.progress && lead);
        bar.set_position(start_step);
        bar.set_prefix(cfg.optimizer.name());
        let lines = ProgressLines::new(cfg.train.steps, start_step, self.progress && lead);
        // Micro-batches run side by side where the rank has the threads
        // (micro_batches.rs).
        let per_step = (cfg.train.global_batch / world).div_ceil(cfg.train.micro_batch);
        let lanes = Lanes::for_run(
            per_step,
            cfg.train.device.is_cpu() && flat.params().is_some(),
        )?;
        // Ranks whose parameters are the same bits after every step share
        // one copy of them where they are threads of one process (on the
        // CPU: flex tensors are plain shared memory).
        let share_params = world > 1 && cfg.train.device.is_cpu() && optimizer.params_replicated();
        let run = Run {
            config: cfg,
            task,
            comm,
            rank,
            world,
            order,
            device,
            flat,
            optimizer,
            deadline,
            log,
            bar,
            lines,
            summary: RunSummary::default(),
            lanes,
            share_params,
            start_step,
            scaler,
            scaling,
        };
        Ok((run, model))
    }

    /// Attaches this rank's log to the run directory; the lead rank
    /// creates it and, starting afresh, writes the resolved config there (a
    /// resume writes it once its checkpoint is accepted, so that a refused
    /// `--resume --set …` leaves the run's config as it was).
    fn open_run_dir(&self, rank: usize, world: usize) -> Result<(), TrainError> {
        logging::set_rank(rank);
        logging::attach_run_dir(self.run_dir).map_err(|source| TrainError::Io {
            path: self.run_dir.join(logging::LOG_FILE),
            source,
        })?;
        tracing::debug!(
            "rank {rank} of {world} starts, run directory {}",
            self.run_dir.display()
        );
        if rank == 0 {
            std::fs::create_dir_all(self.run_dir).map_err(|source| TrainError::Io {
                path: self.run_dir.to_path_buf(),
                source,
            })?;
            if !self.resume {
                self.write_config()?;
            }
        }
        Ok(())
    }

    /// The resolved config as the run directory's `config.toml` (the lead
    /// rank's).
    fn write_config(&self) -> Result<(), TrainError> {
        let path = self.run_dir.join("config.toml");
        std::fs::write(&path, self.config.to_toml())
            .map_err(|source| TrainError::Io { path, source })
    }
}

/// What the prepared loop holds between steps on one rank (the model is
/// passed through each phase by value: writing the stepped parameters into
/// it consumes it).
struct Run<'r, T: Task> {
    config: &'r RunConfig,
    task: &'r T,
    comm: &'r dyn Communicator,
    rank: usize,
    world: usize,
    order: StepOrder,
    device: Device,
    flat: FlatModel,
    optimizer: Optimizer,
    deadline: CollectiveDeadline,
    log: MetricsLog,
    bar: indicatif::ProgressBar,
    lines: Option<ProgressLines>,
    summary: RunSummary,
    lanes: Option<Lanes>,
    share_params: bool,
    /// The step the run starts after (a resumed run's checkpoint).
    start_step: u64,
    /// fp16's loss scaler (`None` in the other precisions).
    scaler: Option<LossScaler>,
    /// Its settings.
    scaling: LossScaling,
}

impl<T: Task> Run<'_, T> {
    /// Step `t`: this rank's gradient over its share of the batch, the
    /// clipping, the optimizer's step (which owns the step's
    /// communication), the stepped parameters written into the model, and
    /// one small allreduce of the loss, the signal flag and the gradient's
    /// squared norm. Returns the model, the step's record and whether any
    /// rank was signalled to stop; a non-finite loss ends the run (but in
    /// an fp16 step skipped for an overflow).
    fn step(
        &mut self,
        mut model: T::Model,
        t: u64,
        run_start: Instant,
    ) -> Result<(T::Model, StepRecord, bool), TrainError> {
        let (cfg, comm) = (self.config, self.comm);
        let step_start = Instant::now();
        let reads = StepReadCounter::start();
        let (epoch, share) = self.order.share(t);
        let at = StepPlace {
            seed: cfg.train.seed,
            t,
            epoch,
            rank: self.rank,
            half: cfg.train.precision.half(),
            loss_scale: self.scaler.map_or(1.0, |s| s.scale as f32),
        };
        let local = local_gradient(
            self.task,
            &mut model,
            share,
            cfg.train.micro_batch,
            &at,
            &self.device,
            &mut self.flat,
            self.lanes.as_ref(),
        )?;
        let (forward_ms, backward_ms) = (local.forward_ms, local.backward_ms);
        let ready = ready_gradient(
            &mut self.flat,
            self.scaler.as_mut(),
            &self.scaling,
            cfg.train.max_grad_norm,
            t,
            comm,
        );
        let ReadyGradient {
            skip,
            squares,
            clipped,
        } = self.diverged_if(t, ready)?;
        let clock = Instant::now();
        reads.update_starts();
        let (model, report) = self.update(model, skip)?;
        let step_ms = ms(clock);
        // The step's work is queued: reading its loss and norm waits for it.
        let ((mut local_loss, squares), wait_ms, step_reads) =
            reads.after_update(|| (local.mean_loss(), self.flat.read_squares(squares) as f32));
        if crate::loss_scale::injected_loss_overflow(t, self.rank) {
            local_loss = f64::INFINITY;
        }

        // The loss every rank saw, whether any rank was signalled and the
        // squared gradient norms, in one small allreduce outside the
        // optimizer's accounting.
        let mut shared = [
            local_loss as f32,
            f32::from(u8::from(signals::requested())),
            squares,
        ];
        if self.world > 1 {
            comm.allreduce_f32(&mut shared, ReduceOp::Mean)?;
        }
        let loss = f64::from(shared[0]);
        let grad_norm = clipped.norm(squares, shared[2]);
        tracing::debug!(
            "step {t}: local loss {:.6}, {} stage, {} bytes sent, forward {forward_ms:.1} ms, \
             backward {backward_ms:.1} ms, optimizer step {step_ms:.1} ms",
            local_loss,
            report.stage,
            report.traffic.sent()
        );
        self.check_loss(t, shared[0], skip)?;
        let comm_ms = report.comm_time.as_secs_f64() * 1e3;
        let on_device = self.flat.params().is_none();
        let record = StepRecord {
            step: t,
            epoch,
            elapsed_s: run_start.elapsed().as_secs_f64(),
            loss,
            lr: report.lr,
            stage: report.stage.to_string(),
            bytes_sent: report.traffic.sent(),
            collectives: report.traffic.calls(),
            forward_ms,
            backward_ms,
            comm_ms,
            optimizer_ms: (step_ms - comm_ms).max(0.0),
            samples_per_s: cfg.train.global_batch as f64
                / step_start.elapsed().as_secs_f64().max(1e-9),
            grad_norm,
            loss_scale: self.scaler.map(|_| f64::from(at.loss_scale)),
            skipped: skip,
            device_wait_ms: on_device.then_some(wait_ms),
            host_reads: on_device.then_some(step_reads),
            device_memory_mb: self.flat.device_memory().map(DeviceMemoryMb::from),
        };
        self.log.line(&record)?;
        self.comm
            .set_deadline(self.deadline.after_step(step_start.elapsed()));
        Ok((model, record, shared[1] > 0.0))
    }

    /// `ready`, or its error; fp16 overflowing at the loss scale's floor
    /// ends the run as a divergence, said so in metrics.jsonl too, for its
    /// readers.
    fn diverged_if(
        &mut self,
        t: u64,
        ready: Result<ReadyGradient, TrainError>,
    ) -> Result<ReadyGradient, TrainError> {
        if let Err(TrainError::LossScaleFloor { .. }) = &ready {
            self.log_diverged(t)?;
        }
        ready
    }

    /// metrics.jsonl's last line for a run ending at step `t` without a
    /// finite loss (`cargo xtask plot` marks the curve's end there).
    fn log_diverged(&mut self, t: u64) -> Result<(), TrainError> {
        self.log.line(&DivergedRecord {
            step: t,
            diverged: true,
        })
    }

    /// Step `t`'s mean loss over the ranks, checked: not finite, it ends the
    /// run (the diverged line written) but in an fp16 step skipped for an
    /// overflow, where the forward pass overflowed as well as the gradient:
    /// the scale is lowered and the run goes on, as DeepSpeed's
    /// FP16_Optimizer does (an overflow that persists ends it at the
    /// scale's floor).
    fn check_loss(&mut self, t: u64, loss: f32, skip: bool) -> Result<(), TrainError> {
        if loss.is_finite() {
            return Ok(());
        }
        if skip {
            if self.rank == 0 {
                tracing::warn!("step {t}: the loss is {loss} in the skipped fp16 step");
            }
            return Ok(());
        }
        if self.rank == 0 {
            tracing::error!("step {t}: the loss is {loss}: the run diverged");
        }
        self.log_diverged(t)?;
        Err(TrainError::Diverged { step: t, loss })
    }

    /// The optimizer's step and the stepped parameters written into the
    /// model; a skipped step leaves the optimizer, its step count, freeze
    /// point and error feedback, the schedule and the parameters as they
    /// were.
    fn update(
        &mut self,
        model: T::Model,
        skip: bool,
    ) -> Result<(T::Model, StepReport), TrainError> {
        if skip {
            let t = self.optimizer.step_count();
            let report = StepReport {
                t,
                lr: self.optimizer.schedule().lr(t + 1),
                comm_time: Default::default(),
                traffic: Default::default(),
                stage: self.optimizer.stage(),
            };
            return Ok((model, report));
        }
        let report = self.flat.step(&mut self.optimizer, self.comm)?;
        let model = if self.share_params {
            self.flat.write_into_replicated(model, self.comm)?
        } else {
            self.flat.write_into(model)?
        };
        Ok((model, report))
    }

    /// What a step shows: its totals in the summary, the progress bar (or
    /// lines).
    fn observe(&mut self, record: &StepRecord) {
        let global_batch = self.config.train.global_batch as u64;
        let len = self.flat.layout().len();
        self.summary.add(record, global_batch, len, self.world);
        self.bar.inc(1);
        self.bar.set_message(crate::progress::step_state(record));
        if let Some(lines) = &self.lines {
            lines.step(record);
        }
    }
}

/// Where a device run's state lives, and what its precision means there,
/// as the lead rank logs it.
fn log_device(cfg: &RunConfig) {
    let hardware = cfg
        .train
        .device
        .hardware()
        .map(|name| format!(" ({name})"))
        .unwrap_or_default();
    tracing::info!(
        "{} steps on {}{hardware}: flat parameters, gradient and optimizer state on the device",
        cfg.optimizer.name(),
        cfg.train.device
    );
    if let Some(note) = cfg.train.precision.note_on(&cfg.train.device) {
        tracing::info!("{note}");
    }
    matmul_choice::log_named(cfg);
}

/// The optimizer's plan for the run, as the lead rank logs it: which steps
/// communicate what, and a warning when a 1-bit optimizer's freeze is never
/// reached.
fn log_plan(cfg: &RunConfig, world: usize) {
    let plan = cfg.optimizer.plan(cfg.train.steps, &cfg.schedule);
    if world == 1 {
        // One rank has nothing to average: no collective, no compression.
        tracing::info!(
            "{}: {} steps on one rank, nothing communicated",
            cfg.optimizer.name(),
            cfg.train.steps
        );
        return;
    }
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

fn render_eval(eval: &[(String, f64)]) -> String {
    eval.iter()
        .map(|(name, value)| format!("{name} {value:.4}"))
        .collect::<Vec<_>>()
        .join(", ")
}
