//! SIGINT and SIGTERM end a run cleanly: the handler only raises a flag, the
//! loop sees it after the current step, all ranks agree on it (it travels in
//! the per-step loss allreduce), and the run writes a checkpoint and exits.
//! A second signal while that happens is not caught again: the default
//! action (termination) applies, as a user pressing Ctrl-C twice expects.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(signal: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
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
}

/// Whether a stop was requested.
pub fn requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
