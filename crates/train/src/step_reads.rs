//! A step's device → host reads by phase, for its metrics line: each read
//! waits for the device to finish what was queued before it, so a step on
//! a device should read only where a decision or the network needs it
//! (`terse_kernels::host_reads` counts them; the step marks its phases).

use std::time::Instant;

use terse_kernels::host_reads::{self, HostReads, StepPhase};

use crate::metrics::{StepReads, ms};

/// Counts this thread's reads from a step's start.
pub(crate) struct StepReadCounter(HostReads);

impl StepReadCounter {
    /// The step starts: its reads count as before the update until the
    /// trainer enters the next phase.
    pub(crate) fn start() -> Self {
        host_reads::enter(StepPhase::BeforeUpdate);
        Self(host_reads::counts())
    }

    /// The optimizer's step starts.
    pub(crate) fn update_starts(&self) {
        host_reads::enter(StepPhase::Update);
    }

    /// The step's end, once its update is queued: `read` (its loss and
    /// norm, which wait for the device) with the milliseconds it took, and
    /// the step's reads by phase; later reads count as outside steps.
    pub(crate) fn after_update<R>(self, read: impl FnOnce() -> R) -> (R, f64, StepReads) {
        host_reads::enter(StepPhase::AfterUpdate);
        let clock = Instant::now();
        let value = read();
        let wait_ms = ms(clock);
        let now = host_reads::counts();
        host_reads::enter(StepPhase::Outside);
        let reads = StepReads {
            before_update: now.before_update - self.0.before_update,
            update: now.update - self.0.update,
            after_update: now.after_update - self.0.after_update,
        };
        (value, wait_ms, reads)
    }
}
