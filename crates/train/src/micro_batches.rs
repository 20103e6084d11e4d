//! A rank's share of a step: its micro-batches' forward and backward, the
//! gradients summed into the flat buffer in micro-batch order.
//!
//! With more than one thread and more than one micro-batch, the
//! micro-batches run in lanes, several at once, each lane in its own rayon
//! pool of threads ÷ lanes threads and on its own replica of the model
//! (the same values under fresh leaves, so each backward is a graph of its
//! own that no other lane locks). At BERT-mini's micro-batch of 4 one op
//! split over two threads gains little, so one rank with 2 threads trailed
//! 2 ranks of one thread each (0.82–0.91 of them, `cargo xtask bench
//! workers`); two lanes of one thread work as those two ranks do. The
//! gradients are still added in micro-batch order, dropout masks are a
//! function of the micro-batch, and a micro-batch's gradient has the same
//! bits on any number of threads (`crates/cli/tests/thread_count.rs`), so
//! lanes change no result. Off the CPU micro-batches run one after another.

use std::time::Instant;

use burn::tensor::{Device, FloatDType, Gradients, Tensor};
use terse_fused::{DropoutStream, with_dropout_stream, with_half};
use terse_kernels::host_reads;
use terse_optim::{FlatModel, with_fresh_leaves};

use crate::TrainError;
use crate::metrics::ms;
use crate::task::Task;

/// The pools micro-batches run in, one per lane (none: one after another).
pub(crate) struct Lanes {
    pools: Vec<rayon::ThreadPool>,
}

impl Lanes {
    /// Lanes for `micro_batches` per step on the current pool's threads:
    /// as many as both allow, the threads split evenly; `None` where there
    /// is one of either, or `cpu` is false (the model lives elsewhere).
    pub(crate) fn for_run(micro_batches: usize, cpu: bool) -> Result<Option<Lanes>, TrainError> {
        let threads = rayon::current_num_threads();
        let lanes = threads.min(micro_batches);
        if !cpu || lanes < 2 {
            return Ok(None);
        }
        let pools = (0..lanes)
            .map(|lane| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads / lanes)
                    .thread_name(move |i| format!("terse-lane-{lane}-{i}"))
                    .build()
                    .map_err(|e| TrainError::InvalidRun {
                        field: "threads",
                        reason: format!("cannot start a micro-batch lane: {e}"),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Some(Lanes { pools }))
    }
}

/// One rank's part of a step.
pub(crate) struct LocalGradient {
    /// Each micro-batch's loss, in micro-batch order, where the forward
    /// pass left it (on a device: read by [`LocalGradient::mean_loss`]
    /// once the step's work is queued, not after each backward pass).
    losses: Vec<Tensor<1>>,
    /// Time in forward passes (with lanes: of the lane that took longest
    /// in each group).
    pub(crate) forward_ms: f64,
    /// The rest of the micro-batches' wall time (backward, gradient copies).
    pub(crate) backward_ms: f64,
}

impl LocalGradient {
    /// The mean loss over the micro-batches (summed in f64 in micro-batch
    /// order). On a device this waits for the work queued so far: one
    /// read for all the micro-batches.
    pub(crate) fn mean_loss(&self) -> f64 {
        host_reads::note();
        let values = match self.losses.as_slice() {
            [one] => one.clone().into_data(),
            all => Tensor::cat(all.to_vec(), 0).into_data(),
        };
        let sum = values.iter::<f32>().fold(0.0f64, |s, v| s + f64::from(v));
        sum / self.losses.len() as f64
    }
}

/// Where a micro-batch comes from, which dropout masks it draws and how
/// it computes.
pub(crate) struct StepPlace {
    pub(crate) seed: u64,
    pub(crate) t: u64,
    pub(crate) epoch: u64,
    pub(crate) rank: usize,
    /// The half type of the forward's matmuls (`train.precision`).
    pub(crate) half: Option<FloatDType>,
    /// What the loss is multiplied by before the backward (fp16's loss
    /// scale; 1 otherwise). The reported loss is the unscaled one.
    pub(crate) loss_scale: f32,
}

/// One micro-batch's forward and backward: its gradients, its loss (not
/// read: a read would wait for the backward pass) and the time each pass
/// took to queue.
fn run_micro_batch<T: Task>(
    task: &T,
    model: &T::Model,
    examples: &[usize],
    micro: usize,
    at: &StepPlace,
    device: &Device,
) -> Result<(Gradients, Tensor<1>, f64, f64), TrainError> {
    let clock = Instant::now();
    let stream = DropoutStream::new(at.seed, at.t, at.rank, micro);
    let loss = with_dropout_stream(stream, || {
        with_half(at.half, || task.loss(model, examples, at.epoch, device))
    })?;
    let forward_ms = ms(clock);
    let clock = Instant::now();
    let grads = if at.loss_scale == 1.0 {
        loss.backward()
    } else {
        loss.clone().mul_scalar(at.loss_scale).backward()
    };
    Ok((grads, loss.detach(), forward_ms, ms(clock)))
}

/// The rank's gradient for `share` (micro-batches of `micro_batch`
/// examples) into `flat`, averaged over the micro-batches.
#[allow(clippy::too_many_arguments)]
pub(crate) fn local_gradient<T: Task>(
    task: &T,
    model: &mut T::Model,
    share: &[usize],
    micro_batch: usize,
    at: &StepPlace,
    device: &Device,
    flat: &mut FlatModel,
    lanes: Option<&Lanes>,
) -> Result<LocalGradient, TrainError> {
    let micro_batches: Vec<&[usize]> = share.chunks(micro_batch).collect();
    let count = micro_batches.len();
    let (mut forward_ms, mut backward_ms) = (0.0, 0.0);
    let mut losses = Vec::with_capacity(count);
    match lanes {
        Some(lanes) if count > 1 => {
            let width = lanes.pools.len();
            // Lane 0 steps `model`; the others the same values under leaves
            // of their own, without copying them (a write-back of BERT-Tiny's
            // 4.4M parameters takes one rank ~1 ms).
            let mut copies: Vec<T::Model> = (1..width.min(count))
                .map(|_| with_fresh_leaves(model.clone()))
                .collect();
            for (group, batches) in micro_batches.chunks(width).enumerate() {
                let clock = Instant::now();
                let first = group * width;
                let outcomes = run_group(
                    task,
                    &mut *model,
                    &mut copies,
                    batches,
                    first,
                    at,
                    device,
                    lanes,
                );
                let group_forward = outcomes
                    .iter()
                    .map(|o| o.as_ref().map_or(0.0, |(_, _, f, _)| *f))
                    .fold(0.0, f64::max);
                for (lane, outcome) in outcomes.into_iter().enumerate() {
                    let (mut grads, loss, _, _) = outcome?;
                    let micro = first + lane;
                    let replica = if lane == 0 {
                        &*model
                    } else {
                        &copies[lane - 1]
                    };
                    flat.add_grads(replica, &mut grads, micro == 0)?;
                    losses.push(loss);
                }
                forward_ms += group_forward;
                backward_ms += ms(clock) - group_forward;
            }
        }
        _ => {
            for (micro, examples) in micro_batches.iter().enumerate() {
                let (mut grads, loss, forward, backward) =
                    run_micro_batch(task, model, examples, micro, at, device)?;
                let clock = Instant::now();
                flat.add_grads(model, &mut grads, micro == 0)?;
                losses.push(loss);
                forward_ms += forward;
                backward_ms += backward + ms(clock);
            }
        }
    }
    if count > 1 {
        flat.scale_grad(1.0 / count as f32);
    }
    Ok(LocalGradient {
        losses,
        forward_ms,
        backward_ms,
    })
}

type Outcome = Result<(Gradients, Tensor<1>, f64, f64), TrainError>;

/// Micro-batches `first..first + batches.len()` at once, one per lane:
/// lane 0 on this thread, the others on threads of their own.
#[allow(clippy::too_many_arguments)]
fn run_group<T: Task>(
    task: &T,
    model: &mut T::Model,
    copies: &mut [T::Model],
    batches: &[&[usize]],
    first: usize,
    at: &StepPlace,
    device: &Device,
    lanes: &Lanes,
) -> Vec<Outcome> {
    std::thread::scope(|scope| {
        let others: Vec<_> = batches
            .iter()
            .enumerate()
            .skip(1)
            .zip(copies.iter_mut())
            .map(|((lane, examples), copy)| {
                let pool = &lanes.pools[lane];
                // `&mut` only to move the copy to its thread (a model need
                // not be Sync).
                scope.spawn(move || {
                    pool.install(move || {
                        run_micro_batch(task, &*copy, examples, first + lane, at, device)
                    })
                })
            })
            .collect();
        let mut outcomes = vec![
            lanes.pools[0]
                .install(move || run_micro_batch(task, &*model, batches[0], first, at, device)),
        ];
        // A lane's panic is the rank's (the launcher reports it).
        for handle in others {
            outcomes.push(
                handle
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p)),
            );
        }
        outcomes
    })
}
