//! Faults around a run directory, with the real `terse` binary: a second
//! run started on a directory another run is using, a fresh run in a
//! directory that holds an earlier one, and a disk that fills up while a
//! checkpoint is written. Each case prints its outcome (exit status,
//! seconds, the message) for the README's reliability table.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn terse(run_dir: &Path, steps: u64, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_terse"));
    command
        .args(["pretrain", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(["--set", &format!("train.steps={steps}")])
        .args(["--set", "train.eval_every=0"])
        // A run long enough to be stopped mid-way goes past the shipped
        // schedule's 40 steps, which terse refuses (its rate is 0 there).
        .args(["--set", &format!("schedule.total_steps={}", steps.max(40))])
        .arg("--run-dir")
        .arg(run_dir)
        .args(extra)
        .current_dir(common::workspace());
    command
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The last line of `text` that says `error`.
fn error_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| l.contains("error"))
        .unwrap_or("")
}

/// Runs `command`, which must exit 1, printing `what` with its exit status,
/// seconds and error line: its standard error.
fn exits_1(what: &str, command: &mut Command) -> String {
    let start = Instant::now();
    let output = command.output().unwrap();
    let seconds = start.elapsed().as_secs_f64();
    let message = stderr(&output);
    println!(
        "{what}: exit {:?} after {seconds:.1} s: {}",
        output.status.code(),
        error_line(&message)
    );
    assert_eq!(output.status.code(), Some(1), "{message}");
    message
}

#[test]
fn a_run_directory_belongs_to_one_run() {
    let scratch = tempfile::tempdir().unwrap();
    let run_dir = scratch.path().join("run");

    // A long first run; once it has logged a step, a second one on the same
    // directory is refused, naming the first one's pid.
    let first_log = scratch.path().join("first.log");
    let mut first = terse(&run_dir, 400, &[])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&first_log).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !run_dir.join("metrics.jsonl").exists() {
        assert!(first.try_wait().unwrap().is_none(), "the first run ended");
        assert!(start.elapsed() < Duration::from_secs(300), "no step logged");
        std::thread::sleep(Duration::from_millis(50));
    }
    let message = exits_1(
        "second run on a used directory",
        &mut terse(&run_dir, 400, &["--resume"]),
    );
    assert!(
        message.contains(&format!("another run is using it (pid {} on ", first.id())),
        "{message}"
    );
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first run was disturbed"
    );

    // SIGINT ends the first run with a checkpoint (130).
    // SAFETY: kill(2) on a child this test started.
    assert_eq!(unsafe { libc::kill(first.id() as i32, libc::SIGINT) }, 0);
    let status = first.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    // It ends saying how to continue: its own command, with --resume; and
    // the checkpoint it names is there.
    let log = std::fs::read_to_string(&first_log).unwrap();
    let last = log.lines().last().unwrap_or("");
    println!("Ctrl-C: exit 130, last line: {last}");
    let exe = env!("CARGO_BIN_EXE_terse");
    assert!(
        last.contains(&format!(
            "resume with: {exe} pretrain --config configs/pretrain-bert-tiny.toml"
        )) && last.ends_with(" --resume"),
        "{log}"
    );
    let checkpoint = last
        .split("checkpoint written to ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no checkpoint in: {last}"));
    assert!(
        Path::new(checkpoint).join("trainer.json").exists(),
        "{last}"
    );

    // A fresh run there is refused until told what to do with the old one.
    let message = exits_1(
        "fresh run over an earlier run",
        &mut terse(&run_dir, 6, &[]),
    );
    assert!(
        message.contains("it holds an earlier run (") && message.contains("--overwrite"),
        "{message}"
    );
    let over = terse(&run_dir, 3, &["--overwrite"]).output().unwrap();
    let log = stderr(&over);
    assert!(over.status.success(), "{log}");
    // Standard error is not a terminal here (as under mpirun): plain
    // progress lines instead of a bar, each step of a 3-step run.
    for t in 1..=3 {
        assert!(log.contains(&format!("step {t}/3 (")), "{log}");
    }
    let steps: Vec<u64> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|line| line.get("loss").is_some())
        .filter_map(|line| line["step"].as_u64())
        .collect();
    assert_eq!(steps, [1, 2, 3], "the earlier run's step lines are gone");
}

/// A small tmpfs mounted at `mount` for the life of the returned guard, or
/// `None` (printing why) where this process may not mount one.
fn small_disk<'a>(mount: &'a Path, size: &str) -> Option<impl Drop + use<'a>> {
    std::fs::create_dir_all(mount).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(mount)
        .output();
    if !mounted.is_ok_and(|o| o.status.success()) {
        println!("skipped: cannot mount a tmpfs here (not root, or no mount(8))");
        return None;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    Some(Unmount(mount))
}

/// A disk that holds this checkpoint but not the next: the warning comes a
/// checkpoint interval ahead, naming the step, the sizes and where, and
/// not before; the run then stops at that step as the warning said. Needs
/// root, as the full-disk case does.
#[test]
fn a_disk_too_small_for_the_next_checkpoint_is_named_ahead() {
    let scratch = tempfile::tempdir().unwrap();
    let mount = scratch.path().join("disk");
    // BERT-Tiny's checkpoint on one rank (1-bit LAMB), 68 MiB: 17.7 MB of
    // weights and 53.2 MB of optimizer state. 150 MB hold two (the first
    // leaves 82 MiB free, the second 14) but not three.
    let Some(_unmount) = small_disk(&mount, "150m") else {
        return;
    };
    let run_dir = mount.join("run");
    let message = exits_1(
        "a disk too small for the next checkpoint",
        &mut terse(&run_dir, 3, &["--set", "train.checkpoint_every=1"]),
    );
    let warnings: Vec<&str> = message
        .lines()
        .filter(|l| l.contains("will not fit"))
        .collect();
    assert_eq!(warnings.len(), 1, "{message}");
    let warning = warnings[0];
    println!("{warning}");
    assert!(
        warning.contains("warning")
            && warning.contains(
                "the next checkpoint (step 3) will not fit: it needs about 68.0 MiB where \
                 rank 0 writes it ("
            )
            && warning.contains("continues from step 2"),
        "{warning}"
    );
    let at = |needle: &str| {
        message
            .find(needle)
            .unwrap_or_else(|| panic!("{needle}: {message}"))
    };
    assert!(at("step 2/3") < at("will not fit") && at("will not fit") < at("step 3/3"));
    assert!(message.contains("No space left on device"), "{message}");
    assert!(common::checkpoint(&run_dir, 2).exists());
}

/// A disk too small for even the first checkpoint: said before step 1,
/// from the sizes of the model and the optimizer state, rather than when
/// the checkpoint's step comes (hours in, on a real run).
#[test]
fn a_first_checkpoint_that_will_not_fit_is_named_before_step_1() {
    let scratch = tempfile::tempdir().unwrap();
    let mount = scratch.path().join("disk");
    let Some(_unmount) = small_disk(&mount, "60m") else {
        return;
    };
    let run_dir = mount.join("run");
    let message = exits_1(
        "a disk too small for the first checkpoint",
        &mut terse(&run_dir, 3, &["--set", "train.checkpoint_every=2"]),
    );
    let warning = message
        .lines()
        .find(|l| l.contains("will not fit"))
        .unwrap_or_else(|| panic!("no warning: {message}"));
    println!("{warning}");
    // 17.7 MB of weights and 53.2 MB of optimizer state: 67.7 MiB.
    assert!(
        warning.contains(
            "the first checkpoint (step 2) will not fit: it needs about 68.0 MiB where \
             rank 0 writes it ("
        ) && warning.contains("there is no checkpoint to resume from"),
        "{warning}"
    );
    assert!(
        message.find("will not fit") < message.find("step 1/3"),
        "{message}"
    );
    assert!(message.contains("No space left on device"), "{message}");
}

/// A checkpoint that does not fit on the disk: the run ends with an error
/// naming the file, leaves no checkpoint that looks whole, and the next run
/// there removes the half-written one. Needs root to mount a small tmpfs;
/// otherwise it says why and checks nothing.
#[test]
fn a_full_disk_during_a_checkpoint_fails_cleanly() {
    let scratch = tempfile::tempdir().unwrap();
    let mount = scratch.path().join("disk");
    // BERT-Tiny's checkpoint: 17.7 MB of weights and 53.2 MB of optimizer
    // state; 24 MB holds the run's logs and config but not the checkpoint.
    let Some(_unmount) = small_disk(&mount, "24m") else {
        return;
    };
    let run_dir = mount.join("run");
    let message = exits_1(
        "disk full during a checkpoint",
        &mut terse(&run_dir, 2, &[]),
    );
    assert!(
        message.contains("No space left on device") && message.contains(".safetensors"),
        "{message}"
    );
    assert!(
        !common::checkpoint(&run_dir, 2).exists(),
        "a checkpoint that looks whole was left"
    );
    let half = run_dir.join("checkpoints/.step-00000002.rank-0.tmp");
    assert!(
        half.exists(),
        "the half-written checkpoint is where it was written"
    );
    // With room again, `--resume` clears the half-written checkpoint, finds
    // none whole, starts from step 0 and finishes.
    let grown = Command::new("mount")
        .args(["-o", "remount,size=256m"])
        .arg(&mount)
        .status()
        .unwrap();
    assert!(grown.success());
    let resumed = terse(&run_dir, 2, &["--resume"]).output().unwrap();
    let message = stderr(&resumed);
    assert!(resumed.status.success(), "{message}");
    assert!(
        message.contains("a checkpoint an earlier run did not finish"),
        "{message}"
    );
    assert!(!half.exists());
    assert!(common::checkpoint(&run_dir, 2).exists());
    // And ends where a run that never met a full disk ends.
    let whole = scratch.path().join("whole");
    let reference = terse(&whole, 2, &[]).output().unwrap();
    assert!(reference.status.success(), "{}", stderr(&reference));
    let weights =
        |dir: &Path| common::tensors(&common::checkpoint(dir, 2).join("model-rank-0.safetensors"));
    assert!(
        weights(&run_dir) == weights(&whole),
        "the run after the full disk differs from an uninterrupted one"
    );
}
