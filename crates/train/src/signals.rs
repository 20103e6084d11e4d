//! SIGINT and SIGTERM end a run cleanly: the handler only raises a flag, the
//! loop sees it after the current step, all ranks agree on it (it travels in
//! the per-step loss allreduce), and the run writes a checkpoint and exits.
//! A second signal while that happens is not caught again: the default
//! action (termination) applies, as a user pressing Ctrl-C twice expects.

use std::sync::atomic::{AtomicI32, Ordering};

/// The signal received, 0 for none.
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    STOP.store(signal, Ordering::SeqCst);
    // SAFETY: resetting a disposition to the default is async-signal-safe.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
    }
}

/// Installs the handler for SIGINT and SIGTERM (idempotent).
pub fn install() {
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
