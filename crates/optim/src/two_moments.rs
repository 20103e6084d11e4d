//! The uncompressed moment rules' one driver: Adam and LAMB both keep m and
//! v of the averaged gradient, average it and share the parameters back
//! the same way (split between local ranks where the rule allows), and
//! differ only in the update between the two.

use terse_comm::Communicator;

use crate::span::{Span, SpanCache};
use crate::step::{CommTime, FlatOptimizer, StepContext};
use crate::{Flat, FlatMut, OptimError};

/// A rule's update of `x`, `m` and `v` from the averaged gradient `g` over
/// `span`; returns the time spent gathering partial sums.
pub(crate) type MomentUpdate<C> =
    fn(&C, &StepContext, &Span<'_>, &mut FlatMut, (&mut Flat, &mut Flat), &FlatMut) -> CommTime;

/// What one uncompressed moment rule says about its step.
pub(crate) trait MomentRule: Send {
    /// Its update between the gradient's mean and the parameters' share-back.
    const UPDATE: MomentUpdate<Self>;

    /// The weight decay the span's chunk table carries.
    fn weight_decay(&self) -> f64;

    /// Whether a step may be split between ranks that share cores (not
    /// when the update reads the whole gradient first).
    fn splits(&self) -> bool {
        true
    }
}

/// A moment rule's state: first and second moments of the averaged gradient.
pub struct TwoMoments<C> {
    config: C,
    m: Flat,
    v: Flat,
    spans: SpanCache,
    /// m and v are current only in this rank's part of a split step.
    partial: bool,
}

impl<C> TwoMoments<C> {
    /// Zeroed state for `d` parameters.
    pub fn new(config: C, d: usize) -> Self {
        Self {
            config,
            m: Flat::zeros(d),
            v: Flat::zeros(d),
            spans: SpanCache::default(),
            partial: false,
        }
    }
}

impl<C: MomentRule> FlatOptimizer for TwoMoments<C> {
    fn step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        let c = &self.config;
        let span = self.spans.span(ctx, x, c.weight_decay(), c.splits());
        let mut comm_time = span.mean_gradient(ctx.comm, g)?;
        comm_time += C::UPDATE(c, ctx, &span, x, (&mut self.m, &mut self.v), g)?;
        comm_time += span.share_back(ctx.comm, &mut [x])?;
        self.partial |= span.is_split();
        Ok(comm_time)
    }

    fn state(&mut self) -> Vec<(&'static str, &mut Flat)> {
        vec![("m", &mut self.m), ("v", &mut self.v)]
    }

    fn state_loaded(&mut self) {
        self.partial = false;
    }

    fn state_is_partial(&self) -> bool {
        self.partial
    }

    fn sync_state(&mut self, comm: &dyn Communicator) -> Result<(), OptimError> {
        let buffers = &mut [&mut self.m, &mut self.v];
        self.spans.gather_partial(comm, &mut self.partial, buffers)
    }

    fn params_replicated(&self) -> bool {
        true
    }

    fn own_state(&self) -> crate::OwnState {
        crate::OwnState::Nothing
    }
}
