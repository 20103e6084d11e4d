//! `cargo xtask bench workers`: what simulating N workers on one machine
//! costs. The same BERT pre-training steps (the shipped BERT-Tiny config:
//! global batch 16, micro-batch 4, 1-bit LAMB, 16 steps: 12 of warmup
//! and 4 in its compression stage) run on 1, 2 and 4 `local` ranks (threads of one
//! process, cores ÷ ranks rayon threads each) and as 2 `mpirun` processes
//! (`RAYON_NUM_THREADS` = cores ÷ 2), for BERT-Tiny and BERT-mini. Samples/s
//! are taken from each run's metrics.jsonl, the first step left out (it
//! pays for lazy initialisation). Each configuration runs [`REPEATS`] times,
//! the configurations taking turns (so a slow spell of the machine falls on
//! all of them alike; each round starts one configuration later), and its
//! median rate is compared; every rate is kept.
//! Writes `results/bench/workers.json`.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::{mpi, terse_binary};

const CONFIG: &str = "configs/pretrain-bert-tiny.toml";

/// Runs of each configuration. One 16-step run lasts ~5 s, and this VM's
/// speed drifts by ±15% over such spells: with one run each, two
/// configurations of the same speed differed by up to 0.8×; with the
/// median of three, one configuration's median moved from 61.0 to 56.1
/// samples/s between two bench runs of the same tree.
const REPEATS: usize = 5;

/// How the ranks of one measurement run.
#[derive(Debug, Clone, Copy)]
enum World {
    Local(usize),
    Mpirun(usize),
}

impl World {
    fn name(self) -> String {
        match self {
            World::Local(n) => format!("{n} local rank{}", if n == 1 { "" } else { "s" }),
            World::Mpirun(n) => format!("{n} mpirun processes"),
        }
    }
}

/// Runs the benchmark (`quick`: BERT-Tiny only, 4 steps, nothing written).
pub fn run(quick: bool) -> Result<()> {
    mpi::require_mpirun()?;
    let terse = terse_binary::build()?;
    let (presets, steps): (&[&str], u64) = if quick {
        (&["tiny"], 4)
    } else {
        (&["tiny", "mini"], 16)
    };
    let worlds = [
        World::Local(1),
        World::Local(2),
        World::Local(4),
        World::Mpirun(2),
    ];
    let repeats = if quick { 1 } else { REPEATS };
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let mut rows = Vec::new();
    for preset in presets {
        let mut rates = vec![Vec::new(); worlds.len()];
        for repeat in 0..repeats {
            // Each round starts one configuration later, so each follows
            // every other equally often: a run can slow the one after it
            // (2 `mpirun` processes always came after 4 local ranks and ran
            // BERT-Tiny at 181.2/182.4/190.3 samples/s after them against
            // 192.9/189.1/196.4 after one rank, alternating; a `sync`
            // between did not help).
            for k in 0..worlds.len() {
                let i = (k + repeat) % worlds.len();
                let rate = samples_per_s(&terse, preset, worlds[i], steps)?;
                println!(
                    "{preset:>5}  {:<20} {rate:8.2} samples/s  (run {} of {repeats})",
                    worlds[i].name(),
                    repeat + 1
                );
                rates[i].push(rate);
            }
        }
        let medians: Vec<f64> = rates.iter().map(|r| median(r)).collect();
        let fastest = medians.iter().copied().fold(0.0, f64::max);
        let slowest = medians.iter().copied().fold(f64::MAX, f64::min);
        for (world, m) in worlds.iter().zip(&medians) {
            println!(
                "{preset:>5}  {:<20} {m:8.2} samples/s  median",
                world.name()
            );
        }
        println!(
            "{preset:>5}  slowest configuration at {:.0}% of the fastest (medians)",
            100.0 * slowest / fastest
        );
        rows.push(serde_json::json!({
            "preset": preset,
            "samples_per_s": worlds
                .iter()
                .zip(&medians)
                .map(|(world, m)| (world.name(), serde_json::json!(round(*m))))
                .collect::<serde_json::Map<_, _>>(),
            "runs_samples_per_s": worlds
                .iter()
                .zip(&rates)
                .map(|(world, r)| (world.name(), serde_json::json!(r.iter().map(|x| round(*x)).collect::<Vec<_>>())))
                .collect::<serde_json::Map<_, _>>(),
            "slowest_over_fastest": (slowest / fastest * 1000.0).round() / 1000.0,
        }));
    }
    if !quick {
        let path = Path::new("results/bench/workers.json");
        let record = serde_json::json!({
            "config": CONFIG,
            "steps": steps,
            "repeats": repeats,
            "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
            "cpu": crate::machine::cpu_model(),
            "rows": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&record)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Samples/s of `steps` steps of `preset` on `world`, first step excluded.
fn samples_per_s(terse: &Path, preset: &str, world: World, steps: u64) -> Result<f64> {
    let run_dir = std::env::temp_dir().join(format!(
        "terse-bench-workers-{}-{preset}-{}",
        std::process::id(),
        world.name().replace(' ', "-")
    ));
    let _ = std::fs::remove_dir_all(&run_dir);
    let mut args: Vec<String> = [
        "pretrain",
        "--no-progress",
        "--config",
        CONFIG,
        "--set",
        &format!("model.preset=\"{preset}\""),
        "--set",
        &format!("train.steps={steps}"),
        "--set",
        "train.eval_every=0",
        "--run-dir",
    ]
    .map(String::from)
    .to_vec();
    args.push(run_dir.display().to_string());
    let mut command = match world {
        World::Local(ranks) => {
            let mut command = std::process::Command::new(terse);
            command
                .args(&args)
                .args(["--local-ranks", &ranks.to_string()]);
            command
        }
        World::Mpirun(ranks) => mpi::command(ranks, terse, &args),
    };
    let output = command
        .output()
        .with_context(|| format!("cannot start {}", terse.display()))?;
    if !output.status.success() {
        bail!(
            "{preset} on {} failed ({}):\n{}",
            world.name(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let rate = rate_from_metrics(&run_dir.join("metrics.jsonl"))?;
    let _ = std::fs::remove_dir_all(&run_dir);
    Ok(rate)
}

/// Samples per second over every step record but the first.
fn rate_from_metrics(path: &Path) -> Result<f64> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let rates: Vec<f64> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|v| v.get("samples_per_s").and_then(|r| r.as_f64()))
        .collect();
    if rates.len() < 2 {
        bail!("{}: fewer than two step records", path.display());
    }
    // Per-step rates are batch ÷ step time: the mean rate over steps is the
    // harmonic mean of the per-step rates.
    let later = &rates[1..];
    Ok(later.len() as f64 / later.iter().map(|r| 1.0 / r).sum::<f64>())
}

/// The median of `rates` (the mean of the middle two for an even count).
fn median(rates: &[f64]) -> f64 {
    let mut sorted = rates.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    match sorted.len() % 2 {
        1 => sorted[mid],
        _ => (sorted[mid - 1] + sorted[mid]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.5]), 7.5);
    }
}
