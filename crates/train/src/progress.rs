//! The progress bar every training run shows: elapsed time, ETA, steps and
//! the live loss in the message.

use indicatif::{ProgressBar, ProgressStyle};

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
