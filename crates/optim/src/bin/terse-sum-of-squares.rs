//! `terse-sum-of-squares`: minimise `Σ wᵢ²` with any optimizer through the
//! optimizer API alone (Tarasov & Ershov §3–4, Figs. 1 and 6).
//!
//! Two coordinates an order of magnitude apart are the smallest model in
//! which 1-bit compression with one scale per chunk hands the small
//! coordinate a momentum of the large one's size; divided by its tiny frozen
//! variance, that is the divergence the eps-inside-sqrt fix bounds.
//!
//! The paper's setting is one worker compressing the whole vector as one
//! chunk. A world of one does not compress at all (there is nothing to
//! average), so the problem runs on `workers` local ranks (default 2) with
//! the same gradient: the vector is tiled once per worker, and each tile —
//! the whole problem — lands in one chunk, as the paper's single worker had
//! it. Averaging identical compressed messages is exact, so the dynamics are
//! one worker's compression. The output reports the first tile.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;
use terse_comm::{Communicator, LocalComm};
use terse_optim::{LrSchedule, Optimizer, OptimizerConfig, ParamLayout};

/// Minimise a sum of squares with one optimizer (the eps-fix toy problem).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// TOML with `start`, `steps`, `[optimizer]` and `[schedule]`
    /// (configs/reproduce-eps-fix-sum-of-squares.toml)
    #[arg(long, value_name = "PATH")]
    config: PathBuf,

    /// Replace the config's [optimizer] by this TOML table, e.g.
    /// '{ name = "onebit_adam", freeze_step = 100 }'
    #[arg(long, value_name = "TOML")]
    optimizer: Option<String>,

    /// Replace the config's `repeat` (coordinates per block)
    #[arg(long, value_name = "N")]
    repeat: Option<usize>,

    /// Write one JSON line per step here: step, w (one coordinate per
    /// block), f(w), stage
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
}

/// The problem and its optimizer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Problem {
    /// The starting point w₀.
    start: Vec<f32>,
    /// Each coordinate of `start` repeated this many times, in order: blocks
    /// of equal coordinates, to compare one compression scale per block
    /// with one per chunk (`reproduce scale-block`).
    #[serde(default = "one")]
    repeat: usize,
    /// Ranks compressing the (tiled) problem; at least 2, since a world of
    /// one does not compress.
    #[serde(default = "two")]
    workers: usize,
    /// Optimizer steps to take.
    steps: u64,
    optimizer: OptimizerConfig,
    schedule: LrSchedule,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("terse-sum-of-squares: error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<String, String> {
    let problem = load(args)?;
    let start: Vec<f32> = problem
        .start
        .iter()
        .flat_map(|&x| std::iter::repeat_n(x, problem.repeat))
        .collect();
    let results = LocalComm::run(problem.workers, Duration::from_secs(600), |comm| {
        minimise(args, &problem, &start, comm)
    });
    let mut lead = None;
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Ok(Ok(line)) => lead = lead.or(line),
            Ok(Err(error)) => return Err(format!("rank {rank}: {error}")),
            Err(_) => return Err(format!("rank {rank} panicked")),
        }
    }
    Ok(lead.expect("rank 0 returns the summary"))
}

/// One rank's run over `workers` tiles of `start`; rank 0 writes the steps
/// and returns the summary line.
fn minimise(
    args: &Args,
    problem: &Problem,
    start: &[f32],
    comm: &dyn Communicator,
) -> Result<Option<String>, String> {
    let tile = start.len();
    let layout = ParamLayout::from_shapes((0..problem.workers).flat_map(|t| {
        (0..problem.start.len()).map(move |i| (format!("tile{t}.w{i}"), vec![problem.repeat]))
    }));
    let mut optimizer = Optimizer::new(
        problem.optimizer.clone(),
        problem.schedule.clone(),
        layout,
        comm,
    )
    .map_err(|e| format!("{}: {e}", args.config.display()))?;
    let lead = comm.rank() == 0;
    let mut out = match (&args.out, lead) {
        (Some(path), true) => Some(std::io::BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?,
        )),
        _ => None,
    };
    let write_error = |e: std::io::Error| format!("cannot write the steps: {e}");
    let mut w: Vec<f32> = start.repeat(problem.workers);
    let mut f = objective(&w[..tile]);
    for _ in 0..problem.steps {
        let mut g: Vec<f32> = w.iter().map(|wi| 2.0 * wi).collect();
        let report = optimizer
            .step_flat(&mut w, &mut g, comm)
            .map_err(|e| e.to_string())?;
        f = objective(&w[..tile]);
        if let Some(out) = &mut out {
            let line = serde_json::json!({
                // One coordinate per block: the blocks move in lockstep.
                "step": report.t,
                "w": w[..tile].iter().step_by(problem.repeat).collect::<Vec<_>>(),
                "f": f,
                "stage": report.stage.to_string(),
            });
            writeln!(out, "{line}").map_err(write_error)?;
        }
    }
    if let Some(out) = &mut out {
        out.flush().map_err(write_error)?;
    }
    Ok(lead.then(|| {
        format!(
            "{}: f(w) = {f:.6e} after {} steps (f(w0) = {:.6e}), w = {:?} (one per block)",
            problem.optimizer.name(),
            problem.steps,
            objective(start),
            w[..tile].iter().step_by(problem.repeat).collect::<Vec<_>>()
        )
    }))
}

fn one() -> usize {
    1
}

fn two() -> usize {
    2
}

fn objective(w: &[f32]) -> f64 {
    w.iter().map(|&wi| f64::from(wi) * f64::from(wi)).sum()
}

/// The problem of `args.config` with the command line's replacements;
/// errors name the file and the field.
fn load(args: &Args) -> Result<Problem, String> {
    let path: &Path = &args.config;
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}", at(&e)))?;
    let mut document: toml::Table = toml::from_str(&text).map_err(|e| at(&e))?;
    if let Some(optimizer) = &args.optimizer {
        let table: toml::Table = toml::from_str(&format!("optimizer = {optimizer}"))
            .map_err(|e| format!("--optimizer {optimizer}: {e}"))?;
        document.extend(table);
    }
    if let Some(repeat) = args.repeat {
        let repeat = i64::try_from(repeat).map_err(|e| format!("--repeat: {e}"))?;
        document.insert("repeat".into(), toml::Value::Integer(repeat));
    }
    let problem: Problem = document.try_into().map_err(|e| at(&e))?;
    if problem.start.is_empty() || problem.repeat == 0 {
        return Err(at(&"start and repeat: need at least one coordinate"));
    }
    if problem.workers < 2 {
        return Err(at(&format_args!(
            "workers = {}: needs at least 2 (a world of one does not compress)",
            problem.workers
        )));
    }
    problem
        .optimizer
        .validate()
        .map_err(|e| at(&format_args!("[optimizer]: {e}")))?;
    problem
        .schedule
        .validate()
        .map_err(|e| at(&format_args!("[schedule]: {e}")))?;
    Ok(problem)
}
