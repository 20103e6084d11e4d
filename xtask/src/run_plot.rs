//! Plots of runs' metrics.jsonl, with the same plot code as the
//! reproductions: the loss plot a training command leaves in its run
//! directory (raw and smoothed training loss against steps), and `cargo
//! xtask plot RUN…`, which draws one or more runs side by side — training
//! loss, and every evaluation metric they logged — while they train or
//! after.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::reproduce::plot::{self, Chart, Series};
use crate::reproduce::runner::{RunLog, eval_metrics};

/// Steps of smoothing for a loss curve of `steps` steps: about twenty
/// windows over the run.
fn smoothing(steps: usize) -> usize {
    (steps / 20).max(1)
}

/// The loss chart (training loss against steps).
fn loss_chart(title: &str) -> Chart<'_> {
    Chart {
        clip_above_start: true,
        x_ticks: Some(plot::whole),
        ..Chart::new(title, "step", "loss")
    }
}

/// Draws `run_dir/loss.png` from `run_dir/metrics.jsonl`; returns its path.
pub fn loss_plot(run_dir: &Path) -> Result<PathBuf> {
    let log = RunLog::read("training loss", run_dir)?;
    let window = smoothing(log.series("loss").len());
    let logs = [log];
    let mut series = plot::loss_curves(&logs, 1.0, 1);
    if window > 1 {
        let mut smooth = plot::loss_curves(&logs, 1.0, window);
        smooth[0].label = format!("mean of {window} steps");
        series.append(&mut smooth);
    }
    let path = run_dir.join("loss.png");
    let title = format!("{} — training loss", run_dir.display());
    plot::draw(&path, &loss_chart(&title), &series)?;
    Ok(path)
}

/// Arguments of `cargo xtask plot`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// Run directories (each holding a metrics.jsonl; a run still training
    /// is drawn as far as it got)
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,

    /// Where the PNGs go [default: the run's directory for one run,
    /// `runs/plots/` for several]
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Runs `plot`: `loss.png` (training loss, smoothed when long) and
/// `<metric>.png` for each evaluation metric any run logged.
pub fn run(args: &Args) -> Result<()> {
    let out = match (&args.out, args.runs.as_slice()) {
        (Some(out), _) => out.clone(),
        (None, [one]) => one.clone(),
        (None, _) => PathBuf::from("runs/plots"),
    };
    std::fs::create_dir_all(&out)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", out.display()))?;
    for path in compare(&args.runs, &out)? {
        println!("terse: plot {}", path.display());
    }
    Ok(())
}

/// Draws the runs' curves into `out`; returns the files written.
pub fn compare(runs: &[PathBuf], out: &Path) -> Result<Vec<PathBuf>> {
    let logs = runs
        .iter()
        .map(|dir| RunLog::read(&label(dir), dir))
        .collect::<Result<Vec<_>>>()?;
    let mut written = Vec::new();
    // Each run smoothed over its own length, as its own loss.png is.
    let loss: Vec<Series> = logs
        .iter()
        .flat_map(|log| {
            let window = smoothing(log.series("loss").len());
            let mut curve = plot::loss_curves(std::slice::from_ref(log), 1.0, window);
            if window > 1 {
                curve[0].label = format!("{} (mean of {window} steps)", log.label);
            }
            curve
        })
        .collect();
    let path = out.join("loss.png");
    plot::draw(&path, &loss_chart("training loss"), &loss)?;
    written.push(path);
    let mut metrics: Vec<String> = logs
        .iter()
        .flat_map(|log| log.lines.iter())
        .flat_map(|line| eval_metrics(line).into_iter().map(|(name, _)| name))
        .collect();
    metrics.sort();
    metrics.dedup();
    for metric in metrics {
        let series: Vec<Series> = logs
            .iter()
            .map(|log| Series {
                label: log.label.clone(),
                points: log
                    .eval_series(&metric)
                    .iter()
                    .map(|&(step, v)| (step as f64, v))
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        let path = out.join(format!("{metric}.png"));
        plot::draw(
            &path,
            &Chart {
                x_ticks: Some(plot::whole),
                ..Chart::new(&metric, "step", &metric)
            },
            &series,
        )?;
        written.push(path);
    }
    Ok(written)
}

/// A run's legend entry: its directory's name.
fn label(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_the_loss_and_every_evaluation_metric_of_two_runs() {
        let scratch = tempfile::Builder::new()
            .prefix("terse-plot-")
            .tempdir()
            .unwrap();
        let dir = scratch.path();
        let mut runs = Vec::new();
        for (name, scale) in [("adam", 1.0), ("onebit", 1.1)] {
            let run = dir.join(name);
            std::fs::create_dir_all(&run).unwrap();
            let mut text = String::new();
            for step in 1..=30 {
                text.push_str(&format!(
                    "{{\"step\":{step},\"loss\":{}}}\n",
                    scale * 10.0 / step as f64
                ));
                if step % 10 == 0 {
                    text.push_str(&format!(
                        "{{\"step\":{step},\"eval\":[[\"accuracy\",{}]]}}\n",
                        step as f64 / 40.0
                    ));
                }
            }
            std::fs::write(run.join("metrics.jsonl"), text).unwrap();
            runs.push(run);
        }
        let out = dir.join("plots");
        std::fs::create_dir_all(&out).unwrap();
        let written = compare(&runs, &out).unwrap();
        assert_eq!(written, [out.join("loss.png"), out.join("accuracy.png")]);
        for path in &written {
            let bytes = std::fs::read(path).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
        }
    }
}
