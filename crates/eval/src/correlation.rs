//! The STS-B metrics: Pearson's and Spearman's correlation (the latter with
//! average ranks for ties, as scipy). Both are undefined for constant input
//! or a value that is not finite; that is NaN here, as scipy's `pearsonr`
//! and `spearmanr` return, so that evaluating a collapsed model (one score
//! for every pair) reports NaN instead of ending the run. Only a malformed
//! call (lengths that differ, fewer than 2 samples) is an error.

use crate::EvalError;

fn check(metric: &'static str, x: &[f64], y: &[f64]) -> Result<(), EvalError> {
    let undefined = |detail: String| Err(EvalError::Undefined { metric, detail });
    if x.len() != y.len() {
        return undefined(format!("{} predictions for {} labels", x.len(), y.len()));
    }
    if x.len() < 2 {
        return undefined(format!("needs at least 2 samples, got {}", x.len()));
    }
    Ok(())
}

/// Whether the correlation of `x` and `y` has no value: a value that is not
/// finite, or either side constant. Constancy is tested on the values, as
/// scipy does, not on the sums of squares: the mean of three 0.1s computed
/// in f64 need not be exactly 0.1, which leaves tiny deviations that would
/// make a meaningless r.
fn is_undefined(x: &[f64], y: &[f64]) -> bool {
    let constant = |v: &[f64]| v.iter().all(|&a| a == v[0]);
    x.iter().chain(y).any(|v| !v.is_finite()) || constant(x) || constant(y)
}

/// Pearson's r of checked input, accumulated in f64 around the means.
fn correlation(x: &[f64], y: &[f64]) -> f64 {
    if is_undefined(x, y) {
        return f64::NAN;
    }
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        let (dx, dy) = (a - mx, b - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    // Deviations too small to square (they underflow to 0) leave no
    // variance to divide by.
    if sxx == 0.0 || syy == 0.0 {
        return f64::NAN;
    }
    (sxy / (sxx.sqrt() * syy.sqrt())).clamp(-1.0, 1.0)
}

/// Pearson's r; NaN where it is undefined (see the module's doc).
pub fn pearson(x: &[f64], y: &[f64]) -> Result<f64, EvalError> {
    check("pearson", x, y)?;
    Ok(correlation(x, y))
}

/// 1-based ranks, ties sharing the average of their positions.
pub fn average_ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut ranks = vec![0.0; values.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && values[order[end]] == values[order[start]] {
            end += 1;
        }
        // Positions start+1 ..= end share their mean.
        let rank = (start + 1 + end) as f64 / 2.0;
        for &i in &order[start..end] {
            ranks[i] = rank;
        }
        start = end;
    }
    ranks
}

/// Spearman's ρ: Pearson's r of the average ranks; NaN where it is
/// undefined (see the module's doc).
pub fn spearman(x: &[f64], y: &[f64]) -> Result<f64, EvalError> {
    check("spearman", x, y)?;
    // Before ranking: a NaN or an infinity gets a finite rank, which would
    // hide it.
    if is_undefined(x, y) {
        return Ok(f64::NAN);
    }
    Ok(correlation(&average_ranks(x), &average_ranks(y)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undefined_correlations_are_nan_and_malformed_calls_errors() {
        let x = [1.0, 2.0, 3.0, 4.0];
        // A collapsed model: one score for every pair.
        assert!(pearson(&[2.5; 4], &x).unwrap().is_nan());
        assert!(spearman(&[2.5; 4], &x).unwrap().is_nan());
        assert!(pearson(&x, &[0.0; 4]).unwrap().is_nan());
        // Equal values whose f64 mean is not quite them (0.1 + 0.1 + 0.1 is
        // 0.30000000000000004): constant all the same.
        assert!(pearson(&[0.1; 3], &[1.0, 2.0, 4.0]).unwrap().is_nan());
        // Not finite on either side (ranked, each would get an ordinary
        // rank and Spearman a finite ρ).
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let with_bad = [1.0, 2.0, bad, 4.0];
            assert!(pearson(&with_bad, &x).unwrap().is_nan());
            assert!(pearson(&x, &with_bad).unwrap().is_nan());
            assert!(spearman(&with_bad, &x).unwrap().is_nan());
            assert!(spearman(&x, &with_bad).unwrap().is_nan());
        }
        // Still defined: x against (1, 2, 3, 5) is monotone, so ρ = 1 (to
        // rounding: 5 / (sqrt(5) · sqrt(5)) in f64).
        let rho = spearman(&x, &[1.0, 2.0, 3.0, 5.0]).unwrap();
        assert!((rho - 1.0).abs() < 1e-12, "{rho}");
        // Malformed calls stay errors, as scipy raises for them.
        let error = pearson(&x, &x[..3]).unwrap_err().to_string();
        assert_eq!(error, "pearson: 4 predictions for 3 labels");
        let error = spearman(&[1.0], &[2.0]).unwrap_err().to_string();
        assert_eq!(error, "spearman: needs at least 2 samples, got 1");
    }
}
