//! The loss plot a training command leaves in its run directory.
//!
//! After `pretrain`, `finetune` or `train` ends, the run's metrics.jsonl is
//! drawn as `loss.png` beside it (raw and smoothed training loss against
//! steps), with the same plot code as the reproductions.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::reproduce::plot::{self, Chart, Series};
use crate::reproduce::runner::RunLog;

/// Draws `run_dir/loss.png` from `run_dir/metrics.jsonl`; returns its path.
pub fn loss_plot(run_dir: &Path) -> Result<PathBuf> {
    let log = RunLog::read("loss", run_dir)?;
    let points: Vec<(f64, f64)> = log
        .series("loss")
        .iter()
        .map(|&(step, loss)| (step as f64, loss))
        .collect();
    let window = (points.len() / 20).max(1);
    let mut series = vec![Series {
        label: "training loss".to_string(),
        points: points.clone(),
    }];
    if window > 1 {
        series.push(Series {
            label: format!("mean of {window} steps"),
            points: plot::smooth(&points, window),
        });
    }
    let path = run_dir.join("loss.png");
    let title = format!("{} — training loss", run_dir.display());
    plot::draw(
        &path,
        &Chart {
            title: &title,
            x_label: "step",
            y_label: "loss",
            log_y: false,
        },
        &series,
    )?;
    Ok(path)
}
