//! Whether a run the committed results hold cut short diverged (the
//! trainer's `"diverged"` line, or a last loss that shows it) or is
//! incomplete: what `--from-results` (`runner::replay`) decides before it
//! scores a short run as diverged.

use serde_json::Value;

/// How many times its lowest logged loss a run's last loss must be for a
/// run cut short before the `"diverged"` line existed to count as
/// diverged.
pub(super) const EXPLODED: f64 = 10.0;

/// Whether `lines` (a run's metrics) end diverging: a `"diverged": true`
/// line, or a last training loss that is not finite or is [`EXPLODED`]
/// times the lowest.
pub(super) fn ended_diverging(lines: &[Value]) -> bool {
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
