//! The commit a reproduction's results were made at, for machine.txt and
//! the shelf's "finished at" note (apart from both, so the runner that
//! writes the note does not import the report).

use std::process::Command;

/// `HEAD`'s hash, marked when tracked files outside `results/` have
/// uncommitted changes. `results/` is left out because a reproduction
/// rewrites its own tracked results before it writes machine.txt: counting
/// them marked every run as dirty, whatever the code's state.
pub fn commit() -> String {
    let dirty = !output(
        "git",
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":(exclude)results",
        ],
    )
    .is_empty();
    format!(
        "{}{}",
        output("git", &["rev-parse", "HEAD"]),
        if dirty {
            " (with uncommitted changes)"
        } else {
            ""
        }
    )
}

/// A command's trimmed standard output, or nothing when it cannot run or fails.
pub(super) fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
