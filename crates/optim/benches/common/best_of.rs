//! The timing rule both optimizer benchmarks use.

use std::time::Instant;

/// The fastest of `repeats` runs of `f`, in seconds (the least disturbed by
/// the rest of the machine).
pub fn best_of<F: FnMut()>(repeats: usize, mut f: F) -> f64 {
    (0..repeats)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}
