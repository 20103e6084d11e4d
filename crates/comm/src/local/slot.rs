//! The slot in which a `local` rank posts its call: what it called and a
//! pointer to its own buffer, which the other ranks read in place (the
//! module comment of `local` says why that outlives every read).

use std::ops::Range;

use super::peer_failed;
use crate::CommError;
use crate::traffic::Collective;

/// What a rank posted for the current collective.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) kind: Option<Collective>,
    pub(super) root: usize,
    /// Elements in the posted call, compared across ranks.
    pub(super) len: usize,
    /// The poster's buffer, readable until the poster leaves the collective.
    pub(super) posted: Posted,
    /// Allreduce: this rank's reduced chunk.
    pub(super) reduced: Vec<f32>,
}

/// A borrowed buffer of another thread, published for the span of one
/// collective (see the module comment of `local` for why it outlives every read).
#[derive(Clone, Copy)]
pub(super) struct Posted {
    pub(super) ptr: *const u8,
    pub(super) len: usize,
}

impl Default for Posted {
    fn default() -> Self {
        Self {
            ptr: std::ptr::null(),
            len: 0,
        }
    }
}

// SAFETY: the pointer is only dereferenced under the slot's read lock while
// its owner is still inside the collective that posted it (the owner clears
// it under the write lock before it leaves), so the bytes it names are alive
// and not written for as long as a reader holds it.
unsafe impl Send for Posted {}
unsafe impl Sync for Posted {}

impl Slot {
    /// The posted bytes; `Err` once the poster has left the collective
    /// (only after a failed meeting).
    pub(super) fn data(&self, rank: usize) -> Result<&[u8], CommError> {
        if self.posted.ptr.is_null() {
            if self.posted.len == 0 {
                return Ok(&[]);
            }
            return Err(peer_failed(rank, "left the collective"));
        }
        // SAFETY: see `Posted`: the owner is inside this collective and does
        // not write the buffer until every reader has released the lock.
        Ok(unsafe { std::slice::from_raw_parts(self.posted.ptr, self.posted.len) })
    }

    /// `range` (in f32 elements) of the posted buffer, without a view of
    /// the rest: in [`Communicator::share_ranges_f32`] the owner
    /// writes the other ranges of its buffer meanwhile.
    pub(super) fn f32_range(&self, rank: usize, range: Range<usize>) -> Result<&[f32], CommError> {
        if self.posted.ptr.is_null() {
            return Err(peer_failed(rank, "left the collective"));
        }
        assert!(
            range.end * 4 <= self.posted.len,
            "checked against the posted length"
        );
        // SAFETY: as in `data`, for a part of the buffer the owner does not
        // write during this collective (its own range); f32 alignment comes
        // from the owner's `&mut [f32]`.
        Ok(unsafe {
            std::slice::from_raw_parts(self.posted.ptr.cast::<f32>().add(range.start), range.len())
        })
    }
}
