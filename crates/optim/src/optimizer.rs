//! The driver every caller steps: it owns the step counter, the
//! learning-rate schedule and the world it was built for, and delegates
//! the update of the flat buffers to the rule the registry built (callers
//! gather and write back modules with [`crate::gather`]).

use terse_comm::Communicator;

use crate::step::{CommTime, FlatOptimizer, StepContext};
use crate::{
    DeviceFlat, FlatMut, LrSchedule, OptimError, OptimizerConfig, OwnState, ParamLayout, Stage,
    StepReport,
};

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
        let rule = config.build(&layout, comm)?;
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
        // State a device step left there continues here.
        self.state_to_host();
        self.take_step(comm, |rule, ctx| {
            rule.step(ctx, &mut FlatMut::Host(x), &mut FlatMut::Host(g))
        })
    }

    /// Step `t + 1` through `step` (the rule's host or device step), with
    /// its learning rate, time and traffic reported.
    fn take_step(
        &mut self,
        comm: &dyn Communicator,
        step: impl FnOnce(&mut dyn FlatOptimizer, &StepContext<'_>) -> CommTime,
    ) -> Result<StepReport, OptimError> {
        let t = self.t + 1;
        let ctx = context(&self.schedule, &self.layout, t, comm);
        let lr = ctx.lr;
        let before = comm.traffic();
        let comm_time = step(self.rule.as_mut(), &ctx)?;
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

    /// Gathers state that steps split between ranks that share cores left
    /// current only in each rank's part (see [`crate::FlatOptimizer::sync_state`]):
    /// a collective, called by every rank before [`Optimizer::save`].
    pub fn sync_state(&mut self, comm: &dyn Communicator) -> Result<(), OptimError> {
        self.rule.sync_state(comm)
    }

    /// Whether every step leaves the parameters the same bits on every rank
    /// (every rule but SLAMB, whose ranks step their own between
    /// averagings): then ranks that are threads of one process can share one
    /// copy of them ([`crate::FlatModel::write_into_replicated`]).
    pub fn params_replicated(&self) -> bool {
        self.rule.params_replicated()
    }

    /// Which of the state is each rank's own (the rest is the same bits on
    /// every rank): none under AdamW, LAMB and SGD, the error buffers
    /// under 1-bit Adam and 1-bit LAMB, all of it otherwise.
    pub fn own_state(&self) -> OwnState {
        self.rule.own_state()
    }

    /// One step on flat buffers of a cubecl device: `x` the parameters, `g`
    /// this rank's local gradient (overwritten by the allreduce). The
    /// optimizer state moves there at the first and stays; only the
    /// gradient's allreduce passes through the host (terse-comm's backends
    /// take host buffers).
    ///
    /// # Errors
    /// A length or world mismatch; a failed collective.
    pub fn step_device(
        &mut self,
        x: &mut DeviceFlat,
        g: &mut DeviceFlat,
        comm: &dyn Communicator,
    ) -> Result<StepReport, OptimError> {
        self.check_len("parameters", x.len())?;
        self.check_len("gradient", g.len())?;
        self.check_world(comm)?;
        self.state_beside(x);
        self.take_step(comm, |rule, ctx| {
            rule.step(ctx, &mut FlatMut::Device(x), &mut FlatMut::Device(g))
        })
    }

    /// [`Optimizer::finish_flat`] for device buffers.
    ///
    /// # Errors
    /// A length or world mismatch; a failed collective.
    pub fn finish_device(&mut self, x: &mut DeviceFlat, comm: &dyn Communicator) -> CommTime {
        self.check_len("parameters", x.len())?;
        self.check_world(comm)?;
        self.state_beside(x);
        let ctx = context(&self.schedule, &self.layout, self.t, comm);
        self.rule.finish(&ctx, &mut FlatMut::Device(x))
    }

    /// Ends a run: SLAMB averages the parameters over ranks, 0/1 Adam
    /// synchronises the local steps taken since its last synchronisation
    /// (the others do nothing). Returns the time spent communicating.
    pub fn finish_flat(&mut self, x: &mut [f32], comm: &dyn Communicator) -> CommTime {
        self.check_len("parameters", x.len())?;
        self.check_world(comm)?;
        self.state_to_host();
        let ctx = context(&self.schedule, &self.layout, self.t, comm);
        self.rule.finish(&ctx, &mut FlatMut::Host(x))
    }

    /// Moves the rule's state to the host (a no-op where it is already).
    fn state_to_host(&mut self) {
        for (_, buffer) in self.rule.state() {
            buffer.move_to_host();
        }
    }

    /// Moves the rule's state to `x`'s device (a no-op after the first).
    fn state_beside(&mut self, x: &DeviceFlat) {
        for (_, buffer) in self.rule.state() {
            buffer.move_to_device(x);
        }
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

/// What step `t` of `schedule` over `layout` sees besides the buffers.
fn context<'a>(
    schedule: &LrSchedule,
    layout: &'a ParamLayout,
    t: u64,
    comm: &'a dyn Communicator,
) -> StepContext<'a> {
    StepContext {
        t,
        lr: schedule.lr(t),
        layout,
        comm,
        lr_warmup: schedule.warmup_steps(),
    }
}
