//! Ctrl-C and SIGTERM reach the run, and xtask waits for it to finish.
//!
//! `cargo xtask` starts `terse` (or `mpirun`) as a child. Left to the
//! terminal, SIGINT would end xtask at once while the run was still writing
//! its checkpoint (the prompt back, the "checkpoint written" line after it,
//! a `--resume` typed right away racing the write), and a signal sent to
//! xtask alone (`timeout -s INT`, a batch system's SIGTERM) would never
//! reach the run. So the child runs in a process group of its own, the
//! signal is caught here and passed on to the child exactly once (to its
//! process only: `mpirun` passes it on to its ranks itself, and a rank that
//! got it twice would take the second as "stop now"), and xtask waits for
//! the child and exits with the child's status (130 after Ctrl-C).

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

/// The signal caught and not yet passed on (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    PENDING.store(signal, Ordering::SeqCst);
}

fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            libc::signal(libc::SIGINT, handler);
            libc::signal(libc::SIGTERM, handler);
        }
    });
}

/// Makes `command`'s child the leader of a process group of its own, so the
/// terminal's Ctrl-C reaches xtask alone, which passes it on.
pub fn own_group(command: &mut Command) -> &mut Command {
    install();
    command.process_group(0)
}

/// Passes every signal caught to `child` until dropped (once the child
/// has ended).
pub struct Forwarder {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Forwarder {
    /// Starts passing signals on to `child`; to an `mpirun` child
    /// (`via_mpirun`) as SIGTERM, which mpirun passes on to its ranks and
    /// then waits for them (a SIGINT makes it end the job at once, before
    /// the ranks' checkpoint is written).
    pub fn start(child: &Child, via_mpirun: bool) -> Self {
        install();
        let pid = child.id() as libc::pid_t;
        let done = Arc::new(AtomicBool::new(false));
        let watching = Arc::clone(&done);
        let thread = std::thread::spawn(move || {
            while !watching.load(Ordering::SeqCst) {
                let mut signal = PENDING.swap(0, Ordering::SeqCst);
                if signal != 0 {
                    if via_mpirun {
                        signal = libc::SIGTERM;
                    }
                    eprintln!(
                        "terse: signal {signal} passed on to the run; waiting for it to write its checkpoint and end"
                    );
                    // SAFETY: kill(2) on our own child's pid.
                    unsafe {
                        libc::kill(pid, signal);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self {
            done,
            thread: Some(thread),
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
