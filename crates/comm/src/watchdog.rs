//! How long a rank waits for the others in a collective, and what ends the
//! wait early: the deadline that turns a stuck or dead rank into an error
//! naming it (instead of a job that spins forever), and a stop signal
//! (SIGINT/SIGTERM) that arrived while the others cannot be reached.
//!
//! The backends poll while they wait (`mpi`'s header exchange is
//! non-blocking for this; `local` wakes every second), so the deadline and
//! the signal are checked without a thread of their own.
//!
//! The signal does not end the waits inside [`ignoring_stop`]: a stop's
//! checkpoint is written collectively, and there a rank waits for healthy
//! ranks for as long as the slowest needs to write (rank 0 writes and
//! syncs the files the ranks hold alike, gigabytes for BERT-large, while
//! the others only link them); giving up after [`STOP_GRACE`] would lose
//! the very checkpoint the signal asked for. Those waits end at the
//! deadline only.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::CommError;

/// How long after a stop signal a rank still waits for the others (but
/// inside [`ignoring_stop`]): a collective the whole world is in finishes
/// in far less, and the run then stops at the end of its step with a
/// checkpoint as usual.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// A collective's deadline until the trainer sets one from its step time:
/// generous, as rank 0 may be making a corpus's examples while the others
/// wait.
pub const FIRST_DEADLINE: Duration = Duration::from_secs(2 * 3600);

/// Where the process's stop signal is read (terse-train's handler); none
/// registered: no signal is ever seen.
static STOP_SOURCE: OnceLock<fn() -> Option<i32>> = OnceLock::new();

/// Registers `source`, which returns the stop signal received (SIGINT,
/// SIGTERM), if any. The first registration wins.
pub fn set_stop_source(source: fn() -> Option<i32>) {
    let _ = STOP_SOURCE.set(source);
}

/// The stop signal received, if any.
pub fn stop_signal() -> Option<i32> {
    STOP_SOURCE.get().and_then(|source| source())
}

thread_local! {
    /// How many [`ignoring_stop`] scopes this thread is in. Per thread, as
    /// the waits are: each rank waits on the thread that called the
    /// collective (its own process under MPI, its own thread under
    /// `local`), so one rank writing its checkpoint leaves the waits of
    /// another rank of the process as they were.
    static IGNORING_STOP: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f` with the stop signal ignored by this thread's waits: they end
/// at the collective deadline only, not [`STOP_GRACE`] after a signal (the
/// trainer's checkpoint writes, whose slowest rank may need far longer
/// than the grace while every rank is healthy). Scopes nest; the signal
/// counts again once `f` returns or unwinds.
pub fn ignoring_stop<R>(f: impl FnOnce() -> R) -> R {
    let _scope = IgnoringStop::enter();
    f()
}

/// One [`ignoring_stop`] scope of this thread, left when dropped (on
/// unwinding too, so a panic inside never leaves the signal ignored).
struct IgnoringStop;

impl IgnoringStop {
    fn enter() -> Self {
        IGNORING_STOP.with(|depth| depth.set(depth.get() + 1));
        IgnoringStop
    }
}

impl Drop for IgnoringStop {
    fn drop(&mut self) {
        IGNORING_STOP.with(|depth| depth.set(depth.get().saturating_sub(1)));
    }
}

/// `signal` as this thread's waits see it: none inside [`ignoring_stop`].
fn heeded(signal: Option<i32>) -> Option<i32> {
    signal.filter(|_| IGNORING_STOP.with(Cell::get) == 0)
}

/// A rank's deadline for one collective's wait, settable while it runs
/// (the trainer raises it with the step time it measures).
#[derive(Debug)]
pub struct Deadline {
    millis: AtomicU64,
}

impl Deadline {
    /// `timeout` per wait.
    pub fn new(timeout: Duration) -> Self {
        Self {
            millis: AtomicU64::new(millis(timeout)),
        }
    }

    /// The current timeout.
    pub fn get(&self) -> Duration {
        Duration::from_millis(self.millis.load(Ordering::Relaxed))
    }

    /// Replaces the timeout.
    pub fn set(&self, timeout: Duration) {
        self.millis.store(millis(timeout), Ordering::Relaxed);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Why a wait for the other ranks ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// The deadline passed.
    Deadline,
    /// A stop signal came and the others still had not arrived after
    /// [`STOP_GRACE`].
    Signal(i32),
}

impl GiveUp {
    /// The error of collective `op` given up for this reason after waiting
    /// up to `timeout` for the `missing` ranks.
    pub fn error(self, op: &'static str, timeout: Duration, missing: Vec<usize>) -> CommError {
        match self {
            GiveUp::Deadline => CommError::Timeout {
                op,
                timeout,
                missing,
            },
            GiveUp::Signal(signal) => CommError::Stopped {
                op,
                signal,
                missing,
            },
        }
    }
}

/// One wait for the other ranks: started now, given up when
/// [`Wait::give_up`] says so.
#[derive(Debug)]
pub struct Wait {
    start: Instant,
    timeout: Duration,
    signalled_at: Option<Instant>,
}

impl Wait {
    /// A wait under `deadline`'s current timeout.
    pub fn start(deadline: &Deadline) -> Self {
        Self {
            start: Instant::now(),
            timeout: deadline.get(),
            signalled_at: None,
        }
    }

    /// The timeout this wait runs under.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether to stop waiting, and why: at the deadline, or
    /// [`STOP_GRACE`] after this wait first saw a stop signal (never inside
    /// [`ignoring_stop`]).
    pub fn give_up(&mut self) -> Option<GiveUp> {
        self.decide(Instant::now(), heeded(stop_signal()))
    }

    /// [`Wait::give_up`] at `now` with `signal` the stop signal heeded:
    /// apart so that tests need not wait out the grace.
    fn decide(&mut self, now: Instant, signal: Option<i32>) -> Option<GiveUp> {
        if now.duration_since(self.start) >= self.timeout {
            return Some(GiveUp::Deadline);
        }
        let signal = signal?;
        let since = *self.signalled_at.get_or_insert(now);
        (now.duration_since(since) >= STOP_GRACE).then_some(GiveUp::Signal(signal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_gives_up_at_its_deadline_and_not_before() {
        let deadline = Deadline::new(Duration::from_millis(50));
        let mut wait = Wait::start(&deadline);
        assert_eq!(wait.give_up(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(wait.give_up(), Some(GiveUp::Deadline));
        deadline.set(Duration::from_secs(3600));
        assert_eq!(deadline.get(), Duration::from_secs(3600));
        assert_eq!(Wait::start(&deadline).give_up(), None);
    }

    #[test]
    fn a_signal_ends_a_wait_after_the_grace_but_not_inside_ignoring_stop() {
        const SIGTERM: Option<i32> = Some(15);
        let deadline = Deadline::new(Duration::from_secs(3600));
        let after_grace = |wait: &Wait| wait.start + STOP_GRACE + Duration::from_secs(1);

        // Outside: the wait first sees the signal, then gives up once the
        // grace has passed.
        let mut outside = Wait::start(&deadline);
        assert_eq!(outside.decide(outside.start, heeded(SIGTERM)), None);
        let later = after_grace(&outside);
        assert_eq!(
            outside.decide(later, heeded(SIGTERM)),
            Some(GiveUp::Signal(15))
        );

        // Inside (nested too): the signal is not seen, only the deadline
        // ends the wait.
        ignoring_stop(|| {
            ignoring_stop(|| assert_eq!(heeded(SIGTERM), None));
            let mut inside = Wait::start(&deadline);
            assert_eq!(inside.decide(inside.start, heeded(SIGTERM)), None);
            let later = after_grace(&inside);
            assert_eq!(inside.decide(later, heeded(SIGTERM)), None);
            let past_deadline = inside.start + Duration::from_secs(3600);
            assert_eq!(
                inside.decide(past_deadline, heeded(SIGTERM)),
                Some(GiveUp::Deadline)
            );
            // Another thread's waits (another local rank's) still see it.
            std::thread::scope(|s| {
                s.spawn(|| assert_eq!(heeded(SIGTERM), SIGTERM));
            });
        });

        // Left, by returning or by unwinding: the signal counts again.
        assert_eq!(heeded(SIGTERM), SIGTERM);
        let unwound = std::panic::catch_unwind(|| ignoring_stop::<()>(|| panic!("inside")));
        assert!(unwound.is_err());
        assert_eq!(heeded(SIGTERM), SIGTERM);
        assert_eq!(heeded(None), None);
    }
}
