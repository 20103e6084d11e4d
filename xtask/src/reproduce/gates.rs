//! What a convergence claim needs before it can be decided: a reference run
//! that learned clearly (a claim of parity between two models that barely
//! learned says nothing: it is "undecided"), for a "tracks" claim a gap that
//! would stay small at twice the run's length, and for a parity on a small
//! evaluation set a difference larger or smaller than that set's own noise.

use super::runner::RunLog;
use super::{Claim, num};

/// How many times the unigram baseline's MLM accuracy a pre-training
/// reference must reach before the claims that compare against it are
/// decided. The BERT-Tiny references at 300 steps reach 1.68× (10.74%
/// against 6.41%), the 300-step wgpu ones 1.07× (6.89%): a factor a run
/// clears by a distance, or visibly does not.
pub const LEARNED_FACTOR: f64 = 1.3;

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

/// The gap of `run`'s final held-out loss to `reference`'s, in percent of
/// the reference's (infinite where `run` diverged).
pub fn held_out_gap(reference: &RunLog, run: &RunLog) -> anyhow::Result<f64> {
    let r = reference.final_eval("held_out_loss")?;
    let x = run.final_eval("held_out_loss")?;
    Ok(100.0 * (x - r) / r)
}

/// Whether a pre-training reference learned more than word frequencies:
/// its masked-LM accuracy is at least [`LEARNED_FACTOR`] times the unigram
/// baseline of the same held-out set (`mlm_majority_accuracy`). Returns the
/// verdict and the sentence stating it.
pub fn mlm_learned(reference: &RunLog) -> (bool, String) {
    let accuracy = reference.final_eval("mlm_accuracy").ok();
    let baseline = reference.final_eval("mlm_majority_accuracy").ok();
    match (accuracy, baseline) {
        (Some(a), Some(b)) => (
            a >= LEARNED_FACTOR * b,
            format!(
                "{}'s MLM accuracy {:.2}% is {:.2}× the unigram baseline {:.2}% (needed: \
                 {LEARNED_FACTOR}×)",
                reference.label,
                100.0 * a,
                a / b,
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

/// A convergence claim, decided only where the reference learned: it holds
/// when `learned` and `holds`, and is undecided otherwise, its text saying
/// why.
pub fn claim(learned: bool, holds: bool, text: String) -> Claim {
    if learned {
        Claim::new(holds, text)
    } else {
        Claim::undecided(format!(
            "{text} — undecided: the reference has not learned clearly enough to judge"
        ))
    }
}

/// The standard error of one run's score in percent (accuracy or F1) on
/// `examples` evaluation examples: `sqrt(s·(100 − s)/n)`, exact for an
/// accuracy and an upper bound for a mean of per-example scores in
/// [0, 100] such as SQuAD's F1.
pub fn run_standard_error(score: f64, examples: usize) -> f64 {
    (score.clamp(0.0, 100.0) * (100.0 - score.clamp(0.0, 100.0)) / examples as f64).sqrt()
}

/// Whether a fine-tuning reference's `score` (a mean over runs, each with
/// standard error `se`) rose above the untrained starting point `start` by
/// at least `margin`, clearing it by two standard errors.
pub fn score_learned(
    label: &str,
    score: f64,
    (start, margin): (f64, f64),
    se: f64,
    what: &str,
) -> (bool, String) {
    let learned = score - 2.0 * se >= start + margin;
    (
        learned,
        format!(
            "{label}'s {what} {} (± {} per-run standard error) {} the untrained {} + {} \
             margin by two standard errors",
            num(score),
            num(se),
            if learned { "clears" } else { "does not clear" },
            num(start),
            num(margin)
        ),
    )
}

/// A parity claim on a small evaluation set: the difference of two mean
/// scores `difference` (standard error `se`) against `tolerance`. Holds
/// when even two standard errors more stay within it, does not hold when
/// two fewer still exceed it, and is undecided in between: the set cannot
/// tell.
pub fn parity(difference: f64, se: f64, tolerance: f64, text: String) -> Claim {
    let (low, high) = (difference.abs() - 2.0 * se, difference.abs() + 2.0 * se);
    let text = format!(
        "{text}; the difference ± two standard errors of the evaluation set is {}–{}",
        num(low.max(0.0)),
        num(high)
    );
    if high <= tolerance {
        Claim::new(true, text)
    } else if low > tolerance {
        Claim::new(false, text)
    } else {
        Claim::undecided(format!("{text}, across the tolerance {}", num(tolerance)))
    }
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

/// The "tracks" condition: `other` ends within [`PARITY_PERCENT`] of the
/// reference's final held-out loss, and the training-loss gap's slope over
/// the last half ([`gap_growth`]), carried on for as many steps again,
/// keeps it within, on either side: `|gap + 100·slope·steps / reference
/// loss| < 2%`. A run shorter than the one where the gap would cross can
/// otherwise "track"; a gap crossing to the other side and growing there
/// is no more "within" than one growing on the first.
/// Returns the verdict and the sentence stating both parts.
pub fn tracks(reference: &RunLog, other: &RunLog, steps: u64, window: u64) -> (bool, String) {
    let (Ok(reference_loss), Ok(loss)) = (
        reference.final_eval("held_out_loss"),
        other.final_eval("held_out_loss"),
    ) else {
        return (false, "no final held-out loss".into());
    };
    let gap = 100.0 * (loss - reference_loss) / reference_loss;
    let Some((gaps, growth)) = gap_growth(reference, other, steps, window) else {
        return (
            false,
            format!("no gap to {} (a run diverged)", reference.label),
        );
    };
    // `growth` spans the windows' starts: (n − 1) windows of steps.
    let slope = growth / ((gaps.len() - 1) as f64 * window as f64);
    let projected = gap + 100.0 * slope * steps as f64 / reference_loss;
    let holds = gap.abs() < PARITY_PERCENT && projected.abs() < PARITY_PERCENT;
    (
        holds,
        format!(
            "ends {} {PARITY_PERCENT}% of {}'s held-out loss ({} vs {}, {}) and the \
             training-loss gap over the last half, per {window} steps ({}), grows by {:+.2e} \
             per step: at twice the run's length {:+.2}% ({} {PARITY_PERCENT}%)",
            if gap.abs() < PARITY_PERCENT {
                "within"
            } else {
                "outside"
            },
            reference.label,
            num(loss),
            num(reference_loss),
            percent_or_diverged(gap),
            gaps.iter()
                .map(|g| format!("{g:+.3}"))
                .collect::<Vec<_>>()
                .join(", "),
            slope,
            projected,
            if projected.abs() < PARITY_PERCENT {
                "within"
            } else {
                "outside"
            },
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reproduce::Verdict;

    /// A run of `steps` training losses, ending on a held-out loss.
    fn log(label: &str, losses: impl Fn(u64) -> f64, steps: u64, held_out: f64) -> RunLog {
        let mut lines: Vec<serde_json::Value> = (1..=steps)
            .map(|s| serde_json::json!({ "step": s, "loss": losses(s) }))
            .collect();
        lines.push(serde_json::json!({ "step": steps, "eval": { "held_out_loss": held_out } }));
        RunLog {
            label: label.into(),
            dir: "/nonexistent".into(),
            lines,
            diverged: false,
        }
    }

    #[test]
    fn gap_growth_is_the_least_squares_slope_over_the_last_half() {
        let adam = log("adam", |s| 8.0 - s as f64 / 100.0, 400, 4.0);
        let constant = log("onebit_adam", |s| 8.2 - s as f64 / 100.0, 400, 4.04);
        let growing = log(
            "onebit_adam",
            |s| 8.0 - s as f64 / 100.0 + s as f64 / 400.0,
            400,
            4.04,
        );
        let (gaps, growth) = gap_growth(&adam, &constant, 400, 40).unwrap();
        assert_eq!(gaps.len(), 5);
        assert!(growth.abs() < 1e-9, "{growth}");
        // Windows 200–240 … 360–400: gap means 0.55 … 0.95, +0.4 over the half.
        let (_, growth) = gap_growth(&adam, &growing, 400, 40).unwrap();
        assert!((growth - 0.4).abs() < 1e-9, "{growth}");
    }

    #[test]
    fn tracking_needs_the_gap_small_now_and_at_twice_the_length() {
        // Adam's held-out loss 4.0: 2% is 0.08.
        let adam = log("adam", |s| 8.0 - s as f64 / 100.0, 400, 4.0);
        // +1% with a constant training gap: tracks.
        let constant = log("onebit_adam", |s| 8.02 - s as f64 / 100.0, 400, 4.04);
        let (holds, text) = tracks(&adam, &constant, 400, 40);
        assert!(holds, "{text}");
        assert!(
            text.contains("+1.00%") && text.contains("within 2%"),
            "{text}"
        );
        // +1% now, but a gap growing 2e-4 per step adds 100·2e-4·400/4 = 2
        // points by step 800: +3%, refused although it ends within 2%.
        let growing = log(
            "onebit_adam",
            |s| 8.0 - s as f64 / 100.0 + 2e-4 * s as f64,
            400,
            4.04,
        );
        let (holds, text) = tracks(&adam, &growing, 400, 40);
        assert!(!holds, "{text}");
        assert!(text.contains("+3.00% (outside 2%)"), "{text}");
        // A closing gap projects below: still tracks.
        let closing = log(
            "onebit_adam",
            |s| 8.2 - s as f64 / 100.0 - 2e-4 * s as f64,
            400,
            4.04,
        );
        assert!(tracks(&adam, &closing, 400, 40).0);
        // One closing three times as fast crosses and grows on the other
        // side: 1 − 6 = −5% at step 800, as far outside as +5%.
        let crossing = log(
            "onebit_adam",
            |s| 8.2 - s as f64 / 100.0 - 6e-4 * s as f64,
            400,
            4.04,
        );
        let (holds, text) = tracks(&adam, &crossing, 400, 40);
        assert!(!holds, "{text}");
        assert!(text.contains("(outside 2%)"), "{text}");
        // Ending outside 2% is refused whatever the slope.
        let far = log("onebit_adam", |s| 8.2 - s as f64 / 100.0, 400, 4.1);
        assert!(!tracks(&adam, &far, 400, 40).0);
    }

    #[test]
    fn learning_needs_the_baseline_beaten_by_the_factor() {
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
        // BERT-Tiny at 300 steps of 256: 10.74% against 6.41%, 1.68×.
        assert!(mlm_learned(&eval(0.1074, Some(0.0641))).0);
        // The 300-step wgpu references: 6.89% against 6.41%, 1.07×.
        let (learned, text) = mlm_learned(&eval(0.0689, Some(0.0641)));
        assert!(!learned && text.contains("1.07×"), "{text}");
        assert!(!mlm_learned(&eval(0.0705, Some(0.0705))).0);
        let (learned, text) = mlm_learned(&eval(0.10, None));
        assert!(!learned && text.contains("not in these metrics"), "{text}");
        // A fine-tune clears chance + margin by two standard errors.
        assert!(score_learned("adam", 77.0, (50.0, 10.0), 1.0, "accuracy").0);
        assert!(!score_learned("adam", 61.0, (50.0, 10.0), 1.0, "accuracy").0);
        assert!(!score_learned("adam", 12.1, (10.0, 10.0), 0.0, "F1").0);
        // Claims on a reference that did not learn are undecided.
        let claim = claim(false, true, "x tracks y".into());
        assert_eq!(claim.verdict, Verdict::Undecided);
    }

    #[test]
    fn parity_is_undecided_where_the_evaluation_set_cannot_tell() {
        // rt-polarity's 823 sentences at 80%: 1.39 points per run.
        assert!((run_standard_error(80.0, 823) - 1.3944).abs() < 1e-4);
        let verdict = |d, se, tol| parity(d, se, tol, String::new()).verdict;
        assert_eq!(verdict(1.0, 0.1, 2.0), Verdict::Holds);
        assert_eq!(verdict(1.0, 1.0, 2.0), Verdict::Undecided);
        assert_eq!(verdict(5.0, 1.0, 2.0), Verdict::DoesNotHold);
        assert_eq!(verdict(-5.0, 1.0, 2.0), Verdict::DoesNotHold);
    }
}
