//! Ending a process whose local ranks cannot all end.
//!
//! Local ranks are threads of one process, and a thread blocked outside
//! any collective (in `open(2)` on a hung network filesystem, say) can be
//! neither woken nor cancelled: the ranks waiting for it give up at the
//! collective deadline and return, but the process would then wait for the
//! stuck thread forever. So once a rank has failed (given up on the others
//! at the deadline or on a stop signal, or any error of its own), the
//! others get [`GRACE`] to return (those in a collective learn of the
//! failure at once; a run that ends together — a signal's checkpoint, a
//! divergence — returns on every rank at the same step); any rank still
//! running then is named, with where it was ([`rank_phase`]), and the
//! process exits. Under `mpirun` the failing rank's `MPI_Abort` does the
//! same for the processes.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use terse_comm::CommError;

use crate::TrainError;
use crate::rank_phase;

/// How long the other ranks have to return once one rank failed.
pub const GRACE: Duration = Duration::from_secs(5);

/// A rank's failure: its report and the exit status.
#[derive(Debug, Clone)]
struct GaveUp {
    rank: usize,
    report: String,
    status: i32,
}

#[derive(Debug)]
struct State {
    running: Vec<bool>,
    gave_up: Option<GaveUp>,
    over: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Watches the local ranks of one run; dropped once they all returned.
#[derive(Debug)]
pub struct StuckRanks {
    shared: Arc<Shared>,
    watcher: Option<JoinHandle<()>>,
}

impl StuckRanks {
    /// Watches `ranks` local ranks: once one has failed and some are
    /// still running `grace` later, the process exits.
    pub fn watch(ranks: usize, grace: Duration) -> Self {
        Self::watch_with(ranks, grace, |status| std::process::exit(status))
    }

    /// [`StuckRanks::watch`] with what ends the process (tests: a record).
    fn watch_with(ranks: usize, grace: Duration, end: impl FnOnce(i32) + Send + 'static) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                running: vec![true; ranks],
                gave_up: None,
                over: false,
            }),
            changed: Condvar::new(),
        });
        let watched = Arc::clone(&shared);
        let watcher = std::thread::Builder::new()
            .name("stuck-ranks".into())
            .spawn(move || {
                if let Some(status) = stuck_after_give_up(&watched, grace) {
                    end(status);
                }
            })
            .expect("a thread to watch the ranks");
        Self {
            shared,
            watcher: Some(watcher),
        }
    }

    /// Records that `rank` returned `result` (the first error is the one
    /// reported).
    pub fn returned<T>(&self, rank: usize, result: &Result<T, TrainError>) {
        let mut state = self.shared.lock();
        state.running[rank] = false;
        if let Err(error) = result
            && state.gave_up.is_none()
        {
            let status = match error.gave_up_waiting() {
                Some(CommError::Stopped { signal, .. }) => 128 + signal,
                _ => 1,
            };
            state.gave_up = Some(GaveUp {
                rank,
                report: error.to_string(),
                status,
            });
        }
        self.shared.changed.notify_all();
    }
}

impl Drop for StuckRanks {
    fn drop(&mut self) {
        self.shared.lock().over = true;
        self.shared.changed.notify_all();
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
    }
}

/// Waits for a rank to fail, then up to `grace` for the others; the exit
/// status when some rank is still running then (named in the log), `None`
/// when every rank returned or none failed.
fn stuck_after_give_up(shared: &Shared, grace: Duration) -> Option<i32> {
    let mut state = shared.lock();
    while state.gave_up.is_none() {
        if state.over {
            return None;
        }
        state = shared
            .changed
            .wait(state)
            .unwrap_or_else(|p| p.into_inner());
    }
    let until = Instant::now() + grace;
    loop {
        if state.over || state.running.iter().all(|&r| !r) {
            return None;
        }
        let now = Instant::now();
        if now >= until {
            break;
        }
        state = shared
            .changed
            .wait_timeout(state, until - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    let gave_up = state.gave_up.clone().expect("checked above");
    let stuck: Vec<String> = state
        .running
        .iter()
        .enumerate()
        .filter(|&(_, &running)| running)
        .map(|(rank, _)| match rank_phase::of(rank) {
            Some(phase) => format!("rank {rank} is stuck {phase}"),
            None => format!("rank {rank} is stuck before its run started"),
        })
        .collect();
    tracing::error!(
        "rank {}: {}; {} and did not return within {grace:?} (a thread blocked outside a \
         collective cannot be stopped): the process ends without it",
        gave_up.rank,
        gave_up.report,
        stuck.join(", ")
    );
    Some(gave_up.status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn timeout(missing: usize) -> TrainError {
        TrainError::Comm(CommError::Timeout {
            op: "barrier",
            timeout: Duration::from_secs(20),
            missing: vec![missing],
        })
    }

    #[test]
    fn a_rank_still_running_after_another_gave_up_ends_the_process() {
        let (sent, ended) = mpsc::channel();
        let watch = StuckRanks::watch_with(2, Duration::from_millis(50), move |status| {
            sent.send(status).unwrap();
        });
        watch.returned::<()>(1, &Err(timeout(0)));
        let status = ended.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(status, 1);
        drop(watch);
    }

    #[test]
    fn a_signal_give_up_ends_with_the_signal_status() {
        let (sent, ended) = mpsc::channel();
        let watch = StuckRanks::watch_with(2, Duration::from_millis(50), move |status| {
            sent.send(status).unwrap();
        });
        let stopped = TrainError::Comm(CommError::Stopped {
            op: "barrier",
            signal: 15,
            missing: vec![0],
        });
        watch.returned::<()>(1, &Err(stopped));
        assert_eq!(ended.recv_timeout(Duration::from_secs(5)).unwrap(), 143);
    }

    #[test]
    fn nothing_ends_when_every_rank_returns_in_time_or_none_failed() {
        let (sent, ended) = mpsc::channel::<i32>();
        let watch = StuckRanks::watch_with(2, Duration::from_millis(200), move |status| {
            sent.send(status).unwrap();
        });
        watch.returned::<()>(1, &Err(timeout(0)));
        // Rank 0 learns of the failure and returns within the grace.
        let peer = TrainError::Comm(CommError::PeerFailed {
            rank: 1,
            reason: "x".into(),
        });
        watch.returned::<()>(0, &Err(peer));
        std::thread::sleep(Duration::from_millis(400));
        drop(watch);
        assert!(ended.try_recv().is_err());

        // Every rank returns without an error: nothing to watch.
        let (sent, ended) = mpsc::channel::<i32>();
        let watch = StuckRanks::watch_with(2, Duration::from_millis(50), move |status| {
            sent.send(status).unwrap();
        });
        watch.returned(1, &Ok(()));
        std::thread::sleep(Duration::from_millis(200));
        assert!(ended.try_recv().is_err(), "rank 0 may still be evaluating");
        watch.returned(0, &Ok(()));
        drop(watch);
        assert!(ended.try_recv().is_err());
    }

    #[test]
    fn an_error_of_its_own_with_a_rank_that_never_returns_ends_the_process() {
        let (sent, ended) = mpsc::channel();
        let watch = StuckRanks::watch_with(2, Duration::from_millis(50), move |status| {
            sent.send(status).unwrap();
        });
        watch.returned::<()>(1, &Err(TrainError::Batch("bad".into())));
        assert_eq!(ended.recv_timeout(Duration::from_secs(5)).unwrap(), 1);
    }
}
