//! DeepSpeed's `non_freeze` parameter groups of 1-bit Adam (its
//! `OnebitAdam`, `non_freeze: True` on a group): parameters that never
//! freeze. In the compression stage their gradient is averaged exactly
//! (an fp32 allreduce of those elements), their m and v are Adam's, and
//! they are left out of the compressed allreduce, whose chunks, scales and
//! errors then cover only the other elements. `uncompressed` differs: it
//! averages the momentum exactly but keeps v frozen.

use std::ops::Range;
use std::time::{Duration, Instant};

use burn::tensor::Tensor;
use terse_comm::{Communicator, ReduceOp};

use crate::device_flat::{into_handle, mean_over_ranks};
use crate::param_patterns::segment_ranges;
use crate::step::CommTime;
use crate::{Flat, FlatMut, OptimError, ParamLayout};

/// The elements of the parameters that never freeze.
#[derive(Debug, Clone, Default)]
pub(crate) struct NonFreeze {
    ranges: Vec<Range<usize>>,
    /// Scratch: the gradient over the ranges, packed.
    packed: Vec<f32>,
}

impl NonFreeze {
    /// The segments of `layout` that `patterns` name (`field`: the config
    /// field, for errors).
    pub(crate) fn new(
        patterns: &[String],
        field: &str,
        layout: &ParamLayout,
    ) -> Result<NonFreeze, OptimError> {
        Ok(NonFreeze {
            ranges: segment_ranges(patterns, field, layout)?,
            packed: Vec::new(),
        })
    }

    /// The ranges, sorted and disjoint.
    pub(crate) fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// Replaces `g` over the ranges with its mean over ranks (exact fp32),
    /// wherever it is; returns the time it took.
    pub(crate) fn mean_gradient(&mut self, comm: &dyn Communicator, g: &mut FlatMut) -> CommTime {
        if self.ranges.is_empty() || comm.world_size() == 1 {
            return Ok(Duration::ZERO);
        }
        let start = Instant::now();
        match g {
            FlatMut::Host(g) => {
                self.packed.clear();
                for r in &self.ranges {
                    self.packed.extend_from_slice(&g[r.clone()]);
                }
                comm.allreduce_f32(&mut self.packed, ReduceOp::Mean)?;
                let mut at = 0;
                for r in &self.ranges {
                    g[r.clone()].copy_from_slice(&self.packed[at..at + r.len()]);
                    at += r.len();
                }
            }
            FlatMut::Device(g) => {
                // Packed and averaged on the device: summed by NCCL in GPU
                // memory on CUDA, else through the host.
                let mut t = g.tensor();
                let parts: Vec<Tensor<1>> = self
                    .ranges
                    .iter()
                    .map(|r| t.clone().slice(r.clone()))
                    .collect();
                let packed_len = self.ranges.iter().map(|r| r.len()).sum();
                let packed = into_handle(Tensor::cat(parts, 0));
                let mean = mean_over_ranks(comm, g.client(), &packed, packed_len)?
                    .expect("several ranks average");
                let mean = g.wrap(mean, packed_len);
                let mut at = 0;
                for r in &self.ranges {
                    t = t.slice_assign(r.clone(), mean.clone().slice(at..at + r.len()));
                    at += r.len();
                }
                g.swap_handle(into_handle(t));
            }
        }
        Ok(start.elapsed())
    }

    /// `v = β2·v + (1-β2)·g²` over the ranges (Adam's second moment, from
    /// the averaged gradient).
    pub(crate) fn update_variance(&self, beta_2: f64, v: &mut Flat, g: &FlatMut<'_>) {
        if self.ranges.is_empty() {
            return;
        }
        let (b2, one_minus) = (beta_2 as f32, (1.0 - beta_2) as f32);
        match g {
            FlatMut::Host(g) => {
                let v = v.host_mut();
                for r in &self.ranges {
                    for (v, &g) in v[r.clone()].iter_mut().zip(&g[r.clone()]) {
                        *v = b2 * *v + one_minus * g * g;
                    }
                }
            }
            FlatMut::Device(g) => {
                let gt = g.tensor();
                let len = v.len();
                let mut vt = g.wrap(v.take_handle(), len);
                for r in &self.ranges {
                    let (vs, gs) = (vt.clone().slice(r.clone()), gt.clone().slice(r.clone()));
                    let updated = vs * b2 + gs.clone() * gs * one_minus;
                    vt = vt.slice_assign(r.clone(), updated);
                }
                v.put_handle(into_handle(vt));
            }
        }
    }
}
