//! The one-rank communicator: every collective is the identity (or a copy);
//! the typed methods' argument checks still run, so a bug shows up on one
//! rank first.

use crate::communicator::Width;
use crate::traffic::TrafficMeter;
use crate::{CommError, Communicator, ReduceOp};

/// A world of one rank.
#[derive(Debug, Default)]
pub struct SingleRank {
    meter: TrafficMeter,
}

impl SingleRank {
    /// The world of this process alone.
    pub fn new() -> SingleRank {
        SingleRank::default()
    }
}

impl Communicator for SingleRank {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn backend(&self) -> &'static str {
        "single"
    }

    fn meter(&self) -> &TrafficMeter {
        &self.meter
    }

    fn abort(&self, _reason: &str) {
        // No other rank to tell.
    }

    fn allreduce_f32_raw(&self, _buf: &mut [f32], _op: ReduceOp) -> Result<(), CommError> {
        // Sum and mean over a single rank are both the rank's own values.
        Ok(())
    }

    fn broadcast_raw(&self, _buf: &mut [u8], _width: Width, _root: usize) -> Result<(), CommError> {
        Ok(())
    }

    fn all_gather_raw(&self, send: &[u8], recv: &mut [u8], _width: Width) -> Result<(), CommError> {
        recv.copy_from_slice(send);
        Ok(())
    }

    fn all_to_all_raw(&self, send: &[u8], recv: &mut [u8], _width: Width) -> Result<(), CommError> {
        recv.copy_from_slice(send);
        Ok(())
    }

    fn barrier_raw(&self) -> Result<(), CommError> {
        Ok(())
    }
}
