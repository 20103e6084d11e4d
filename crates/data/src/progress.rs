//! The progress bar of long data preparation (tokenizing, featurizing,
//! creating examples): drawn on stderr when it is a terminal, hidden in
//! logs and CI.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps labelled `what`.
pub(crate) fn bar(len: usize, what: &str) -> ProgressBar {
    ProgressBar::new(len as u64).with_style(
        ProgressStyle::with_template(&format!("{what} [{{bar:30}}] {{pos}}/{{len}} eta {{eta}}"))
            .expect("a valid template")
            .progress_chars("=> "),
    )
}
