//! The error type of every collective.

/// What went wrong in a collective call.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// Buffers that must agree in length across ranks (or between send and
    /// receive sides of one call) do not.
    #[error("{op}: buffer length mismatch: expected {expected} elements, got {actual}")]
    LengthMismatch {
        /// The collective that detected the mismatch.
        op: &'static str,
        /// The length the collective needed.
        expected: usize,
        /// The length it was given.
        actual: usize,
    },
    /// A rank argument outside `0..world_size`.
    #[error("{op}: rank {rank} is out of range for world size {world_size}")]
    BadRank {
        /// The collective that was called.
        op: &'static str,
        /// The offending rank.
        rank: usize,
        /// The communicator's world size.
        world_size: usize,
    },
}
