//! Device → host reads, counted by where in a training step they happen.
//!
//! A read waits for every kernel queued before it: the device drains, then
//! idles until the host has queued more. Inside a step only a decision
//! (fp16's overflow check, clipping's factor) or the network (a host
//! collective) should read; the rest (the loss, the logged gradient norm)
//! can wait until the step's work is queued. Every read terse makes of a
//! cubecl buffer goes through [`read_f32`] / [`read_u32`], or, for a burn
//! tensor it reads itself, [`note`]. The trainer marks the phases of its
//! steps ([`StepPhase`]) and the counts by phase tell a run (and a test)
//! where its steps read. burn's own reads are not seen here; terse's
//! training step makes none through burn other than the loss, which it
//! notes.
//!
//! Counts are per thread: a rank is a thread (local ranks) or a process.

use std::cell::Cell;

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Where in a step a read happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepPhase {
    /// Outside any step (setup, evaluation, checkpoints): not counted.
    Outside,
    /// From the step's start until its optimizer step is called: forward,
    /// backward, the gradient into the flat buffer, unscaling, clipping.
    BeforeUpdate,
    /// Inside the optimizer's step (its communication and rules).
    Update,
    /// After the update was queued: the step's record.
    AfterUpdate,
}

/// Reads counted on this thread, by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostReads {
    /// In [`StepPhase::BeforeUpdate`].
    pub before_update: u64,
    /// In [`StepPhase::Update`].
    pub update: u64,
    /// In [`StepPhase::AfterUpdate`].
    pub after_update: u64,
}

thread_local! {
    static PHASE: Cell<StepPhase> = const { Cell::new(StepPhase::Outside) };
    static COUNTS: Cell<HostReads> = const {
        Cell::new(HostReads { before_update: 0, update: 0, after_update: 0 })
    };
}

/// Sets this thread's step phase (the trainer, as a step goes on).
pub fn enter(phase: StepPhase) {
    PHASE.with(|p| p.set(phase));
}

/// This thread's counts so far.
pub fn counts() -> HostReads {
    COUNTS.with(Cell::get)
}

/// Counts one read in this thread's current phase, if it is a step's (for a
/// read terse makes through burn, e.g. a loss's `into_data`).
pub fn note() {
    let phase = PHASE.with(Cell::get);
    COUNTS.with(|c| {
        let mut counts = c.get();
        match phase {
            StepPhase::Outside => {}
            StepPhase::BeforeUpdate => counts.before_update += 1,
            StepPhase::Update => counts.update += 1,
            StepPhase::AfterUpdate => counts.after_update += 1,
        }
        c.set(counts);
    });
}

/// `handle`'s f32 values on the host (the whole buffer), counted.
pub fn read_f32(client: &Client, handle: Handle) -> Vec<f32> {
    note();
    f32::from_bytes(&client.read_one_unchecked(handle)).to_vec()
}

/// `handle`'s u32 words on the host (the whole buffer), counted.
pub fn read_u32(client: &Client, handle: Handle) -> Vec<u32> {
    note();
    u32::from_bytes(&client.read_one_unchecked(handle)).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_counted_in_the_phase_they_happen() {
        enter(StepPhase::Outside);
        let before = counts();
        note();
        assert_eq!(counts(), before, "a read outside a step is counted");
        enter(StepPhase::BeforeUpdate);
        note();
        enter(StepPhase::Update);
        note();
        note();
        enter(StepPhase::AfterUpdate);
        note();
        enter(StepPhase::Outside);
        note();
        let after = counts();
        assert_eq!(after.before_update - before.before_update, 1);
        assert_eq!(after.update - before.update, 2);
        assert_eq!(after.after_update - before.after_update, 1);
    }
}
