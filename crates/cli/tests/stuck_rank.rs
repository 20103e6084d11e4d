//! A rank that stops answering (SIGSTOP: alive, holding its connections,
//! never arriving) under `mpirun`: the other rank gives up at the deadline,
//! naming it, and the whole job ends; a SIGTERM to the waiting rank ends
//! the job too, ten seconds later, without a checkpoint (the ranks are not
//! at one step); `kill -9` of one rank ends the job, and `--resume` ends
//! bit-identical to an uninterrupted run. A rank stuck before the first
//! step, outside any collective (rank 0 blocked opening the run's
//! `metrics.jsonl`, a FIFO nobody writes: a hung network filesystem), on 2
//! local ranks and on 2 `mpirun` processes: the job ends within the
//! deadline + 10 s naming the rank and where it was, and a first SIGTERM
//! during the hang (to the process, or to every MPI rank as `cargo xtask`
//! passes it on) ends it within the stop grace + 10 s without a
//! checkpoint, and a second one ends it at once. Real `mpirun` processes
//! and real `terse` processes, BERT-Tiny.

mod common;

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A scratch directory, removed when dropped, with the paths of a job's
/// run directory and log inside it.
fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let scratch = tempfile::tempdir().unwrap();
    let (run_dir, log) = (scratch.path().join("run"), scratch.path().join("job.log"));
    (scratch, run_dir, log)
}

/// `mpirun -np 2 terse pretrain …` of `steps` steps with `timeout_s` as the
/// collective deadline, its output into `log`.
fn job(run_dir: &Path, steps: u64, timeout_s: u64, log: &Path, extra: &[&str]) -> Child {
    let mut command = Command::new("mpirun");
    command
        .args(["--oversubscribe", "-np", "2", "-x", "RAYON_NUM_THREADS=1"])
        .arg(env!("CARGO_BIN_EXE_terse"))
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(["--set", &format!("train.steps={steps}")])
        .args(["--set", "train.eval_every=0"])
        .args(["--set", &format!("train.collective_timeout_s={timeout_s}")])
        // A run long enough to be stopped mid-way goes past the shipped
        // schedule's 40 steps, which terse refuses (its rate is 0 there).
        .args(["--set", &format!("schedule.total_steps={}", steps.max(40))])
        .arg("--run-dir")
        .arg(run_dir)
        .args(extra);
    start(command, log, "mpirun starts (apt-get install openmpi-bin)")
}

/// Starts `command` from the workspace in a process group of its own (so
/// the whole job can be signalled), its output into `log`; `starts` says
/// what a failure to start means.
fn start(mut command: Command, log: &Path, starts: &str) -> Child {
    let log = std::fs::File::create(log).unwrap();
    command
        .current_dir(common::workspace())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect(starts)
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
    find_rank_pid(run_dir, rank).unwrap_or_else(|| panic!("no process of rank {rank} found"))
}

/// The pid of MPI rank `rank` of the job writing `run_dir`, if it runs.
fn find_rank_pid(run_dir: &Path, rank: usize) -> Option<i32> {
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
            return Some(pid);
        }
    }
    None
}

/// The first line of `output` that holds `what`; the test fails saying
/// `missing` (and the output) where none does.
fn line_with<'a>(output: &'a str, what: &str, missing: &str) -> &'a str {
    output
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("{missing}:\n{output}"))
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
    let (_scratch, run_dir, log) = scratch();
    let mut job = job(&run_dir, 400, 5, &log, &[]);
    let stuck = rank_pid(&run_dir, 1, 3, &mut job);
    signal(stuck, libc::SIGSTOP);
    let (status, seconds) = ends_within(&mut job, Duration::from_secs(5 + 60));
    signal(stuck, libc::SIGCONT);
    signal(stuck, libc::SIGKILL);
    let output = std::fs::read_to_string(&log).unwrap();
    let line = line_with(&output, "did not arrive", "no rank named");
    println!("SIGSTOP of rank 1, deadline 5 s: job ended {status} after {seconds:.1} s: {line}");
    assert!(!status.success());
    assert!(
        line.contains("rank 0") && line.contains("rank 1 did not arrive within 5s"),
        "{line}"
    );
}

#[test]
fn sigterm_while_waiting_for_a_stopped_rank_ends_the_job_without_a_checkpoint() {
    let (_scratch, run_dir, log) = scratch();
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
    let line = line_with(&output, "stopped by signal", "no stop reported");
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
    let scratch = tempfile::tempdir().unwrap();
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

/// How a FIFO job's ranks are started.
#[derive(Clone, Copy, Debug)]
enum Ranks {
    /// Two threads of one `terse` process.
    Local,
    /// Two `mpirun` processes.
    Mpi,
}

/// BERT-Tiny on 2 ranks in `run_dir`, whose `metrics.jsonl` is a FIFO
/// nobody writes: rank 0 blocks opening it before step 1.
fn fifo_job(run_dir: &Path, ranks: Ranks, timeout_s: u64, log: &Path) -> Child {
    std::fs::create_dir_all(run_dir).unwrap();
    let fifo = run_dir.join("metrics.jsonl");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success(), "mkfifo {}", fifo.display());
    let mut command = match ranks {
        Ranks::Local => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_terse"));
            c.env("RAYON_NUM_THREADS", "2");
            c
        }
        Ranks::Mpi => {
            let mut c = Command::new("mpirun");
            c.args(["--oversubscribe", "-np", "2", "-x", "RAYON_NUM_THREADS=1"])
                .arg(env!("CARGO_BIN_EXE_terse"));
            c
        }
    };
    command
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(["--set", "train.steps=20", "--set", "train.eval_every=0"])
        .args(["--set", &format!("train.collective_timeout_s={timeout_s}")])
        .arg("--run-dir")
        .arg(run_dir);
    if let Ranks::Local = ranks {
        command.args(["--local-ranks", "2"]);
    }
    start(command, log, "terse starts")
}

/// Waits until `log` holds `what` (the job still running).
fn wait_for_line(log: &Path, what: &str, job: &mut Child) {
    let start = Instant::now();
    while !std::fs::read_to_string(log).is_ok_and(|l| l.contains(what)) {
        assert!(job.try_wait().unwrap().is_none(), "the job ended early");
        assert!(start.elapsed() < Duration::from_secs(300), "no `{what}`");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn a_rank_stuck_before_the_first_step_ends_the_job(ranks: Ranks) {
    const DEADLINE: u64 = 20;
    let (_scratch, run_dir, log) = scratch();
    let mut job = fifo_job(&run_dir, ranks, DEADLINE, &log);
    let (status, seconds) = ends_within(&mut job, Duration::from_secs(DEADLINE + 10 + 120));
    let output = std::fs::read_to_string(&log).unwrap();
    let line = line_with(&output, "did not arrive", "no rank named");
    println!(
        "{ranks:?}: rank 0 stuck opening metrics.jsonl, deadline {DEADLINE} s: ended {status} after {seconds:.1} s: {line}"
    );
    assert!(!status.success(), "{output}");
    assert!(
        line.contains(&format!("rank 0 did not arrive within {DEADLINE}s")),
        "{line}"
    );
    match ranks {
        // The process names where its stuck thread was.
        Ranks::Local => assert!(line.contains("rank 0 is stuck setting up"), "{line}"),
        // The waiting process says where it waited: rank 0 had not got there.
        Ranks::Mpi => assert!(
            line.contains("rank 1 was setting up") && line.contains("when it gave up"),
            "{line}"
        ),
    }
    // Started before the job, so the setup's seconds are in it: the bound
    // is generous on the start, exact on what follows the deadline.
    assert!(
        seconds < (DEADLINE + 10) as f64 + 60.0,
        "ended after {seconds:.1} s"
    );
}

#[test]
fn a_local_rank_stuck_before_the_first_step_ends_the_job_at_the_deadline() {
    a_rank_stuck_before_the_first_step_ends_the_job(Ranks::Local);
}

#[test]
fn an_mpi_rank_stuck_before_the_first_step_ends_the_job_at_the_deadline() {
    a_rank_stuck_before_the_first_step_ends_the_job(Ranks::Mpi);
}

/// A FIFO job on `ranks` given a first SIGTERM during the hang (to the
/// process, or to every MPI rank as `cargo xtask` passes a signal on):
/// its status, seconds from the signal, and the line reporting the stop;
/// no checkpoint may have been written, and the signal is acknowledged on
/// the terminal exactly once.
fn a_first_sigterm_during_the_hang(ranks: Ranks) -> (std::process::ExitStatus, f64, String) {
    let (_scratch, run_dir, log) = scratch();
    let mut job = fifo_job(&run_dir, ranks, 600, &log);
    // Rank 1 is in the barrier before step 1 once rank 0 is announced and
    // the set-up's lines are written; give it a moment to get there.
    let announced = match ranks {
        Ranks::Local => "rank(s) (local)",
        Ranks::Mpi => "rank(s) (mpi)",
    };
    wait_for_line(&log, announced, &mut job);
    std::thread::sleep(Duration::from_secs(5));
    match ranks {
        Ranks::Local => signal(job.id() as i32, libc::SIGTERM),
        Ranks::Mpi => {
            let pids: Vec<i32> = (0..2)
                .map(|rank| find_rank_pid(&run_dir, rank).expect("both ranks run"))
                .collect();
            for pid in pids {
                signal(pid, libc::SIGTERM);
            }
        }
    }
    let (status, seconds) = ends_within(&mut job, Duration::from_secs(120));
    let output = std::fs::read_to_string(&log).unwrap();
    let line = line_with(&output, "stopped by signal 15", "no stop reported");
    println!("{ranks:?}, rank 0 stuck, SIGTERM: ended {status} after {seconds:.1} s: {line}");
    assert_eq!(
        output.matches("stop requested").count(),
        1,
        "the first signal is acknowledged once (by rank 0):\n{output}"
    );
    assert!(!status.success(), "{output}");
    assert!(line.contains("while waiting for rank 0"), "{line}");
    assert!(
        !run_dir.join("checkpoints").exists(),
        "a checkpoint was written"
    );
    (status, seconds, line.to_string())
}

#[test]
fn a_first_sigterm_while_a_local_rank_is_stuck_ends_the_job_without_a_checkpoint() {
    let (status, seconds, line) = a_first_sigterm_during_the_hang(Ranks::Local);
    assert_eq!(status.code(), Some(143), "{line}");
    assert!(line.contains("rank 0 is stuck setting up"), "{line}");
    // The stop grace (10 s) and the stuck ranks' grace (5 s), plus slack.
    assert!(seconds < 15.0 + 10.0, "ended after {seconds:.1} s");
}

#[test]
fn a_first_sigterm_to_the_ranks_while_an_mpi_rank_is_stuck_ends_the_job_without_a_checkpoint() {
    let (_, seconds, line) = a_first_sigterm_during_the_hang(Ranks::Mpi);
    assert!(line.contains("rank 1 was setting up"), "{line}");
    // The stop grace (10 s), then MPI_Abort ends the stuck rank.
    assert!(seconds < 10.0 + 10.0, "ended after {seconds:.1} s");
}

#[test]
fn a_second_sigterm_while_a_local_rank_is_stuck_ends_the_job_at_once() {
    use std::os::unix::process::ExitStatusExt as _;
    let (_scratch, run_dir, log) = scratch();
    let mut job = fifo_job(&run_dir, Ranks::Local, 600, &log);
    wait_for_line(&log, "rank(s) (local)", &mut job);
    signal(job.id() as i32, libc::SIGTERM);
    wait_for_line(&log, "stop requested", &mut job);
    signal(job.id() as i32, libc::SIGTERM);
    let (status, seconds) = ends_within(&mut job, Duration::from_secs(60));
    println!("a second SIGTERM: ended {status} after {seconds:.1} s");
    // The default action: killed by the signal (a shell says 143).
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    assert!(seconds < 2.0, "ended after {seconds:.1} s");
}
