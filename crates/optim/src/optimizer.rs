//! The optimizer interface and the driver that owns step counting, the
//! learning-rate schedule and the module round trip.

use std::time::{Duration, Instant};

use burn::module::Module;
use burn::tensor::{Gradients, Tensor, TensorData};
use terse_comm::{Communicator, ReduceOp};

use crate::onebit_adam::{AdamVariant, OneBitAdam};
use crate::onebit_lamb::OneBitLamb;
use crate::slamb::Slamb;
use crate::{
    Adam, Lamb, LrSchedule, OptimError, OptimizerConfig, ParamLayout, Sgd, gather_grads,
    gather_params, tensor_to_host, write_back,
};

/// What an optimizer step may look at besides the buffers.
pub struct StepContext<'a> {
    /// The step being taken, counted from 1.
    pub t: u64,
    /// The learning rate of this step.
    pub lr: f64,
    /// Where each parameter lives in the flat buffers.
    pub layout: &'a ParamLayout,
    /// The ranks this step is synchronised over.
    pub comm: &'a dyn Communicator,
    /// The last step of the LR schedule's warmup (0 without one).
    pub lr_warmup: u64,
}

/// Which kind of step an optimizer took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// An uncompressed optimizer: the gradient allreduced in fp32.
    Full,
    /// A 1-bit optimizer before its freeze: the uncompressed optimizer.
    Warmup,
    /// A 1-bit optimizer after its freeze: compressed momentum.
    Compression,
    /// SLAMB: a masked subset of the momentum synchronised.
    Sparse,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Full => "full",
            Stage::Warmup => "warmup",
            Stage::Compression => "compression",
            Stage::Sparse => "sparse",
        })
    }
}

/// An update rule over flat buffers that owns its state and its communication.
pub trait FlatOptimizer: Send {
    /// Applies step `ctx.t` to the parameters `x` given this rank's local
    /// gradient `g` (which the optimizer may overwrite, e.g. with the
    /// allreduced gradient). Returns the wall time spent communicating.
    fn step(
        &mut self,
        ctx: &StepContext<'_>,
        x: &mut [f32],
        g: &mut [f32],
    ) -> Result<Duration, OptimError>;

    /// The flat state tensors, named by role (`m`, `v`, ...), for saving.
    fn state(&self) -> Vec<(&'static str, &[f32])>;

    /// The same tensors, mutable, for loading.
    fn state_mut(&mut self) -> Vec<(&'static str, &mut [f32])>;

    /// Small state kept in f64 (per-segment coefficients, the freeze step,
    /// the auto-freeze history), named by role; any length.
    fn scalars(&self) -> Vec<(&'static str, Vec<f64>)> {
        Vec::new()
    }

    /// Restores one [`FlatOptimizer::scalars`] entry; `Err` names what is
    /// wrong with it.
    fn set_scalars(&mut self, role: &str, values: Vec<f64>) -> Result<(), String> {
        let _ = values;
        Err(format!("unknown scalar state `{role}`"))
    }

    /// The kind of step `t` is (or was).
    fn stage(&self, t: u64) -> Stage {
        let _ = t;
        Stage::Full
    }

    /// Called once after the last step (SLAMB averages the parameters).
    fn finish(&mut self, ctx: &StepContext<'_>, x: &mut [f32]) -> Result<Duration, OptimError> {
        let _ = (ctx, x);
        Ok(Duration::ZERO)
    }
}

/// Allreduces the local gradient to its mean over ranks, timing the call:
/// the communication of the uncompressed optimizers.
pub(crate) fn allreduce_mean_gradient(
    comm: &dyn Communicator,
    g: &mut [f32],
) -> Result<Duration, OptimError> {
    let start = Instant::now();
    comm.allreduce_f32(g, ReduceOp::Mean)?;
    Ok(start.elapsed())
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The step taken (from 1).
    pub t: u64,
    /// Its learning rate.
    pub lr: f64,
    /// Wall time spent in collectives.
    pub comm_time: Duration,
    /// What the step's collectives moved, per kind (bytes sent and received).
    pub traffic: terse_comm::Traffic,
    /// Which stage the step was in.
    pub stage: Stage,
}

/// A configured optimizer bound to one parameter layout: the update rule, its
/// schedule and the step counter.
pub struct Optimizer {
    pub(crate) config: OptimizerConfig,
    pub(crate) schedule: LrSchedule,
    pub(crate) layout: ParamLayout,
    pub(crate) rule: Box<dyn FlatOptimizer>,
    pub(crate) t: u64,
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
}

impl Optimizer {
    /// Validates `config` and `schedule` and allocates zeroed state for
    /// `layout` on `comm`'s rank (the compressed optimizers size their
    /// server error by the world).
    pub fn new(
        config: OptimizerConfig,
        schedule: LrSchedule,
        layout: ParamLayout,
        comm: &dyn Communicator,
    ) -> Result<Self, OptimError> {
        config.validate()?;
        schedule.validate()?;
        let d = layout.len();
        let rule: Box<dyn FlatOptimizer> = match &config {
            OptimizerConfig::Adam(c) => Box::new(Adam::new(c.clone(), d)),
            OptimizerConfig::Lamb(c) => Box::new(Lamb::new(c.clone(), d)),
            OptimizerConfig::Sgd(c) => Box::new(Sgd::new(c.clone(), d)),
            OptimizerConfig::OnebitAdam(c) => Box::new(OneBitAdam::new(
                c.clone(),
                AdamVariant::OneBit,
                &layout,
                comm,
            )?),
            OptimizerConfig::OnebitAdamFp32(c) => Box::new(OneBitAdam::new(
                c.clone(),
                AdamVariant::Fp32Momentum,
                &layout,
                comm,
            )?),
            OptimizerConfig::AdamOnebitNaive(c) => Box::new(OneBitAdam::new(
                c.clone(),
                AdamVariant::Naive,
                &layout,
                comm,
            )?),
            OptimizerConfig::OnebitLamb(c) => {
                Box::new(OneBitLamb::new(c.clone(), false, &layout, comm)?)
            }
            OptimizerConfig::LambOnebitBasic(c) => {
                Box::new(OneBitLamb::new(c.clone(), true, &layout, comm)?)
            }
            OptimizerConfig::Slamb(c) => Box::new(Slamb::new(c.clone(), &layout, comm)),
        };
        Ok(Self {
            config,
            schedule,
            layout,
            rule,
            t: 0,
            rank: comm.rank(),
            world_size: comm.world_size(),
        })
    }

    /// The stage of the last step taken.
    pub fn stage(&self) -> Stage {
        self.rule.stage(self.t)
    }

    /// The number of steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.t
    }

    /// The parameter layout this optimizer was built for.
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The optimizer's configuration.
    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// The learning-rate schedule.
    pub fn schedule(&self) -> &LrSchedule {
        &self.schedule
    }

    /// One step on host buffers: `x` the flat parameters, `g` this rank's flat
    /// local gradient (overwritten by the optimizer's communication).
    pub fn step_flat(
        &mut self,
        x: &mut [f32],
        g: &mut [f32],
        comm: &dyn Communicator,
    ) -> Result<StepReport, OptimError> {
        self.check_len("parameters", x.len())?;
        self.check_len("gradient", g.len())?;
        self.check_world(comm)?;
        let t = self.t + 1;
        let lr = self.schedule.lr(t);
        let ctx = StepContext {
            t,
            lr,
            layout: &self.layout,
            comm,
            lr_warmup: self.schedule.warmup_steps(),
        };
        let before = comm.traffic();
        let comm_time = self.rule.step(&ctx, x, g)?;
        let traffic = comm.traffic() - before;
        self.t = t;
        Ok(StepReport {
            t,
            lr,
            comm_time,
            traffic,
            stage: self.rule.stage(t),
        })
    }

    /// Ends a run: SLAMB averages the parameters over ranks (the others do
    /// nothing). Returns the time spent communicating.
    pub fn finish_flat(
        &mut self,
        x: &mut [f32],
        comm: &dyn Communicator,
    ) -> Result<Duration, OptimError> {
        self.check_len("parameters", x.len())?;
        self.check_world(comm)?;
        let ctx = StepContext {
            t: self.t,
            lr: self.schedule.lr(self.t),
            layout: &self.layout,
            comm,
            lr_warmup: self.schedule.warmup_steps(),
        };
        self.rule.finish(&ctx, x)
    }

    fn check_world(&self, comm: &dyn Communicator) -> Result<(), OptimError> {
        if (comm.rank(), comm.world_size()) == (self.rank, self.world_size) {
            Ok(())
        } else {
            Err(OptimError::WorldMismatch {
                expected: (self.rank, self.world_size),
                actual: (comm.rank(), comm.world_size()),
            })
        }
    }

    /// One step on a module: gathers its parameters and the gradients of
    /// `grads`, steps, and writes the parameters back (ids, autodiff and
    /// require-grad kept).
    pub fn step_module<M: Module>(
        &mut self,
        module: M,
        grads: &Gradients,
        comm: &dyn Communicator,
    ) -> Result<(M, StepReport), OptimError> {
        let params = gather_params(&self.layout, &module)?;
        let device = params.device();
        let mut x = tensor_to_host(params)?;
        let mut g = tensor_to_host(gather_grads(&self.layout, &module, grads)?)?;
        let report = self.step_flat(&mut x, &mut g, comm)?;
        let n = x.len();
        let flat = Tensor::<1>::from_data(TensorData::new(x, [n]), &device);
        Ok((write_back(&self.layout, module, flat)?, report))
    }

    fn check_len(&self, what: &'static str, actual: usize) -> Result<(), OptimError> {
        if actual == self.layout.len() {
            Ok(())
        } else {
            Err(OptimError::LengthMismatch {
                what,
                expected: self.layout.len(),
                actual,
            })
        }
    }
}
