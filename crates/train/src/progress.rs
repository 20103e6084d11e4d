//! What a running training shows: on a terminal, a bar with elapsed time,
//! ETA, steps and the live loss; anywhere else (under `mpirun`, in CI, into
//! a file), where a bar is invisible, a plain line every few steps.

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::metrics::StepRecord;

/// Plain progress lines, about twenty per run, for logs that are not a
/// terminal.
pub(crate) struct ProgressLines {
    every: u64,
    steps: u64,
    first: u64,
    start: Instant,
}

impl ProgressLines {
    /// Lines for steps `first + 1..=steps` when `show` and standard error
    /// is not a terminal (the bar covers the terminal).
    pub(crate) fn new(steps: u64, first: u64, show: bool) -> Option<Self> {
        (show && !std::io::stderr().is_terminal()).then(|| ProgressLines {
            every: steps.div_ceil(20).max(1),
            steps,
            first,
            start: Instant::now(),
        })
    }

    /// Counts time from now: the steps' own, after what came before the
    /// first (the evaluation of the starting point).
    pub(crate) fn restart(&mut self) {
        self.start = Instant::now();
    }

    /// Logs step `t`'s line when it is due (every `steps / 20` steps and the
    /// last).
    pub(crate) fn step(&self, record: &StepRecord) {
        let t = record.step;
        if !t.is_multiple_of(self.every) && t != self.steps {
            return;
        }
        let done = (t - self.first).max(1);
        let per_step = self.start.elapsed().as_secs_f64() / done as f64;
        let eta = per_step * (self.steps - t) as f64;
        tracing::info!(
            "step {t}/{} ({:.0}%): {}, {per_step:.2} s/step, ETA {}",
            self.steps,
            100.0 * t as f64 / self.steps.max(1) as f64,
            step_state(record),
            clock(eta)
        );
    }
}

/// What a step's line (and the bar's message) says of it: the loss, the
/// learning rate, the stage, the step's throughput and, in fp16, the loss
/// scale (which otherwise shows only in overflow warnings).
pub(crate) fn step_state(record: &StepRecord) -> String {
    let mut state = format!(
        "loss {:.4}, lr {:.3e}, {}, {:.1} samples/s",
        record.loss, record.lr, record.stage, record.samples_per_s
    );
    if let Some(scale) = record.loss_scale {
        state.push_str(&format!(", loss scale {scale}"));
    }
    state
}

/// `h:mm:ss`.
fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// A bar over `steps` steps, or a hidden one when `show` is false.
pub(crate) fn step_bar(steps: u64, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}<{eta_precise}] {wide_bar} {pos}/{len} {msg}",
        )
        .expect("the template is valid"),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_shows_its_loss_lr_stage_throughput_and_loss_scale() {
        let mut record = StepRecord::example(3, 7.12345, 0.00025, "compressed", 123.45);
        assert_eq!(
            step_state(&record),
            "loss 7.1235, lr 2.500e-4, compressed, 123.5 samples/s"
        );
        record.loss_scale = Some(65536.0);
        assert!(step_state(&record).ends_with(", loss scale 65536"));
    }

    #[test]
    fn clock_reads_hours_minutes_seconds() {
        assert_eq!(clock(0.4), "0:00:00");
        assert_eq!(clock(3_725.0), "1:02:05");
    }
}
