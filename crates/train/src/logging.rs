//! Levelled, ranked logging through `tracing`.
//!
//! Library code logs with `tracing::{info, warn, error, debug}`; the `terse`
//! binary installs [`init`]'s subscriber, which writes two streams:
//! - the terminal (stderr): info and above, as `terse: …`,
//!   `terse: warning: …`, `terse: error: …` (`TERSE_LOG=debug` shows more);
//! - `terse.log` in the run directory once [`attach_run_dir`] has been
//!   called: every level down to debug, one line per event with the time,
//!   the level and the rank that logged it — thread ranks and MPI processes
//!   alike append to the same file (one `write` per line, `O_APPEND`).
//!
//! The rank comes from [`set_rank`], called by the trainer on each rank's
//! thread (a process started by `mpirun` has one rank, set the same way).
//!
//! While the lead rank's thread draws a progress bar ([`draw_around`]),
//! its terminal lines are written with the bar taken down and drawn again
//! below them (indicatif's `suspend`): a warning mid-run (an fp16
//! overflow) otherwise ran into the bar's line.

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// The name of the log file in a run directory.
pub const LOG_FILE: &str = "terse.log";

thread_local! {
    static RANK: Cell<Option<usize>> = const { Cell::new(None) };
    /// The progress bar this thread draws, if any.
    static BAR: std::cell::RefCell<Option<indicatif::ProgressBar>> =
        const { std::cell::RefCell::new(None) };
    /// Whether this thread is inside the bar's `suspend` already (which
    /// holds the bar's lock: suspending again would wait on itself).
    static SUSPENDED: Cell<bool> = const { Cell::new(false) };
}

/// This thread's terminal lines are written around `bar` until the guard
/// returned is dropped (however the run ends).
pub(crate) fn draw_around(bar: &indicatif::ProgressBar) -> DrawnAround {
    let shown = (!bar.is_hidden()).then(|| bar.clone());
    BAR.with(|b| *b.borrow_mut() = shown);
    DrawnAround
}

/// Lines go straight to stderr again once this is dropped.
pub(crate) struct DrawnAround;

impl Drop for DrawnAround {
    fn drop(&mut self) {
        let _ = BAR.try_with(|b| b.borrow_mut().take());
    }
}

/// `work` with `bar` taken down (indicatif's `suspend`), this thread's
/// terminal lines then written as they come.
pub(crate) fn suspended<R>(bar: &indicatif::ProgressBar, work: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SUSPENDED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SUSPENDED.with(|s| s.replace(true)));
    bar.suspend(work)
}

/// Standard error, around this thread's bar (see the module's doc).
struct Terminal;

impl Write for Terminal {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        // try_with: a line logged while this thread's locals are torn down
        // goes straight out.
        let bar = BAR.try_with(|b| b.borrow().clone()).ok().flatten();
        match bar {
            Some(bar) if !SUSPENDED.try_with(Cell::get).unwrap_or(true) => {
                suspended(&bar, || io::stderr().write_all(bytes))?;
            }
            _ => io::stderr().write_all(bytes)?,
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// The open log file and its path (one run per process).
static FILE: Mutex<Option<(PathBuf, File)>> = Mutex::new(None);

/// Tags this thread's events with `rank`.
pub fn set_rank(rank: usize) {
    RANK.with(|r| r.set(Some(rank)));
}

/// The rank this thread's events are tagged with, if set.
pub fn rank() -> Option<usize> {
    RANK.with(Cell::get)
}

/// Installs the subscriber (once per process; later calls do nothing).
/// `TERSE_LOG` (`error`, `warn`, `info`, `debug`, `trace`) sets the
/// terminal's level; the file always gets debug and above.
pub fn init() {
    let terminal = std::env::var("TERSE_LOG")
        .ok()
        .and_then(|level| level.parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::INFO);
    let stderr = tracing_subscriber::fmt::layer()
        .event_format(LineStart::Terminal)
        .with_writer(|| Terminal)
        .with_filter(terminal);
    let file = tracing_subscriber::fmt::layer()
        .event_format(LineStart::File)
        .with_writer(|| RunLog)
        .with_filter(LevelFilter::DEBUG);
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(file)
        .try_init();
}

/// Appends this process's events to `dir/terse.log` from now on (the
/// directory is created if needed; attaching the same directory twice, as
/// every thread rank does, opens it once).
pub fn attach_run_dir(dir: &Path) -> io::Result<()> {
    let path = dir.join(LOG_FILE);
    let mut file = FILE.lock().unwrap_or_else(|e| e.into_inner());
    if file.as_ref().is_some_and(|(open, _)| *open == path) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let opened = OpenOptions::new().create(true).append(true).open(&path)?;
    *file = Some((path, opened));
    Ok(())
}

/// How a line starts: on the terminal `terse: ` and the level where it is
/// not info; in the file the time (seconds since the epoch), the level and
/// the rank. The message and fields follow either way.
#[derive(Debug, Clone, Copy)]
enum LineStart {
    Terminal,
    File,
}

impl<S, N> FormatEvent<S, N> for LineStart
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let level = *event.metadata().level();
        match self {
            LineStart::Terminal => {
                let label = match level {
                    Level::INFO => "",
                    Level::WARN => "warning: ",
                    Level::ERROR => "error: ",
                    Level::DEBUG => "debug: ",
                    Level::TRACE => "trace: ",
                };
                write!(writer, "terse: {label}")?;
            }
            LineStart::File => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                let rank = RANK
                    .with(Cell::get)
                    .map_or("-".to_string(), |r| r.to_string());
                write!(
                    writer,
                    "{}.{:03} {level:<5} rank {rank}: ",
                    now.as_secs(),
                    now.subsec_millis()
                )?;
            }
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// A writer into the attached log file; writes nothing before
/// [`attach_run_dir`]. `fmt` formats a whole line first and writes it with
/// one call, so lines of different ranks never interleave.
struct RunLog;

impl Write for RunLog {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let mut file = FILE.lock().unwrap_or_else(|e| e.into_inner());
        match file.as_mut() {
            Some((_, file)) => file.write_all(bytes).map(|()| bytes.len()),
            None => Ok(bytes.len()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
