//! `--from-results`: a variant's run read back from an experiment's
//! committed metrics.jsonl and configs/ instead of run, and whether it
//! ended, diverged or is incomplete.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::runner::{RunLog, read_jsonl};

/// Whether an experiment's committed results hold a run of `label` (an
/// experiment re-checking results that predate one of its variants).
pub fn is_committed(results: &Path, runs_dir: &Path, label: &str) -> bool {
    committed_label(results, runs_dir, label).is_ok()
}

/// The name a variant's run has in an experiment's committed results:
/// its label, or — where the experiment reports runs of several models
/// (scale-block) — the label behind the model's prefix.
pub(super) fn committed_label(results: &Path, runs_dir: &Path, label: &str) -> Result<String> {
    let prefix = if runs_dir.ends_with("vgg16") {
        "vgg16_"
    } else {
        "bert_"
    };
    for candidate in [label.to_string(), format!("{prefix}{label}")] {
        if results
            .join("configs")
            .join(format!("{candidate}.toml"))
            .is_file()
        {
            return Ok(candidate);
        }
    }
    bail!(
        "{}: no committed run `{label}` (configs/{label}.toml)",
        results.display()
    )
}

/// A variant's log as the committed results hold it: its lines of
/// metrics.jsonl (the `run` tag removed). A run whose last logged step is
/// short of the `train.steps` of its committed config diverged where its
/// metrics say so (the `"diverged": true` line) or its last loss shows it
/// ([`ended_diverging`]: runs from before that line); one that stops short
/// otherwise is incomplete, an error: scoring it as diverged would decide
/// every "ends worse" claim against it.
pub fn replay(results: &Path, runs_dir: &Path, label: &str) -> Result<RunLog> {
    let name = committed_label(results, runs_dir, label)?;
    let mut lines = read_jsonl(&results.join("metrics.jsonl"))?;
    lines.retain(|line| line.get("run").and_then(Value::as_str) == Some(name.as_str()));
    for line in &mut lines {
        if let Some(fields) = line.as_object_mut() {
            fields.remove("run");
        }
    }
    let config = results.join("configs").join(format!("{name}.toml"));
    let config = std::fs::read_to_string(&config)
        .with_context(|| format!("cannot read {}", config.display()))?;
    let steps = config
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get("train")?.get("steps")?.as_integer())
        .with_context(|| format!("{name}: no train.steps in its committed config"))?;
    let last = lines
        .iter()
        .filter_map(|l| l.get("step")?.as_u64())
        .max()
        .unwrap_or(0);
    let short = last < steps as u64;
    if short && !ended_diverging(&lines) {
        bail!(
            "{}: run `{name}` ends at step {last} of its {steps} without having diverged (no \
             \"diverged\" line, its last loss finite and not {EXPLODED}× its lowest): its \
             committed metrics are incomplete",
            results.display()
        );
    }
    Ok(RunLog {
        label: label.to_string(),
        dir: results.to_path_buf(),
        diverged: short,
        lines,
    })
}

/// How many times its lowest logged loss a run's last loss must be for a
/// run cut short before the `"diverged"` line existed to count as
/// diverged.
const EXPLODED: f64 = 10.0;

/// Whether `lines` (a run's metrics) end diverging: a `"diverged": true`
/// line, or a last training loss that is not finite or is [`EXPLODED`]
/// times the lowest.
fn ended_diverging(lines: &[Value]) -> bool {
    if lines
        .iter()
        .any(|l| l.get("diverged") == Some(&Value::Bool(true)))
    {
        return true;
    }
    let losses: Vec<f64> = lines
        .iter()
        .filter_map(|l| l.get("loss")?.as_f64())
        .collect();
    let Some(&last) = losses.last() else {
        return false;
    };
    let lowest = losses.iter().copied().fold(f64::INFINITY, f64::min);
    !last.is_finite() || last > EXPLODED * lowest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(losses: &[f64]) -> Vec<Value> {
        losses
            .iter()
            .enumerate()
            .map(|(i, loss)| serde_json::json!({ "step": i + 1, "loss": loss }))
            .collect()
    }

    /// A run cut short counts as diverged only where its metrics show it:
    /// the trainer's line, or a last loss that exploded (the eps-fix run
    /// ending at 191,374 from about 10); a healthy one cut short is not.
    #[test]
    fn a_short_run_diverged_only_where_its_metrics_show_it() {
        assert!(!ended_diverging(&lines(&[10.0, 9.0, 8.5])));
        assert!(ended_diverging(&lines(&[10.0, 9.0, 191_374.0])));
        let mut marked = lines(&[10.0, 9.0]);
        marked.push(serde_json::json!({ "step": 3, "diverged": true }));
        assert!(ended_diverging(&marked));
        assert!(!ended_diverging(&[]));
    }
}
