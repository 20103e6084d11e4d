//! How long a rank waits for the others in a collective before the job
//! ends naming the ranks that did not come (a stopped, hung or lost rank):
//! `train.collective_timeout_s`, or a deadline that follows the step time.
//!
//! The automatic deadline has to outlast every wait a healthy run has: the
//! ranks wait for each other's share of an evaluation, and for rank 0's
//! checkpoints inside the next step's first collective, so a rank's slowest step so far (those
//! waits included) times ten, never under ten minutes; before the first
//! step (data preparation, the evaluation before training) thirty minutes.

use std::time::Duration;

/// Before the first step is done.
const FIRST: Duration = Duration::from_secs(30 * 60);
/// Never less, however fast the steps.
const FLOOR: Duration = Duration::from_secs(10 * 60);
/// Times the slowest step so far.
const STEPS: u32 = 10;

/// The deadline of a run, updated step by step.
#[derive(Debug, Clone)]
pub(crate) struct CollectiveDeadline {
    fixed: Option<Duration>,
    slowest: Duration,
}

impl CollectiveDeadline {
    /// `train.collective_timeout_s`, or automatic when unset.
    pub(crate) fn new(configured_s: Option<u64>) -> Self {
        Self {
            fixed: configured_s.map(Duration::from_secs),
            slowest: Duration::ZERO,
        }
    }

    /// The deadline before any step.
    pub(crate) fn initial(&self) -> Duration {
        self.fixed.unwrap_or(FIRST)
    }

    /// The deadline once a step took `step`.
    pub(crate) fn after_step(&mut self, step: Duration) -> Duration {
        self.slowest = self.slowest.max(step);
        self.fixed.unwrap_or((self.slowest * STEPS).max(FLOOR))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_slowest_step_with_a_floor_unless_configured() {
        let mut auto = CollectiveDeadline::new(None);
        assert_eq!(auto.initial(), Duration::from_secs(1800));
        assert_eq!(
            auto.after_step(Duration::from_secs(2)),
            Duration::from_secs(600)
        );
        assert_eq!(
            auto.after_step(Duration::from_secs(90)),
            Duration::from_secs(900)
        );
        // A fast step does not lower it: an evaluation may come again.
        assert_eq!(
            auto.after_step(Duration::from_secs(1)),
            Duration::from_secs(900)
        );
        let mut fixed = CollectiveDeadline::new(Some(5));
        assert_eq!(fixed.initial(), Duration::from_secs(5));
        assert_eq!(
            fixed.after_step(Duration::from_secs(90)),
            Duration::from_secs(5)
        );
    }
}
