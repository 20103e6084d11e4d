//! SIGINT and SIGTERM end a run cleanly: the handler only raises a flag, the
//! loop sees it after the current step, all ranks agree on it (it travels in
//! the per-step loss allreduce), and the run writes a checkpoint and exits.
//! A second signal while that happens is not caught again: the default
//! action (termination, status 130 or 143) applies, as a user pressing
//! Ctrl-C twice expects. The first signal says so on stderr at once (rank 0
//! of an MPI job only), since the step, the checkpoint or, where ranks are
//! stuck, the wait for them (terse-comm's [`STOP_GRACE`]) comes first.
//!
//! [`STOP_GRACE`]: terse_comm::watchdog::STOP_GRACE

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The signal received, 0 for none.
static STOP: AtomicI32 = AtomicI32::new(0);

/// Whether this process says that a stop was asked for (one line per job:
/// not on MPI ranks other than 0).
static SAYS: AtomicBool = AtomicBool::new(true);

/// What the first signal prints: written from the handler, so a fixed text
/// (write(2) is async-signal-safe, formatting is not).
const ASKED: &[u8] = b"terse: stop requested: the run stops after this step with a checkpoint \
(ranks that do not arrive within 10 s, 120 s while a checkpoint is written, end it without one); a \
second signal ends it at once\n";

extern "C" fn on_signal(signal: libc::c_int) {
    let first = STOP.swap(signal, Ordering::SeqCst) == 0;
    // SAFETY: write(2) on stderr and resetting a disposition to the
    // default are async-signal-safe.
    unsafe {
        if first && SAYS.load(Ordering::SeqCst) {
            libc::write(2, ASKED.as_ptr().cast(), ASKED.len());
        }
        libc::signal(signal, libc::SIG_DFL);
    }
}

/// Installs the handler for SIGINT and SIGTERM (idempotent).
pub fn install() {
    let rank = std::env::var("OMPI_COMM_WORLD_RANK").unwrap_or_default();
    SAYS.store(rank.is_empty() || rank == "0", Ordering::SeqCst);
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic and resets its own
    // disposition, both async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
    // A rank waiting in a collective for ranks that do not come sees the
    // signal there too (terse-comm's watchdog), not only after its step.
    terse_comm::watchdog::set_stop_source(received);
}

/// Whether a stop was requested.
pub fn requested() -> bool {
    STOP.load(Ordering::SeqCst) != 0
}

/// The signal that requested the stop, if this process received one (an
/// MPI rank may learn of another rank's signal through the step's
/// allreduce instead).
pub fn received() -> Option<i32> {
    Some(STOP.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_signal_s_line_states_the_stop_grace() {
        let line = std::str::from_utf8(ASKED).unwrap();
        let grace = terse_comm::watchdog::STOP_GRACE.as_secs();
        assert!(line.contains(&format!("within {grace} s")), "{line}");
        assert!(line.ends_with('\n') && line.lines().count() == 1);
    }
}
