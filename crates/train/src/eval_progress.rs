//! What a held-out evaluation shows while it runs. SQuAD's dev set or a
//! GLUE task's held-out split takes minutes on a CPU (SNLI's 9,824 pairs:
//! 77 s for MiniLM on this 2-core VM), and the training's bar was frozen
//! meanwhile with nothing said. On a terminal, a bar over the batches this
//! rank evaluates; anywhere else (under `mpirun`, in CI, into a file), a
//! line every half minute, so a short evaluation says nothing.

use std::cell::Cell;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How often a log line is written where no bar can be drawn.
const LINE_EVERY: Duration = Duration::from_secs(30);

/// The progress of one evaluation: created with its batch count, told of
/// each batch done, cleared when dropped.
pub struct EvalProgress {
    bar: ProgressBar,
    /// Where no bar can be drawn: when the last line was written.
    lines: Option<Cell<Instant>>,
    batches: u64,
    done: Cell<u64>,
    start: Instant,
}

impl EvalProgress {
    /// Progress over `batches` batches, shown when `show` (the lead rank
    /// of a run that shows progress).
    pub fn new(batches: usize, show: bool) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let bar = if show && terminal {
            let bar = ProgressBar::new(batches as u64);
            bar.set_style(
                ProgressStyle::with_template(
                    "evaluating [{elapsed_precise}<{eta_precise}] {wide_bar} {pos}/{len} batches",
                )
                .expect("the template is valid"),
            );
            bar
        } else {
            ProgressBar::hidden()
        };
        let now = Instant::now();
        EvalProgress {
            bar,
            lines: (show && !terminal).then(|| Cell::new(now)),
            batches: batches as u64,
            done: Cell::new(0),
            start: now,
        }
    }

    /// Shows nothing.
    pub fn hidden() -> Self {
        EvalProgress::new(0, false)
    }

    /// The batches counted so far.
    #[cfg(test)]
    pub(crate) fn done(&self) -> u64 {
        self.done.get()
    }

    /// One more batch evaluated.
    pub fn batch_done(&self) {
        let done = self.done.get() + 1;
        self.done.set(done);
        self.bar.inc(1);
        if let Some(last) = &self.lines
            && last.get().elapsed() >= LINE_EVERY
            && done < self.batches
        {
            last.set(Instant::now());
            tracing::info!("{}", line(done, self.batches, self.start.elapsed()));
        }
    }
}

impl Drop for EvalProgress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// The log line after `done` of `batches` batches in `elapsed`.
fn line(done: u64, batches: u64, elapsed: Duration) -> String {
    let per_batch = elapsed.as_secs_f64() / done.max(1) as f64;
    let eta = (per_batch * batches.saturating_sub(done) as f64).round() as u64;
    format!(
        "evaluating: {done}/{batches} batches ({:.0}%), ETA {}:{:02}:{:02}",
        100.0 * done as f64 / batches.max(1) as f64,
        eta / 3600,
        eta / 60 % 60,
        eta % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_says_how_far_and_how_long_is_left() {
        // 30 of 120 batches in 60 s: 2 s a batch, 90 left.
        assert_eq!(
            line(30, 120, Duration::from_secs(60)),
            "evaluating: 30/120 batches (25%), ETA 0:03:00"
        );
        assert_eq!(
            line(1, 3, Duration::from_secs(3_700)),
            "evaluating: 1/3 batches (33%), ETA 2:03:20"
        );
    }

    #[test]
    fn hidden_progress_counts_and_writes_nothing() {
        let progress = EvalProgress::hidden();
        progress.batch_done();
        assert!(progress.bar.is_hidden() && progress.lines.is_none());
        assert_eq!(progress.done.get(), 1);
    }
}
