//! The step interface every update rule implements: the flat buffers it
//! sees, what it may look at besides them, and what it reports.

use std::time::{Duration, Instant};

use terse_comm::{Communicator, ReduceOp};

use crate::device_flat::allreduce_mean_device;
use crate::{Flat, FlatMut, OptimError, ParamLayout};

/// What a step (or a collective inside one) returns: the wall time spent
/// communicating, or why it failed.
pub type CommTime = Result<Duration, OptimError>;

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
    /// 0/1 Adam between synchronisations: each rank steps its own
    /// parameters and sends nothing.
    Local,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Full => "full",
            Stage::Warmup => "warmup",
            Stage::Compression => "compression",
            Stage::Sparse => "sparse",
            Stage::Local => "local",
        })
    }
}

/// An update rule over flat buffers that owns its state and its communication.
pub trait FlatOptimizer: Send {
    /// Applies step `ctx.t` to the parameters `x` given this rank's local
    /// gradient `g` (which the optimizer may overwrite, e.g. with the
    /// allreduced gradient), both on the host or both on a cubecl device,
    /// where the driver moved [`FlatOptimizer::state`]. Returns the wall
    /// time spent communicating.
    fn step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime;

    /// The flat state buffers, each under the name a checkpoint saves it
    /// with (`m`, `v`, `worker_error`, ...): the one list of them. The
    /// driver moves them beside the parameters before each step (host or
    /// device) and saves and loads them by name.
    fn state(&mut self) -> Vec<(&'static str, &mut Flat)>;

    /// Whether steps split between ranks that share cores (see
    /// [`crate::shard`]) left [`FlatOptimizer::state`] current only in this
    /// rank's part.
    fn state_is_partial(&self) -> bool {
        false
    }

    /// Called after a checkpoint replaced every buffer of
    /// [`FlatOptimizer::state`]: a partial state is whole again.
    fn state_loaded(&mut self) {}

    /// Makes a partial state whole again: a collective, called by every
    /// rank at the same point (before saving).
    fn sync_state(&mut self, comm: &dyn Communicator) -> Result<(), OptimError> {
        let _ = comm;
        Ok(())
    }

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

    /// Whether every step leaves the parameters the same bits on every rank
    /// (the update applied to an allreduced quantity, or split and shared
    /// back). SLAMB's ranks step their own parameters between averagings,
    /// so the default is no.
    fn params_replicated(&self) -> bool {
        false
    }

    /// Which of the state is each rank's own, the rest being the same bits
    /// on every rank after every step (derived from allreduced quantities
    /// only). A checkpoint keeps the two apart, and ranks on one filesystem
    /// store the rest once. SLAMB's state follows its ranks' own
    /// parameters, as 0/1 Adam's does between synchronisations, so the
    /// default is all of it.
    fn own_state(&self) -> OwnState {
        OwnState::All
    }

    /// Called once after the last step (SLAMB averages the parameters, 0/1
    /// Adam synchronises its pending local steps).
    fn finish(&mut self, ctx: &StepContext, x: &mut FlatMut) -> CommTime {
        let _ = (ctx, x);
        Ok(Duration::ZERO)
    }
}

/// Replaces `x` with its mean over ranks (through the host from a device:
/// terse-comm's backends take host buffers), timing the call.
pub(crate) fn allreduce_mean(comm: &dyn Communicator, x: &mut FlatMut) -> CommTime {
    match x {
        FlatMut::Host(x) => {
            let start = Instant::now();
            comm.allreduce_f32(x, ReduceOp::Mean)?;
            Ok(start.elapsed())
        }
        FlatMut::Device(x) => allreduce_mean_device(comm, x),
    }
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

/// Which of a rule's state is each rank's own ([`FlatOptimizer::own_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnState {
    /// None of it: every rank holds the same bits (AdamW, LAMB, SGD).
    Nothing,
    /// These roles (the compressed rules' error buffers); the rest is
    /// alike on every rank.
    Roles(&'static [&'static str]),
    /// All of it.
    All,
}

impl OwnState {
    /// Whether the state buffer `role` is each rank's own.
    pub fn is_own(self, role: &str) -> bool {
        match self {
            OwnState::Nothing => false,
            OwnState::Roles(roles) => roles.contains(&role),
            OwnState::All => true,
        }
    }
}
