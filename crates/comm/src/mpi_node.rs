//! Memory the `mpi` ranks of one node share: an MPI-3 shared window
//! (`MPI_Win_allocate_shared`) with one segment per rank, every rank able to
//! read the others' segments directly.
//!
//! When every rank of the job runs on one machine, the split update of
//! [`crate::Communicator::shares_cores`] pays only if its two halves are
//! cheaper than the allreduce they replace. Through MPI's collectives they
//! were not (OpenMPI 4.1.4, 2 ranks, 45 MB: `MPI_Reduce_scatter` 16–22 ms and
//! `MPI_Allgatherv` of the halves 8–9 ms, against 8.5 ms for the whole
//! `MPI_Allreduce`); through shared memory each is one pass of copies, as
//! between `local` ranks.
//!
//! Synchronisation: the window is locked for passive access once
//! (`MPI_Win_lock_all`), and [`NodeWindow::fence`] is `MPI_Win_sync`,
//! `MPI_Barrier`, `MPI_Win_sync` — the separate-process form of the
//! unified memory model's "write, barrier, read".

use std::os::raw::c_int;

use mpi::ffi;

/// One segment of `len` f32 per rank of a communicator whose ranks share a
/// node.
pub(crate) struct NodeWindow {
    win: ffi::MPI_Win,
    comm: ffi::MPI_Comm,
    len: usize,
    segments: Vec<*mut f32>,
}

impl NodeWindow {
    /// Segments of `len` elements for each of `ranks` ranks of `comm`.
    ///
    /// # Safety
    /// Collective: every rank of `comm` calls it with the same `len`, under
    /// the caller's MPI lock, and every rank of `comm` is on this node.
    pub(crate) unsafe fn allocate(comm: ffi::MPI_Comm, ranks: usize, len: usize) -> NodeWindow {
        let mut base: *mut f32 = std::ptr::null_mut();
        let mut win = unsafe { ffi::RSMPI_WIN_NULL };
        // SAFETY: out-pointers to locals; the size fits (checked by the
        // caller against MPI's count limit, 4 bytes each).
        unsafe {
            ffi::MPI_Win_allocate_shared(
                (4 * len) as ffi::MPI_Aint,
                4,
                ffi::RSMPI_INFO_NULL,
                comm,
                (&mut base as *mut *mut f32).cast(),
                &mut win,
            );
            ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as c_int, win);
        }
        let segments = (0..ranks)
            .map(|rank| {
                let (mut size, mut unit) = (0 as ffi::MPI_Aint, 0 as c_int);
                let mut segment: *mut f32 = std::ptr::null_mut();
                // SAFETY: out-pointers to locals, a rank of the window.
                unsafe {
                    ffi::MPI_Win_shared_query(
                        win,
                        rank as c_int,
                        &mut size,
                        &mut unit,
                        (&mut segment as *mut *mut f32).cast(),
                    );
                }
                segment
            })
            .collect();
        NodeWindow {
            win,
            comm,
            len,
            segments,
        }
    }

    /// Elements per segment.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Rank `rank`'s segment, to read.
    ///
    /// # Safety
    /// Only between two [`NodeWindow::fence`]s in which its rank does not
    /// write the part read.
    pub(crate) unsafe fn segment(&self, rank: usize) -> &[f32] {
        // SAFETY: MPI gave `len` elements at this address, alive until
        // `free`; no writer is the caller's contract above.
        unsafe { std::slice::from_raw_parts(self.segments[rank], self.len) }
    }

    /// This process's own segment (`rank` of the window), to write.
    ///
    /// # Safety
    /// Only between two [`NodeWindow::fence`]s in which no other rank reads
    /// the part written.
    pub(crate) unsafe fn own(&mut self, rank: usize) -> &mut [f32] {
        // SAFETY: as in `segment`; other processes' reads are excluded by
        // the caller's contract above.
        unsafe { std::slice::from_raw_parts_mut(self.segments[rank], self.len) }
    }

    /// Makes every rank's writes so far visible to every rank, and waits
    /// for all of them.
    ///
    /// # Safety
    /// Collective over the window's ranks, under the caller's MPI lock.
    pub(crate) unsafe fn fence(&self) {
        // SAFETY: a live window and its communicator.
        unsafe {
            ffi::MPI_Win_sync(self.win);
            ffi::MPI_Barrier(self.comm);
            ffi::MPI_Win_sync(self.win);
        }
    }

    /// Releases the window.
    ///
    /// # Safety
    /// Collective over the window's ranks, under the caller's MPI lock,
    /// before MPI is finalised; no segment is used afterwards.
    pub(crate) unsafe fn free(mut self) {
        // SAFETY: a live window, unlocked once as it was locked once.
        unsafe {
            ffi::MPI_Win_unlock_all(self.win);
            ffi::MPI_Win_free(&mut self.win);
        }
    }
}
