//! SIGTERM to `cargo xtask pretrain --ranks 2` (what a batch system or
//! `timeout` sends): xtask passes it to the ranks, which agree on a step,
//! checkpoint it and say so; xtask waits and exits 143; `--resume` goes on
//! from that step. The real xtask binary, `mpirun` and BERT-Tiny.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn xtask(run_dir: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_xtask"));
    command
        .args(["pretrain", "bert-tiny", "--ranks", "2", "--run-dir"])
        .arg(run_dir)
        .args(["--set", "train.steps=60", "--set", "train.eval_every=0"])
        // Past the shipped schedule's 40 steps, which terse refuses alone.
        .args(["--set", "schedule.total_steps=60"])
        .args(extra)
        .current_dir(workspace())
        .env("NO_COLOR", "1");
    command
}

#[test]
fn sigterm_to_xtask_stops_every_rank_at_one_checkpointed_step() {
    let scratch = tempfile::Builder::new()
        .prefix("terse-xtask-signal-")
        .tempdir()
        .unwrap();
    let run_dir = scratch.path().join("run");
    let mut job = xtask(&run_dir, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = run_dir.join("metrics.jsonl");
    let start = Instant::now();
    while !std::fs::read_to_string(&metrics).is_ok_and(|m| m.contains("\"step\":6,")) {
        assert!(job.try_wait().unwrap().is_none(), "ended before the signal");
        assert!(start.elapsed() < Duration::from_secs(600), "no step 6");
        std::thread::sleep(Duration::from_millis(20));
    }
    let signalled = Instant::now();
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(job.id() as i32, libc::SIGTERM) }, 0);
    let output = job.wait_with_output().unwrap();
    let seconds = signalled.elapsed().as_secs_f64();
    let message = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let line = message
        .lines()
        .find(|l| l.contains("stopped by a signal at step"))
        .unwrap_or_else(|| panic!("no rank said where it stopped:\n{message}"));
    println!(
        "SIGTERM to xtask over 2 mpirun ranks: {} after {seconds:.1} s: {line}",
        output.status
    );
    assert_eq!(output.status.code(), Some(143), "{message}");
    // The line names the command the user typed, in its resume form (the
    // xtask binary stands in for `cargo xtask` here).
    assert!(
        line.contains("; resume with: cargo xtask pretrain bert-tiny --ranks 2 --run-dir ")
            && line.ends_with(
                " --set train.steps=60 --set train.eval_every=0 --set schedule.total_steps=60 \
                 --resume"
            ),
        "{line}"
    );
    let at: u64 = line
        .split("stopped by a signal at step ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let checkpoint = run_dir.join(format!("checkpoints/step-{at:08}"));
    for file in ["trainer.json", "rank-0.json", "rank-1.json"] {
        assert!(checkpoint.join(file).exists(), "no {file} in step {at}");
    }
    let resumed = xtask(&run_dir, &["--resume"]).output().unwrap();
    let message = format!(
        "{}{}",
        String::from_utf8_lossy(&resumed.stdout),
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert!(resumed.status.success(), "{message}");
    assert!(message.contains(&format!("(step {at},")), "{message}");
}
