//! Where a step's passes run, and over which part of the buffers: host
//! slices — every parallel chunk, or this rank's run of them when ranks
//! that share cores split the step ([`crate::shard`]) — or the chunk table
//! of the cubecl device the parameters live on (never split).
//!
//! A rule takes its span at the top of each step and hands it to every
//! pass ([`crate::pass`]), which runs its host loop or its kernel
//! accordingly; the span also does what a split adds around the passes:
//! the gradient reduce-scattered instead of allreduced, the parts shared
//! back afterwards, per-chunk partial sums combined across ranks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytemuck::Pod;
use cubecl::prelude::*;
use rayon::iter::{IndexedParallelIterator, IntoParallelIterator};
use terse_comm::{Communicator, ReduceOp};
use terse_kernels::device::optim::DeviceChunks;

use crate::device_flat::{allreduce_mean_device, chunk_table, mean_over_ranks};
use crate::shard::{
    Shard, Unit, gather_partial_state, share_unit_words, unit_slices, unit_slices_mut,
};
use crate::step::CommTime;
use crate::step::StepContext;
use crate::storage::Buffer;
use crate::{Flat, FlatMut, OptimError, ParamLayout};

/// Where one step's passes run.
pub(crate) struct Span<'a> {
    /// The segments of the buffers.
    pub(crate) layout: &'a ParamLayout,
    pub(crate) on: On<'a>,
}

/// Host or device.
pub(crate) enum On<'a> {
    /// Host slices, over the shard's units of this rank.
    Host(Arc<Shard>),
    /// The parameters' device, over its chunk table.
    Device {
        client: Client,
        chunks: &'a DeviceChunks,
    },
}

/// What a rule keeps between steps to take its span: the host split and
/// the device chunk table, each built once.
#[derive(Default)]
pub(crate) struct SpanCache {
    shard: Option<Arc<Shard>>,
    chunks: Option<DeviceChunks>,
}

impl SpanCache {
    /// The span of step `ctx` for parameters `x`; `weight_decay` is what
    /// decaying segments decay by (the device kernels read it from the
    /// chunk table). `splittable`: whether the step may be split between
    /// ranks that share cores (a step that reads a whole buffer afterwards,
    /// such as an automatic freeze's ‖v‖₁, may not).
    pub(crate) fn span<'a>(
        &'a mut self,
        ctx: &StepContext<'a>,
        x: &FlatMut<'_>,
        weight_decay: f64,
        splittable: bool,
    ) -> Span<'a> {
        let on = match x.device() {
            None => On::Host(Shard::for_step(&mut self.shard, ctx, splittable)),
            Some(x) => On::Device {
                client: x.client().clone(),
                chunks: chunk_table(&mut self.chunks, x, ctx.layout, weight_decay),
            },
        };
        Span {
            layout: ctx.layout,
            on,
        }
    }

    /// Makes a state that split steps left `partial` whole again: every
    /// rank's part of `buffers` shared with the others (a collective), the
    /// flag cleared; nothing when it is not partial.
    pub(crate) fn gather_partial(
        &self,
        comm: &dyn Communicator,
        partial: &mut bool,
        buffers: &mut [&mut Flat],
    ) -> Result<(), OptimError> {
        if !*partial {
            // Nothing to gather (and a device step is never split).
            return Ok(());
        }
        let mut host: Vec<&mut [f32]> = buffers.iter_mut().map(|b| b.host_mut()).collect();
        gather_partial_state(comm, self.shard.as_deref(), partial, &mut host)
    }
}

/// One of this rank's host units in a pass: its segment, and its slices of
/// the buffers the pass writes and of those it reads.
pub(crate) type UnitSlices<'b, const W: usize, const R: usize> =
    (usize, [&'b mut [f32]; W], [&'b [f32]; R]);

/// A pass's per-chunk partial results: this rank's units' on the host, or
/// already one per segment (the device kernels combine them).
pub(crate) enum Partials<T> {
    Units(Vec<T>),
    Segments(Vec<T>),
}

impl Span<'_> {
    /// Whether the step is split between ranks that share cores.
    pub(crate) fn is_split(&self) -> bool {
        matches!(&self.on, On::Host(shard) if shard.is_split())
    }

    /// The units this rank's host passes cover.
    ///
    /// # Panics
    /// On a device span.
    pub(crate) fn units(&self) -> &[Unit] {
        match &self.on {
            On::Host(shard) => shard.mine(),
            On::Device { .. } => panic!("a device step has no host units"),
        }
    }

    /// This rank's host units, in parallel, each with its slices of the
    /// whole buffers `writes` and `reads`: the loop of every host pass that
    /// goes unit by unit, whatever buffers it takes. An indexed iterator, so
    /// what a pass collects from it comes back in unit order.
    ///
    /// # Panics
    /// On a device span.
    pub(crate) fn unit_slices<'b, const W: usize, const R: usize>(
        &self,
        writes: [&'b mut [f32]; W],
        reads: [&'b [f32]; R],
    ) -> impl IndexedParallelIterator<Item = UnitSlices<'b, W, R>> {
        let units = self.units();
        let mut writes = writes.map(|b| unit_slices_mut(b, units).into_iter());
        let mut reads = reads.map(|b| unit_slices(b, units).into_iter());
        let each = "a slice per unit";
        let slices: Vec<UnitSlices<'b, W, R>> = units
            .iter()
            .map(|unit| {
                let w = writes.each_mut().map(|s| s.next().expect(each));
                (
                    unit.segment,
                    w,
                    reads.each_mut().map(|s| s.next().expect(each)),
                )
            })
            .collect();
        slices.into_par_iter()
    }

    /// The host split.
    ///
    /// # Panics
    /// On a device span.
    pub(crate) fn shard(&self) -> &Shard {
        match &self.on {
            On::Host(shard) => shard,
            On::Device { .. } => panic!("a device step has no host split"),
        }
    }

    /// Replaces this rank's local gradient `g` with its mean over ranks (in
    /// this rank's part only, when split): the communication of the
    /// uncompressed steps. Returns the time it took.
    pub(crate) fn mean_gradient(&self, comm: &dyn Communicator, g: &mut FlatMut) -> CommTime {
        match &self.on {
            On::Host(shard) => {
                let clock = Instant::now();
                if shard.is_split() {
                    comm.reduce_scatter_mean_f32(g.host_mut(), &shard.ranges())?;
                } else {
                    comm.allreduce_f32(g.host_mut(), ReduceOp::Mean)?;
                }
                Ok(clock.elapsed())
            }
            On::Device { .. } => allreduce_mean_device(comm, g.on_device()),
        }
    }

    /// Replaces the state buffer `b` with its mean over ranks, whole, in
    /// fp32 (through the host from a device).
    pub(crate) fn mean_of_state(
        &self,
        comm: &dyn Communicator,
        b: &mut Flat,
    ) -> Result<(), OptimError> {
        match &self.on {
            On::Host(_) => Ok(comm.allreduce_f32(b.host_mut(), ReduceOp::Mean)?),
            On::Device { client, .. } => {
                if let Some(mean) = mean_over_ranks(comm, client, b.handle(), b.len())? {
                    b.put_handle(mean);
                }
                Ok(())
            }
        }
    }

    /// After a split step, every rank's part of each of `buffers` copied
    /// to the others; nothing otherwise. Returns the time it took.
    pub(crate) fn share_back(
        &self,
        comm: &dyn Communicator,
        buffers: &mut [&mut dyn Buffer],
    ) -> CommTime {
        if !self.is_split() {
            return Ok(Duration::ZERO);
        }
        let mut parts: Vec<&mut [f32]> = buffers.iter_mut().map(|b| b.host_mut()).collect();
        self.shard().share_parts(comm, &mut parts)
    }

    /// One value per segment from a pass's partials: this rank's units'
    /// gathered from every rank when split, then folded per segment in
    /// unit order from `zero` with `add` (the order the unsplit step
    /// folds them in, so the bits are the same). Returns the time spent
    /// gathering.
    pub(crate) fn per_segment<T: Pod>(
        &self,
        comm: &dyn Communicator,
        partials: Partials<T>,
        zero: T,
        add: impl Fn(T, T) -> T,
    ) -> Result<(Vec<T>, Duration), OptimError> {
        let mine = match partials {
            Partials::Segments(values) => return Ok((values, Duration::ZERO)),
            Partials::Units(values) => values,
        };
        let shard = self.shard();
        let mut time = Duration::ZERO;
        let all = if shard.is_split() {
            let clock = Instant::now();
            let words = size_of::<T>() / size_of::<f32>();
            let shared = share_unit_words(comm, shard, bytemuck::cast_slice(&mine), words)?;
            time = clock.elapsed();
            bytemuck::pod_collect_to_vec(&shared)
        } else {
            mine
        };
        let mut sums = vec![zero; self.layout.segments().len()];
        for (unit, value) in shard.units().iter().zip(all) {
            sums[unit.segment] = add(sums[unit.segment], value);
        }
        Ok((sums, time))
    }
}
