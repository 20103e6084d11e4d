//! Ctrl-C and SIGTERM reach the run, and xtask waits for it to finish.
//!
//! `cargo xtask` starts `terse` (or `mpirun`) as a child. Left to the
//! terminal, SIGINT would end xtask at once while the run was still writing
//! its checkpoint (the prompt back, the "checkpoint written" line after it,
//! a `--resume` typed right away racing the write), and a signal sent to
//! xtask alone (`timeout -s INT`, a batch system's SIGTERM) would never
//! reach the run. So the child runs in a process group of its own, the
//! signal is caught here and passed on exactly once (a rank that got it
//! twice would take the second as "stop now"), and xtask waits for the
//! child and exits with the child's status (130 after Ctrl-C).
//!
//! Under `mpirun` the signal goes to the ranks it started on this machine,
//! not to mpirun: mpirun, signalled, stops forwarding the ranks' output and
//! kills them one second later (`odls_base_sigkill_timeout`), which cuts a
//! large model's checkpoint short and hides the ranks' "stopped at step N"
//! line. Signalled themselves, the ranks agree on a step, checkpoint it and
//! end, rank 0 with 143 (the others with 0, so that mpirun does not kill
//! rank 0 before its line), and mpirun reports that status. Only when no rank runs here
//! (every host elsewhere) does mpirun get the signal, as SIGTERM.

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
    /// Starts passing signals on to `child`, or, for an `mpirun` child
    /// (`via_mpirun`), to the ranks it started here.
    pub fn start(child: &Child, via_mpirun: bool) -> Self {
        install();
        let pid = child.id() as libc::pid_t;
        let done = Arc::new(AtomicBool::new(false));
        let watching = Arc::clone(&done);
        let thread = std::thread::spawn(move || {
            while !watching.load(Ordering::SeqCst) {
                let signal = PENDING.swap(0, Ordering::SeqCst);
                if signal != 0 {
                    let ranks = if via_mpirun {
                        children(pid)
                    } else {
                        Vec::new()
                    };
                    let targets = if ranks.is_empty() {
                        let signal = if via_mpirun { libc::SIGTERM } else { signal };
                        vec![(pid, signal)]
                    } else {
                        ranks.into_iter().map(|rank| (rank, signal)).collect()
                    };
                    eprintln!(
                        "terse: signal {signal} passed on to the run; waiting for it to write its checkpoint and end"
                    );
                    for (target, signal) in targets {
                        // SAFETY: kill(2) on our child or on a process it
                        // started.
                        unsafe {
                            libc::kill(target, signal);
                        }
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

/// The processes whose parent is `parent` (from `/proc`): the ranks an
/// `mpirun` started on this machine.
fn children(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: libc::pid_t = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
            let ppid: libc::pid_t = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_children_of_a_process_are_found() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let found = children(std::process::id() as libc::pid_t);
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&(child.id() as libc::pid_t)), "{found:?}");
    }
}
