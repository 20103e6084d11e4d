//! The STS-B metrics: Pearson's and Spearman's correlation (the latter with
//! average ranks for ties, as scipy). Both are undefined for constant input;
//! that is an error here rather than scipy's NaN and warning.

use crate::EvalError;

fn check(metric: &'static str, x: &[f64], y: &[f64]) -> Result<(), EvalError> {
    let undefined = |detail: String| Err(EvalError::Undefined { metric, detail });
    if x.len() != y.len() {
        return undefined(format!("{} predictions for {} labels", x.len(), y.len()));
    }
    if x.len() < 2 {
        return undefined(format!("needs at least 2 samples, got {}", x.len()));
    }
    if x.iter().chain(y).any(|v| !v.is_finite()) {
        return undefined("a value is not finite".into());
    }
    Ok(())
}

/// Pearson's r, accumulated in f64 around the means.
pub fn pearson(x: &[f64], y: &[f64]) -> Result<f64, EvalError> {
    check("pearson", x, y)?;
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        let (dx, dy) = (a - mx, b - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if sxx == 0.0 || syy == 0.0 {
        return Err(EvalError::Undefined {
            metric: "pearson",
            detail: "constant input".into(),
        });
    }
    Ok((sxy / (sxx.sqrt() * syy.sqrt())).clamp(-1.0, 1.0))
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

/// Spearman's ρ: Pearson's r of the average ranks.
pub fn spearman(x: &[f64], y: &[f64]) -> Result<f64, EvalError> {
    check("spearman", x, y)?;
    pearson(&average_ranks(x), &average_ranks(y)).map_err(|_| EvalError::Undefined {
        metric: "spearman",
        detail: "constant input".into(),
    })
}
