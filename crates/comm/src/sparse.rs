//! SLAMB's sparse allreduce: only the values the step's mask selects travel
//! (no indices: every rank computes the same mask from the seed), averaged
//! with a plain fp32 allreduce and written back in place.

use std::ops::Range;

use terse_kernels::mask::{Mask, Selection};

use crate::{CommError, Communicator, ReduceOp};

/// A mask, the ranges always synchronised, and scratch for the values.
#[derive(Debug, Clone)]
pub struct SparseAllreduce {
    mask: Mask,
    always: Vec<Range<usize>>,
    values: Vec<f32>,
    selection: Selection,
}

impl SparseAllreduce {
    /// Synchronise what `mask` selects plus everything inside `always`
    /// (SLAMB: segments below `always_sync_below` elements).
    pub fn new(mask: Mask, mut always: Vec<Range<usize>>) -> SparseAllreduce {
        always.sort_by_key(|r| r.start);
        SparseAllreduce {
            mask,
            always,
            values: Vec::new(),
            selection: Selection::default(),
        }
    }

    /// Averages over ranks the elements of `buf` selected at step `t`; the
    /// others keep this rank's values. Returns the selection, which the
    /// optimizer needs for its masked norms.
    pub fn allreduce_mean(
        &mut self,
        comm: &dyn Communicator,
        t: u64,
        buf: &mut [f32],
    ) -> Result<&Selection, CommError> {
        self.selection = Selection::new(&self.mask, t, buf.len(), &self.always);
        self.values.resize(self.selection.len(), 0.0);
        self.selection.gather(buf, &mut self.values);
        comm.allreduce_f32(&mut self.values, ReduceOp::Mean)?;
        self.selection.scatter(&self.values, buf);
        Ok(&self.selection)
    }
}
