//! `terse sum-of-squares`: minimise `Σ wᵢ²` with any optimizer (Tarasov &
//! Ershov §3–4, Figs. 1 and 6).
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
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use terse_comm::{Communicator, LocalComm};
use terse_optim::{LrSchedule, Optimizer, OptimizerConfig, ParamLayout};
use terse_train::Override;

use crate::launch::lead_result;

/// Arguments of `terse sum-of-squares`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TOML with `start`, `steps`, `[optimizer]` and `[schedule]`
    /// (configs/reproduce-eps-fix-sum-of-squares.toml)
    #[arg(long, value_name = "PATH")]
    config: PathBuf,

    /// Set any config field, e.g. `--set optimizer.eps_mode=inside`
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = Override::parse)]
    overrides: Vec<Override>,

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

pub fn run(args: &Args) -> Result<()> {
    let problem = load(args)?;
    let start: Vec<f32> = problem
        .start
        .iter()
        .flat_map(|&x| std::iter::repeat_n(x, problem.repeat))
        .collect();
    let results = LocalComm::run(problem.workers, Duration::from_secs(600), |comm| {
        minimise(args, &problem, &start, comm)
    });
    if let Some(line) = lead_result(results)? {
        println!("{line}");
    }
    Ok(())
}

/// One rank's run over `workers` tiles of `start`; rank 0 writes the steps
/// and returns the summary line.
fn minimise(
    args: &Args,
    problem: &Problem,
    start: &[f32],
    comm: &dyn Communicator,
) -> Result<Option<String>> {
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
    .with_context(|| format!("{}", args.config.display()))?;
    let lead = comm.rank() == 0;
    let mut out = match (&args.out, lead) {
        (Some(path), true) => Some(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        _ => None,
    };
    let mut w: Vec<f32> = start.repeat(problem.workers);
    let mut f = objective(&w[..tile]);
    for _ in 0..problem.steps {
        let mut g: Vec<f32> = w.iter().map(|wi| 2.0 * wi).collect();
        let report = optimizer.step_flat(&mut w, &mut g, comm)?;
        f = objective(&w[..tile]);
        if let Some(out) = &mut out {
            let line = serde_json::json!({
                // One coordinate per block: the blocks move in lockstep.
                "step": report.t,
                "w": w[..tile].iter().step_by(problem.repeat).collect::<Vec<_>>(),
                "f": f,
                "stage": report.stage.to_string(),
            });
            writeln!(out, "{line}")?;
        }
    }
    if let Some(out) = &mut out {
        out.flush()?;
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

fn load(args: &Args) -> Result<Problem> {
    let path = &args.config;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut document: toml::Table =
        toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
    for o in &args.overrides {
        o.apply(&mut document)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    let problem: Problem = document
        .try_into()
        .with_context(|| format!("{}", path.display()))?;
    if problem.start.is_empty() || problem.repeat == 0 {
        bail!(
            "{}: start and repeat: need at least one coordinate",
            path.display()
        );
    }
    if problem.workers < 2 {
        bail!(
            "{}: workers = {}: needs at least 2 (a world of one does not compress)",
            path.display(),
            problem.workers
        );
    }
    problem
        .optimizer
        .validate()
        .with_context(|| format!("{}: [optimizer]", path.display()))?;
    problem
        .schedule
        .validate()
        .with_context(|| format!("{}: [schedule]", path.display()))?;
    Ok(problem)
}
