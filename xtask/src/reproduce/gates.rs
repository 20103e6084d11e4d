//! What a convergence claim needs before it can hold: a reference run that
//! learned (a claim of parity between two untrained models says nothing),
//! and for a "tracks" claim a gap that does not grow over the last half of
//! the run.

use super::runner::RunLog;
use super::{Claim, num};

/// The largest growth of the training-loss gap over the last half of a run
/// (least-squares slope × span) that still counts as "tracking".
pub const GAP_GROWTH_LIMIT: f64 = 0.05;

/// How close (percent of the reference's final held-out loss) a compressed
/// optimizer must end for "converges like" its uncompressed reference.
pub const PARITY_PERCENT: f64 = 2.0;

/// A gap in percent as `+1.23%`, or `diverged` where the run did not end
/// with a number (a diverged run's loss is infinite, a missing one NaN).
pub fn percent_or_diverged(gap: f64) -> String {
    if gap.is_finite() {
        format!("{gap:+.2}%")
    } else {
        "diverged".into()
    }
}

/// Whether a pre-training reference learned more than word frequencies:
/// its masked-LM accuracy is above the unigram baseline of the same
/// held-out set (`mlm_majority_accuracy`). Returns the verdict and the
/// sentence stating it.
pub fn mlm_learned(reference: &RunLog) -> (bool, String) {
    let accuracy = reference.final_eval("mlm_accuracy").ok();
    let baseline = reference.final_eval("mlm_majority_accuracy").ok();
    match (accuracy, baseline) {
        (Some(a), Some(b)) => (
            a > b,
            format!(
                "{}'s MLM accuracy {:.2}% {} the unigram baseline {:.2}%",
                reference.label,
                100.0 * a,
                if a > b { "beats" } else { "does not beat" },
                100.0 * b
            ),
        ),
        (Some(a), None) => (
            false,
            format!(
                "{}'s MLM accuracy {:.2}%, unigram baseline not in these metrics (they predate \
                 `mlm_majority_accuracy`): learning not shown",
                reference.label,
                100.0 * a
            ),
        ),
        _ => (
            false,
            format!("{}: no MLM accuracy logged", reference.label),
        ),
    }
}

/// A convergence claim, judged only where the reference learned: it holds
/// when `learned` and `holds`, and otherwise its text says it cannot.
pub fn claim(learned: bool, holds: bool, text: String) -> Claim {
    if learned {
        Claim::new(holds, text)
    } else {
        Claim::new(
            false,
            format!("{text} — cannot hold: the reference has not learned"),
        )
    }
}

/// Whether a fine-tuning reference's `score` rose above the untrained
/// starting point `start` by at least `margin`.
pub fn score_learned(
    label: &str,
    score: f64,
    start: f64,
    margin: f64,
    what: &str,
) -> (bool, String) {
    let learned = score >= start + margin;
    (
        learned,
        format!(
            "{label}'s {what} {} {} the untrained {} + {} margin",
            num(score),
            if learned { "clears" } else { "does not clear" },
            num(start),
            num(margin)
        ),
    )
}

/// The training-loss gap `other − reference` in windows of `window` steps
/// over the second half of `steps`, and its growth over that half (the
/// least-squares slope times the span). A diverged run has no gap.
pub fn gap_growth(
    reference: &RunLog,
    other: &RunLog,
    steps: u64,
    window: u64,
) -> Option<(Vec<f64>, f64)> {
    if reference.diverged || other.diverged {
        return None;
    }
    let mean = |log: &RunLog, from: u64, to: u64| {
        let values: Vec<f64> = log
            .series("loss")
            .into_iter()
            .filter(|&(s, _)| s > from && s <= to)
            .map(|(_, v)| v)
            .collect();
        values.iter().sum::<f64>() / values.len().max(1) as f64
    };
    let gaps: Vec<f64> = (steps / 2..steps)
        .step_by(window as usize)
        .map(|from| {
            let to = (from + window).min(steps);
            mean(other, from, to) - mean(reference, from, to)
        })
        .collect();
    if gaps.len() < 2 {
        return None;
    }
    let n = gaps.len() as f64;
    let x_mean = (n - 1.0) / 2.0;
    let y_mean = gaps.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, g) in gaps.iter().enumerate() {
        let dx = i as f64 - x_mean;
        sxy += dx * (g - y_mean);
        sxx += dx * dx;
    }
    Some((gaps, sxy / sxx * (n - 1.0)))
}

/// The sentence and verdict of the "does not grow" condition.
pub fn gap_not_growing(
    reference: &RunLog,
    other: &RunLog,
    steps: u64,
    window: u64,
) -> (bool, String) {
    match gap_growth(reference, other, steps, window) {
        Some((gaps, growth)) => (
            growth <= GAP_GROWTH_LIMIT,
            format!(
                "the training-loss gap to {} over the last half, per {window} steps: {} \
                 (growth {:+.3}, limit +{GAP_GROWTH_LIMIT})",
                reference.label,
                gaps.iter()
                    .map(|g| format!("{g:+.3}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                growth
            ),
        ),
        None => (
            false,
            format!("no gap to {} (a run diverged)", reference.label),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(label: &str, losses: impl Fn(u64) -> f64, steps: u64) -> RunLog {
        RunLog {
            label: label.into(),
            dir: "/nonexistent".into(),
            lines: (1..=steps)
                .map(|s| serde_json::json!({ "step": s, "loss": losses(s) }))
                .collect(),
            diverged: false,
        }
    }

    #[test]
    fn a_growing_gap_is_refused_and_a_constant_one_accepted() {
        let adam = log("adam", |s| 8.0 - s as f64 / 100.0, 400);
        let constant = log("onebit_adam", |s| 8.2 - s as f64 / 100.0, 400);
        let growing = log(
            "onebit_adam",
            |s| 8.0 - s as f64 / 100.0 + s as f64 / 400.0,
            400,
        );
        let (gaps, growth) = gap_growth(&adam, &constant, 400, 40).unwrap();
        assert_eq!(gaps.len(), 5);
        assert!(growth.abs() < 1e-9, "{growth}");
        assert!(gap_not_growing(&adam, &constant, 400, 40).0);
        let (_, growth) = gap_growth(&adam, &growing, 400, 40).unwrap();
        // Windows 200–240 … 360–400: gap means 0.55 … 0.95, +0.4 over the half.
        assert!((growth - 0.4).abs() < 1e-9, "{growth}");
        assert!(!gap_not_growing(&adam, &growing, 400, 40).0);
    }

    #[test]
    fn learning_needs_the_baseline_beaten() {
        let eval = |acc: f64, base: Option<f64>| {
            let mut pairs = vec![serde_json::json!(["mlm_accuracy", acc])];
            if let Some(b) = base {
                pairs.push(serde_json::json!(["mlm_majority_accuracy", b]));
            }
            RunLog {
                label: "adam".into(),
                dir: "/nonexistent".into(),
                lines: vec![serde_json::json!({ "step": 10, "eval": pairs })],
                diverged: false,
            }
        };
        assert!(mlm_learned(&eval(0.12, Some(0.07))).0);
        assert!(!mlm_learned(&eval(0.0705, Some(0.0705))).0);
        let (learned, text) = mlm_learned(&eval(0.10, None));
        assert!(!learned && text.contains("not in these metrics"), "{text}");
        assert!(score_learned("adam", 0.77, 0.5, 0.1, "accuracy").0);
        assert!(!score_learned("adam", 12.1, 10.0, 10.0, "F1").0);
    }
}
