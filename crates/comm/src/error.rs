//! The error type of every collective.

use std::time::Duration;

/// What went wrong in a collective call.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// This rank's buffers do not fit the call (e.g. `recv` of the wrong size).
    #[error("{op}: buffer length mismatch: expected {expected} elements, got {actual}")]
    LengthMismatch {
        /// The collective that detected the mismatch.
        op: &'static str,
        /// The length the collective needed.
        expected: usize,
        /// The length it was given.
        actual: usize,
    },
    /// Ranks passed buffers of different lengths to the same collective.
    #[error(
        "{op}: rank {rank} passed {actual} elements where rank 0 passed {expected}; \
         every rank must pass the same length"
    )]
    RankMismatch {
        /// The collective.
        op: &'static str,
        /// The first rank that differs from rank 0.
        rank: usize,
        /// Rank 0's length.
        expected: usize,
        /// That rank's length.
        actual: usize,
    },
    /// Ranks called different collectives (or the same one with different
    /// roots) at the same point of the program.
    #[error("rank 0 called {expected} but rank {rank} called {actual}")]
    CallMismatch {
        /// What rank 0 called.
        expected: String,
        /// The first rank that differs.
        rank: usize,
        /// What it called.
        actual: String,
    },
    /// An option of a collective outside its valid range.
    #[error("`{option}` = {value}: {reason}")]
    BadOption {
        /// The option.
        option: &'static str,
        /// Its value, printed.
        value: String,
        /// The rule it breaks.
        reason: &'static str,
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
    /// Another rank failed, panicked or left while this one waited for it.
    #[error("rank {rank} failed: {reason}")]
    PeerFailed {
        /// The rank that failed.
        rank: usize,
        /// What it reported.
        reason: String,
    },
    /// The other ranks did not arrive within the communicator's timeout.
    #[error(
        "{op}: {} did not arrive within {timeout:?}: stuck or dead (train.collective_timeout_s sets the deadline)",
        ranks(missing)
    )]
    Timeout {
        /// The collective that waited.
        op: &'static str,
        /// How long it waited.
        timeout: Duration,
        /// The ranks that had not arrived.
        missing: Vec<usize>,
    },
    /// A stop signal came while this rank waited in a collective for ranks
    /// that did not arrive: the ranks are not at one step, so no checkpoint
    /// can be consistent.
    #[error(
        "{op}: stopped by signal {signal} while waiting for {}, which did not arrive within {:?} of the signal; the ranks are not at one step, so no checkpoint was written",
        ranks(missing),
        crate::watchdog::STOP_GRACE
    )]
    Stopped {
        /// The collective that waited.
        op: &'static str,
        /// The signal (2: SIGINT, 15: SIGTERM).
        signal: i32,
        /// The ranks that had not arrived.
        missing: Vec<usize>,
    },
    /// The transport itself failed (MPI, NCCL).
    #[error("{backend}: {message}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// Its message.
        message: String,
    },
}

/// "rank 2", "ranks 1, 3", or "some rank" when unknown.
fn ranks(missing: &[usize]) -> String {
    match missing {
        [] => "some rank".into(),
        [one] => format!("rank {one}"),
        many => format!(
            "ranks {}",
            many.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A buffer of `actual` elements where `op` needs `expected`: an error
/// naming `op` unless they agree.
pub(crate) fn check_len(op: &'static str, expected: usize, actual: usize) -> Result<(), CommError> {
    match expected == actual {
        true => Ok(()),
        false => Err(CommError::LengthMismatch {
            op,
            expected,
            actual,
        }),
    }
}
