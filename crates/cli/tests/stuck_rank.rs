//! A rank that stops answering (SIGSTOP: alive, holding its connections,
//! never arriving) under `mpirun`: the other rank gives up at the deadline,
//! naming it, and the whole job ends; a SIGTERM to the waiting rank ends
//! the job too, ten seconds later, without a checkpoint (the ranks are not
//! at one step); `kill -9` of one rank ends the job, and `--resume` ends
//! bit-identical to an uninterrupted run. Real `mpirun` processes,
//! BERT-Tiny.

mod common;

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// `mpirun -np 2 terse pretrain …` of `steps` steps with `timeout_s` as the
/// collective deadline, its output into `log`.
fn job(run_dir: &Path, steps: u64, timeout_s: u64, log: &Path, extra: &[&str]) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new("mpirun")
        .args(["--oversubscribe", "-np", "2", "-x", "RAYON_NUM_THREADS=1"])
        .arg(env!("CARGO_BIN_EXE_terse"))
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(["--set", &format!("train.steps={steps}")])
        .args(["--set", "train.eval_every=0"])
        .args(["--set", &format!("train.collective_timeout_s={timeout_s}")])
        .arg("--run-dir")
        .arg(run_dir)
        .args(extra)
        .current_dir(common::workspace())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("mpirun starts (apt-get install openmpi-bin)")
}

/// The pid of MPI rank `rank` of the job writing `run_dir`, once it has
/// logged step `step`.
fn rank_pid(run_dir: &Path, rank: usize, step: u64, job: &mut Child) -> i32 {
    let start = Instant::now();
    let metrics = run_dir.join("metrics.jsonl");
    let logged = format!("\"step\":{step},");
    while !std::fs::read_to_string(&metrics).is_ok_and(|m| m.contains(&logged)) {
        assert!(job.try_wait().unwrap().is_none(), "the job ended early");
        assert!(start.elapsed() < Duration::from_secs(300), "no step {step}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    let marker = run_dir.display().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let has = |bytes: &[u8], what: &str| bytes.split(|&b| b == 0).any(|p| p == what.as_bytes());
        if has(&cmdline, &marker)
            && has(&environ, &want)
            && !String::from_utf8_lossy(&cmdline).starts_with("mpirun")
        {
            return pid;
        }
    }
    panic!("no process of rank {rank} found");
}

fn signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Waits for `job` (at most `limit`), returning its status and the seconds.
fn ends_within(job: &mut Child, limit: Duration) -> (std::process::ExitStatus, f64) {
    let start = Instant::now();
    loop {
        if let Some(status) = job.try_wait().unwrap() {
            return (status, start.elapsed().as_secs_f64());
        }
        if start.elapsed() > limit {
            signal(-(job.id() as i32), libc::SIGKILL);
            panic!("the job still ran {limit:?} after the fault");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_stopped_rank_ends_the_job_at_the_deadline_naming_it() {
    let scratch = tempfile::Builder::new()
        .prefix("terse-stuck-")
        .tempdir()
        .unwrap();
    let run_dir = scratch.path().join("run");
    let log = scratch.path().join("job.log");
    let mut job = job(&run_dir, 400, 5, &log, &[]);
    let stuck = rank_pid(&run_dir, 1, 3, &mut job);
    signal(stuck, libc::SIGSTOP);
    let (status, seconds) = ends_within(&mut job, Duration::from_secs(5 + 60));
    signal(stuck, libc::SIGCONT);
    signal(stuck, libc::SIGKILL);
    let output = std::fs::read_to_string(&log).unwrap();
    let line = output
        .lines()
        .find(|l| l.contains("did not arrive"))
        .unwrap_or_else(|| panic!("no rank named:\n{output}"));
    println!("SIGSTOP of rank 1, deadline 5 s: job ended {status} after {seconds:.1} s: {line}");
    assert!(!status.success());
    assert!(
        line.contains("rank 0") && line.contains("rank 1 did not arrive within 5s"),
        "{line}"
    );
}

#[test]
fn sigterm_while_waiting_for_a_stopped_rank_ends_the_job_without_a_checkpoint() {
    let scratch = tempfile::Builder::new()
        .prefix("terse-stuck-term-")
        .tempdir()
        .unwrap();
    let run_dir = scratch.path().join("run");
    let log = scratch.path().join("job.log");
    let mut job = job(&run_dir, 400, 600, &log, &[]);
    let stuck = rank_pid(&run_dir, 1, 3, &mut job);
    let waiting = rank_pid(&run_dir, 0, 3, &mut job);
    signal(stuck, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(1));
    let checkpoints_before = std::fs::read_dir(run_dir.join("checkpoints"))
        .map(|d| d.count())
        .unwrap_or(0);
    signal(waiting, libc::SIGTERM);
    let (status, seconds) = ends_within(&mut job, Duration::from_secs(60));
    signal(stuck, libc::SIGCONT);
    signal(stuck, libc::SIGKILL);
    let output = std::fs::read_to_string(&log).unwrap();
    let line = output
        .lines()
        .find(|l| l.contains("stopped by signal"))
        .unwrap_or_else(|| panic!("no stop reported:\n{output}"));
    println!(
        "SIGTERM to rank 0 waiting for a stopped rank 1: job ended {status} after {seconds:.1} s: {line}"
    );
    assert!(!status.success());
    assert!(
        line.contains("stopped by signal 15 while waiting for rank 1"),
        "{line}"
    );
    let checkpoints_after = std::fs::read_dir(run_dir.join("checkpoints"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(
        checkpoints_after, checkpoints_before,
        "a checkpoint was written"
    );
}

#[test]
fn kill_9_of_one_rank_ends_the_job_and_the_resume_ends_bit_identical() {
    const STEPS: u64 = 12;
    let scratch = tempfile::Builder::new()
        .prefix("terse-kill-rank-")
        .tempdir()
        .unwrap();
    let final_weights = |run_dir: &Path, rank: usize| {
        common::tensors(
            &common::checkpoint(run_dir, STEPS).join(format!("model-rank-{rank}.safetensors")),
        )
    };
    let whole = scratch.path().join("whole");
    let log = scratch.path().join("whole.log");
    let status = job(&whole, STEPS, 600, &log, &[]).wait().unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );

    // Rank 1 killed once step 5's checkpoint is committed (step 6 logged).
    let run_dir = scratch.path().join("run");
    let log = scratch.path().join("job.log");
    let mut running = job(&run_dir, STEPS, 600, &log, &[]);
    let victim = rank_pid(&run_dir, 1, 6, &mut running);
    signal(victim, libc::SIGKILL);
    let (status, seconds) = ends_within(&mut running, Duration::from_secs(60));
    let output = std::fs::read_to_string(&log).unwrap();
    // mpirun's own report names the rank and the signal.
    let line = output
        .lines()
        .find(|l| l.contains("rank 1") && l.contains("signal 9"))
        .unwrap_or_else(|| panic!("the killed rank is not named:\n{output}"));
    println!("kill -9 of rank 1: job ended {status} after {seconds:.1} s: {line}");
    assert!(!status.success(), "{output}");
    assert!(
        !common::checkpoint(&run_dir, STEPS).exists(),
        "the job finished before the kill"
    );
    let log = scratch.path().join("resumed.log");
    let status = job(&run_dir, STEPS, 600, &log, &["--resume"])
        .wait()
        .unwrap();
    let output = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{output}");
    assert!(output.contains("resumed from"), "{output}");
    for rank in 0..2 {
        assert!(
            final_weights(&run_dir, rank) == final_weights(&whole, 0),
            "rank {rank}: the resumed run differs from the uninterrupted one"
        );
    }
}
