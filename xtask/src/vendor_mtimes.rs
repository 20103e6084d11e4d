//! The vendored crates' file times set to their last commit's time, so a
//! fresh clone building into a target directory that already holds them
//! (CI: a new clone each run, one target directory) does not rebuild
//! burn's whole GPU stack.
//!
//! `vendor/cubecl-llvm-stub` is a path dependency under cubecl-cuda, and
//! cargo decides whether a path dependency changed by its files' times: a
//! clone gives every file the time of the clone, so the stub, and cubecl
//! and burn above it, would compile again (~10 minutes on 2 cores). Set to
//! the time of the commit that last changed them, the files are older than
//! any build made since, so cargo rebuilds them only when that commit is
//! newer than the build. Files with uncommitted changes are left alone (an
//! edit must rebuild).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

/// Where the vendored crates live.
const VENDOR: &str = "vendor";

/// Sets the times of `vendor/`'s files to the last commit that touched
/// them, when this is a git checkout and they are unchanged; otherwise does
/// nothing (a tarball, no git: cargo rebuilds as it would have).
pub fn pin() {
    let Some(root) = Path::new(env!("CARGO_MANIFEST_DIR")).parent() else {
        return;
    };
    if !root.join(VENDOR).is_dir() {
        return;
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    // Uncommitted changes (or untracked files) under vendor/: leave them.
    match git(&["status", "--porcelain", "--", VENDOR]) {
        Some(changes) if changes.is_empty() => {}
        _ => return,
    }
    let Some(seconds) =
        git(&["log", "-1", "--format=%ct", "--", VENDOR]).and_then(|s| s.parse::<u64>().ok())
    else {
        return;
    };
    let committed = SystemTime::UNIX_EPOCH + Duration::from_secs(seconds);
    let Some(files) = git(&["ls-files", "--", VENDOR]) else {
        return;
    };
    for file in files.lines() {
        if let Ok(handle) = std::fs::File::options().write(true).open(root.join(file)) {
            let _ = handle.set_modified(committed);
        }
    }
}
