//! What the ranks exchange when they meet outside the optimizer's step
//! (checkpoints, the shared evaluation): whether each succeeded at its
//! part, and messages of bytes whose lengths differ between the ranks.

use terse_comm::{CommError, Communicator};

use crate::TrainError;

/// Ends a step of a collective operation: `own` is this rank's outcome; the
/// ranks all-gather whether theirs succeeded, so a failure on any rank is
/// an error on every rank (naming the first failed rank; `what` says what
/// it could not do) instead of a wait for a rank that gave up.
pub(crate) fn all_succeeded<T>(
    comm: &dyn Communicator,
    own: Result<T, TrainError>,
    what: impl FnOnce() -> String,
) -> Result<T, TrainError> {
    let mut flags = vec![0u8; comm.world_size()];
    let gathered = comm.all_gather_u8(&[u8::from(own.is_ok())], &mut flags);
    let value = own?;
    gathered?;
    match flags.iter().position(|&ok| ok == 0) {
        Some(rank) => Err(CommError::PeerFailed {
            rank,
            reason: what(),
        }
        .into()),
        None => Ok(value),
    }
}

/// Every rank's `own` bytes, by rank, all-gathered: the lengths first, then
/// the messages padded to the longest.
pub(crate) fn all_gather_bytes(
    comm: &dyn Communicator,
    own: &[u8],
) -> Result<Vec<Vec<u8>>, TrainError> {
    let n = comm.world_size();
    let mut lengths = vec![0u8; 8 * n];
    comm.all_gather_u8(&(own.len() as u64).to_le_bytes(), &mut lengths)?;
    let lengths: Vec<usize> = lengths
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
        .collect();
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let mut send = own.to_vec();
    send.resize(longest, 0);
    let mut all = vec![0u8; longest * n];
    comm.all_gather_u8(&send, &mut all)?;
    Ok(all
        .chunks_exact(longest.max(1))
        .zip(&lengths)
        .map(|(bytes, &length)| bytes[..length].to_vec())
        .chain(std::iter::repeat_with(Vec::new))
        .take(n)
        .collect())
}
