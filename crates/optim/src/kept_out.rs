//! The compression stage's allreduce with some parameters kept out of
//! compression (the `uncompressed` field of 1-bit Adam and 1-bit LAMB).
//!
//! The segments the config names are averaged with a plain fp32 allreduce,
//! exactly; every other element goes through the 1-bit compressed allreduce,
//! whose chunks, scales and error buffers then cover only those elements, so
//! a kept-out parameter neither receives quantisation error nor skews its
//! neighbours' scales. With nothing kept out (the default) the buffer is
//! compressed in place with no copy.

use std::ops::Range;
use std::time::Instant;

use burn::tensor::Tensor;
use cubecl::server::Handle;
use terse_comm::{Communicator, CompressedAllreduce, ReduceOp};
use terse_kernels::device_messages::DeviceMessages;

use crate::device_flat::{into_handle, mean_over_ranks, read_f32, upload_f32};
use crate::momentum_mask::MomentumMask;
use crate::param_patterns::segment_ranges;
use crate::span::Span;
use crate::step::CommTime;
use crate::{DeviceFlat, Flat, FlatMut, OneBitAllreduceConfig, OptimError, ParamLayout};

/// The compressed allreduce's error feedback on one rank, part of a 1-bit
/// rule's state (saved as `worker_error` and `server_error`): both beside
/// the momentum (on the device in a device run, where the worker and the
/// server steps run as kernels).
pub(crate) struct ErrorFeedback {
    pub(crate) worker: Flat,
    pub(crate) server: Flat,
}

impl ErrorFeedback {
    /// The state roles the errors are saved as: each rank's own (its
    /// worker error is of its gradient, its server error of its chunk).
    pub(crate) const ROLES: crate::OwnState =
        crate::OwnState::Roles(&["worker_error", "server_error"]);

    /// The 1-bit compressed mean over ranks of `buf` (`len` f32 on `like`'s
    /// device) with these errors, kept on that device: every phase runs as
    /// device kernels and the messages stay there too (terse-kernels'
    /// `DeviceMessages`), exchanged by their device addresses where the
    /// communicator moves GPU memory (NCCL on CUDA), else through the host
    /// as packed signs and scales. The buffer comes back and the errors
    /// are updated in place, whatever the outcome.
    fn mean_on_device(
        &mut self,
        allreduce: &mut CompressedAllreduce,
        comm: &dyn Communicator,
        like: &DeviceFlat,
        buf: Handle,
        len: usize,
    ) -> (Handle, Result<(), OptimError>) {
        if !allreduce.compresses() {
            return (buf, Ok(()));
        }
        let client = like.client();
        if allreduce.host_only() {
            // DeepSpeed's geometry has no device kernels: the buffer and its
            // (padded) errors go through the host and come back.
            let mut host = read_f32(client, &buf, len);
            let mut worker = self.worker.read().into_owned();
            let mut server = self.server.read().into_owned();
            let result = allreduce
                .allreduce_mean(comm, &mut host, &mut worker, &mut server)
                .map_err(OptimError::from);
            self.worker.write(&worker);
            self.server.write(&server);
            return (upload_f32(client, &host), result);
        }
        let (worker_len, server_len) = (self.worker.len(), self.server.len());
        let mut messages = DeviceMessages::new(
            client.clone(),
            (buf, self.worker.take_handle(), worker_len),
            (self.server.take_handle(), server_len),
        );
        let result = allreduce
            .allreduce_mean_in(comm, &mut messages)
            .map_err(OptimError::from);
        let (buf, worker_error, server_error) = messages.into_parts();
        self.worker.put_handle(worker_error);
        self.server.put_handle(server_error);
        (buf, result)
    }
}

/// A compressed allreduce over a flat buffer minus the kept-out ranges.
pub(crate) struct KeptOutAllreduce {
    compressed: CompressedAllreduce,
    /// Sorted, disjoint ranges of the flat buffer left out of compression.
    kept_out: Vec<Range<usize>>,
    /// Per kept-out range: averaged in fp32 (`uncompressed`), or left as
    /// it is (skipped).
    averaged: Vec<bool>,
    /// Scratch: the compressed elements, packed.
    packed: Vec<f32>,
    /// Scratch: the kept-out elements, packed.
    exact: Vec<f32>,
    /// Coordinates set to zero in every mean (DeepSpeed's `exp_avg_mask`).
    mask: MomentumMask,
}

impl KeptOutAllreduce {
    /// Keeps out the segments of `layout` that `config.uncompressed` names
    /// (a parameter path, or a prefix followed by `*`) and compresses the
    /// rest with `config`'s scales; `name` is the optimizer's, for errors,
    /// which list the model's parameter paths.
    ///
    /// # Errors
    /// A pattern that names no parameter (a typo would otherwise silently
    /// compress what the user meant to keep out).
    pub(crate) fn new(
        config: &OneBitAllreduceConfig,
        name: &str,
        layout: &ParamLayout,
        comm: &dyn Communicator,
    ) -> Result<Self, OptimError> {
        Self::skipping(config, name, layout, &[], comm)
    }

    /// [`KeptOutAllreduce::new`] with the ranges `skipped` left out of it
    /// altogether: neither compressed nor averaged (1-bit Adam's
    /// `non_freeze` parameters, whose momentum is already the same on
    /// every rank). They must not overlap the kept-out segments.
    pub(crate) fn skipping(
        config: &OneBitAllreduceConfig,
        name: &str,
        layout: &ParamLayout,
        skipped: &[Range<usize>],
        comm: &dyn Communicator,
    ) -> Result<Self, OptimError> {
        let field = format!("{name}.uncompressed");
        let averaged = segment_ranges(&config.uncompressed, &field, layout)?;
        if let Some(r) = averaged
            .iter()
            .find(|r| skipped.iter().any(|s| overlaps(r, s)))
        {
            return Err(OptimError::InvalidConfig {
                field,
                value: format!("the elements {r:?}"),
                reason: "are also in non_freeze: a parameter is kept out of compression \
                         (v frozen) or never freezes, not both",
            });
        }
        let mut kept_out: Vec<(Range<usize>, bool)> = averaged
            .into_iter()
            .map(|r| (r, true))
            .chain(skipped.iter().map(|r| (r.clone(), false)))
            .filter(|(r, _)| !r.is_empty())
            .collect();
        kept_out.sort_by_key(|(r, _)| r.start);
        let (kept_out, averaged): (Vec<Range<usize>>, Vec<bool>) = kept_out.into_iter().unzip();
        let kept: usize = kept_out.iter().map(|r| r.len()).sum();
        let compressed = CompressedAllreduce::new(layout.len() - kept, comm, config.options())?;
        let mask = MomentumMask::new(
            &config.momentum_mask,
            &format!("{name}.momentum_mask"),
            layout,
        )?;
        Ok(Self {
            compressed,
            kept_out,
            averaged,
            packed: Vec::new(),
            exact: Vec::new(),
            mask,
        })
    }

    /// Zeroed errors for this allreduce's compressed part.
    pub(crate) fn zeroed_errors(&self) -> ErrorFeedback {
        let (worker, server) = self.compressed.zeroed_errors();
        ErrorFeedback {
            worker: Flat::from_vec(worker),
            server: Flat::from_vec(server),
        }
    }

    /// Replaces `buf` with its mean over ranks: 1-bit compressed with error
    /// feedback `errors` (on the host), the kept-out ranges exact.
    fn allreduce_mean(
        &mut self,
        comm: &dyn Communicator,
        buf: &mut [f32],
        errors: &mut ErrorFeedback,
    ) -> Result<(), OptimError> {
        let (worker, server) = (errors.worker.host_mut(), errors.server.host_mut());
        if self.kept_out.is_empty() {
            return Ok(self.compressed.allreduce_mean(comm, buf, worker, server)?);
        }
        self.packed.clear();
        self.exact.clear();
        let mut at = 0;
        for (range, &averaged) in self.kept_out.iter().zip(&self.averaged) {
            self.packed.extend_from_slice(&buf[at..range.start]);
            if averaged {
                self.exact.extend_from_slice(&buf[range.clone()]);
            }
            at = range.end;
        }
        self.packed.extend_from_slice(&buf[at..]);
        self.compressed
            .allreduce_mean(comm, &mut self.packed, worker, server)?;
        if self.averaged.contains(&true) {
            comm.allreduce_f32(&mut self.exact, ReduceOp::Mean)?;
        }
        let (mut at, mut packed, mut exact) = (0, 0, 0);
        for (range, &averaged) in self.kept_out.iter().zip(&self.averaged) {
            let before = range.start - at;
            buf[at..range.start].copy_from_slice(&self.packed[packed..packed + before]);
            if averaged {
                buf[range.clone()].copy_from_slice(&self.exact[exact..exact + range.len()]);
                exact += range.len();
            }
            (packed, at) = (packed + before, range.end);
        }
        buf[at..].copy_from_slice(&self.packed[packed..]);
        Ok(())
    }

    /// [`KeptOutAllreduce::allreduce_mean`] for a rank that reads only
    /// `wanted` of the mean ([`CompressedAllreduce::allreduce_mean_part`]);
    /// with ranges kept out, the whole mean.
    fn allreduce_mean_part(
        &mut self,
        comm: &dyn Communicator,
        buf: &mut [f32],
        errors: &mut ErrorFeedback,
        wanted: Range<usize>,
    ) -> Result<(), OptimError> {
        if self.kept_out.is_empty() {
            let (worker, server) = (errors.worker.host_mut(), errors.server.host_mut());
            return Ok(self
                .compressed
                .allreduce_mean_part(comm, buf, worker, server, wanted)?);
        }
        self.allreduce_mean(comm, buf, errors)
    }

    /// The compressed mean of `buf` (a rule's momentum) over ranks, with
    /// `errors`, its masked coordinates zeroed, wherever it is: on the host only this rank's part of
    /// `span` is read afterwards (the rest may keep its own values), on a
    /// device (`like`: the parameters there) all of it.
    pub(crate) fn mean_of(
        &mut self,
        comm: &dyn Communicator,
        span: &Span<'_>,
        like: Option<&DeviceFlat>,
        buf: &mut Flat,
        errors: &mut ErrorFeedback,
    ) -> Result<(), OptimError> {
        match like {
            None => {
                let wanted = span.shard().my_range();
                self.allreduce_mean_part(comm, buf.host_mut(), errors, wanted)?;
            }
            Some(like) => {
                let len = buf.len();
                let (mean, result) =
                    self.allreduce_mean_device(comm, like, buf.take_handle(), len, errors);
                buf.put_handle(mean);
                result?;
            }
        }
        self.mask.apply_to_state(buf, like);
        Ok(())
    }

    /// [`KeptOutAllreduce::mean_of`] a whole buffer `b`, wherever it is:
    /// 1-bit Adam's naive baseline's gradient, 0/1 Adam's gradient in its
    /// variance stage and, at a synchronisation, its accumulated updates
    /// held in the parameters' buffer. Returns the time it took.
    pub(crate) fn mean_of_whole(
        &mut self,
        comm: &dyn Communicator,
        b: &mut FlatMut,
        errors: &mut ErrorFeedback,
    ) -> CommTime {
        let start = Instant::now();
        match b {
            FlatMut::Device(b) => {
                let len = b.len();
                let buf = b.swap_handle(b.client().empty(size_of::<f32>()));
                // Says where the mean goes (client, device, dtype); taken
                // after the swap, so it shares no storage with `buf`.
                let like = b.clone();
                let (mean, result) = self.allreduce_mean_device(comm, &like, buf, len, errors);
                b.swap_handle(mean);
                result?;
            }
            FlatMut::Host(b) => self.allreduce_mean(comm, b, errors)?,
        }
        self.mask.apply(b);
        Ok(start.elapsed())
    }

    /// [`KeptOutAllreduce::allreduce_mean`] of `buf` (`len` f32 on `like`'s
    /// device) with `errors` (both on that device): the compressed
    /// elements packed on the device and averaged there by the worker and
    /// server kernels, the kept-out ranges averaged in fp32 (by NCCL on the
    /// GPU, else through the host), in the host path's order (so the same
    /// bytes travel). The
    /// buffer comes back as a handle (a new one when ranges are kept out),
    /// the errors updated in place, whatever the outcome.
    fn allreduce_mean_device(
        &mut self,
        comm: &dyn Communicator,
        like: &DeviceFlat,
        buf: Handle,
        len: usize,
        errors: &mut ErrorFeedback,
    ) -> (Handle, Result<(), OptimError>) {
        if self.kept_out.is_empty() {
            return errors.mean_on_device(&mut self.compressed, comm, like, buf, len);
        }
        let whole = like.wrap(buf, len);
        let kept: usize = self.kept_out.iter().map(|r| r.len()).sum();
        let averaged_len: usize = self
            .kept_out
            .iter()
            .zip(&self.averaged)
            .filter(|(_, averaged)| **averaged)
            .map(|(r, _)| r.len())
            .sum();
        let packed_len = len - kept;
        let (mut packed, mut exact, mut at) = (Vec::new(), Vec::new(), 0);
        for (range, &averaged) in self.kept_out.iter().zip(&self.averaged) {
            if range.start > at {
                packed.push(whole.clone().slice(at..range.start));
            }
            if averaged {
                exact.push(whole.clone().slice(range.clone()));
            }
            at = range.end;
        }
        if at < len {
            packed.push(whole.clone().slice(at..len));
        }
        let exact = (!exact.is_empty()).then(|| into_handle(Tensor::cat(exact, 0)));
        let (packed, result) = if packed.is_empty() {
            // Everything kept out: the compressed allreduce of nothing still
            // runs, as on the host (its errors are empty).
            let result = self
                .compressed
                .allreduce_mean(comm, &mut [], &mut [], &mut []);
            (None, result.map_err(OptimError::from))
        } else {
            let packed = into_handle(Tensor::cat(packed, 0));
            let (packed, result) =
                errors.mean_on_device(&mut self.compressed, comm, like, packed, packed_len);
            (Some(like.wrap(packed, packed_len)), result)
        };
        // The kept-out ranges' fp32 mean, after the compressed allreduce as
        // on the host: on the GPU through NCCL, else through the host.
        let result = result.and_then(|()| match exact {
            Some(exact) => {
                Ok(mean_over_ranks(comm, like.client(), &exact, averaged_len)?.unwrap_or(exact))
            }
            None => Ok(upload_f32(like.client(), &[])),
        });
        let exact = match result {
            Ok(exact) => like.wrap(exact, averaged_len),
            Err(e) => return (into_handle(whole), Err(e)),
        };
        let (mut parts, mut at, mut p, mut e) = (Vec::new(), 0, 0, 0);
        for (range, &averaged) in self.kept_out.iter().zip(&self.averaged) {
            let before = range.start - at;
            if let (Some(packed), true) = (&packed, before > 0) {
                parts.push(packed.clone().slice(p..p + before));
            }
            if averaged {
                parts.push(exact.clone().slice(e..e + range.len()));
                e += range.len();
            } else {
                parts.push(whole.clone().slice(range.clone()));
            }
            (p, at) = (p + before, range.end);
        }
        drop(whole);
        if let (Some(packed), true) = (&packed, p < packed_len) {
            parts.push(packed.clone().slice(p..packed_len));
        }
        (into_handle(Tensor::cat(parts, 0)), Ok(()))
    }
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}
