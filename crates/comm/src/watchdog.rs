//! How long a rank waits for the others in a collective, and what ends the
//! wait early: the deadline that turns a stuck or dead rank into an error
//! naming it (instead of a job that spins forever), and a stop signal
//! (SIGINT/SIGTERM) that arrived while the others cannot be reached.
//!
//! The backends poll while they wait (`mpi`'s header exchange is
//! non-blocking for this; `local` wakes every second), so the deadline and
//! the signal are checked without a thread of their own.
//!
//! Inside [`with_checkpoint_grace`] (a checkpoint being written) a signal ends a
//! wait only after [`CHECKPOINT_GRACE`]: a checkpoint is written
//! collectively, and there a rank waits for healthy ranks for as long as
//! the slowest needs to write (rank 0 writes and syncs the files the ranks
//! hold alike, gigabytes for BERT-large, while the others only link them);
//! giving up after [`STOP_GRACE`] would lose the very checkpoint the
//! signal asked for. A rank that hangs there still ends the job, later.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::CommError;

/// How long after a stop signal a rank still waits for the others (but
/// inside [`with_checkpoint_grace`]): a collective the whole world is in finishes
/// in far less, and the run then stops at the end of its step with a
/// checkpoint as usual.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// [`STOP_GRACE`] for the waits of a checkpoint being written
/// ([`with_checkpoint_grace`]): long enough for rank 0 to write and sync a large
/// model's files at a slow disk's 100 MB/s (BERT-large with AdamW, about
/// 4 GB), short enough that a rank hung there still ends the job within
/// minutes, not at the collective deadline.
pub const CHECKPOINT_GRACE: Duration = Duration::from_secs(120);

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
    /// How many [`with_checkpoint_grace`] scopes this thread is in. Per thread, as
    /// the waits are: each rank waits on the thread that called the
    /// collective (its own process under MPI, its own thread under
    /// `local`), so one rank writing its checkpoint leaves the waits of
    /// another rank of the process as they were.
    static IN_CHECKPOINT: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f` with this thread's waits giving a stop signal
/// [`CHECKPOINT_GRACE`] instead of [`STOP_GRACE`] (the trainer's
/// checkpoint writes, whose slowest rank may need far longer than the
/// stop grace while every rank is healthy). Scopes nest; the stop grace
/// applies again once `f` returns or unwinds.
pub fn with_checkpoint_grace<R>(f: impl FnOnce() -> R) -> R {
    let _scope = CheckpointScope::enter();
    f()
}

/// One [`with_checkpoint_grace`] scope of this thread, left when dropped (on
/// unwinding too, so a panic inside never leaves the signal ignored).
struct CheckpointScope;

impl CheckpointScope {
    fn enter() -> Self {
        IN_CHECKPOINT.with(|depth| depth.set(depth.get() + 1));
        CheckpointScope
    }
}

impl Drop for CheckpointScope {
    fn drop(&mut self) {
        IN_CHECKPOINT.with(|depth| depth.set(depth.get().saturating_sub(1)));
    }
}

/// How long after a stop signal this thread's waits go on:
/// [`CHECKPOINT_GRACE`] inside [`with_checkpoint_grace`], else [`STOP_GRACE`].
fn grace() -> Duration {
    if IN_CHECKPOINT.with(Cell::get) == 0 {
        STOP_GRACE
    } else {
        CHECKPOINT_GRACE
    }
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

    /// Whether to stop waiting, and why: at the deadline, or the grace
    /// after this wait first saw a stop signal ([`STOP_GRACE`], or
    /// [`CHECKPOINT_GRACE`] inside [`with_checkpoint_grace`]).
    pub fn give_up(&mut self) -> Option<GiveUp> {
        self.decide(Instant::now(), stop_signal(), grace())
    }

    /// [`Wait::give_up`] at `now` with `signal` the stop signal and `grace`
    /// the wait after it: apart so that tests need not wait out the grace.
    fn decide(&mut self, now: Instant, signal: Option<i32>, grace: Duration) -> Option<GiveUp> {
        if now.duration_since(self.start) >= self.timeout {
            return Some(GiveUp::Deadline);
        }
        let signal = signal?;
        let since = *self.signalled_at.get_or_insert(now);
        (now.duration_since(since) >= grace).then_some(GiveUp::Signal(signal))
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
    fn a_signal_ends_a_wait_after_the_grace_and_a_checkpoint_s_wait_after_its_own() {
        const SIGTERM: Option<i32> = Some(15);
        let deadline = Deadline::new(Duration::from_secs(3600));
        let after = |wait: &Wait, grace: Duration| wait.start + grace + Duration::from_secs(1);

        // Outside: the wait first sees the signal, then gives up once the
        // stop grace has passed.
        assert_eq!(grace(), STOP_GRACE);
        let mut outside = Wait::start(&deadline);
        assert_eq!(outside.decide(outside.start, SIGTERM, grace()), None);
        let later = after(&outside, STOP_GRACE);
        assert_eq!(
            outside.decide(later, SIGTERM, grace()),
            Some(GiveUp::Signal(15))
        );

        // Inside (nested too): past the stop grace it still waits, past
        // the checkpoint's it gives up.
        with_checkpoint_grace(|| {
            with_checkpoint_grace(|| assert_eq!(grace(), CHECKPOINT_GRACE));
            assert_eq!(grace(), CHECKPOINT_GRACE);
            let mut inside = Wait::start(&deadline);
            assert_eq!(inside.decide(inside.start, SIGTERM, grace()), None);
            let later = after(&inside, STOP_GRACE);
            assert_eq!(inside.decide(later, SIGTERM, grace()), None);
            let much_later = after(&inside, CHECKPOINT_GRACE);
            assert_eq!(
                inside.decide(much_later, SIGTERM, grace()),
                Some(GiveUp::Signal(15))
            );
            // Another thread's waits (another local rank's) keep the stop
            // grace.
            std::thread::scope(|s| {
                s.spawn(|| assert_eq!(grace(), STOP_GRACE));
            });
        });

        // Left, by returning or by unwinding: the stop grace again.
        assert_eq!(grace(), STOP_GRACE);
        let unwound = std::panic::catch_unwind(|| with_checkpoint_grace::<()>(|| panic!("inside")));
        assert!(unwound.is_err());
        assert_eq!(grace(), STOP_GRACE);
    }
}
