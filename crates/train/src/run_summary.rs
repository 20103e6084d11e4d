//! The end-of-run summary: throughput over the session's steps, the
//! communication share of step time, the bytes sent against an fp32
//! gradient allreduce of the same model, and the evaluations before and
//! after.

use serde::Serialize;
use terse_comm::traffic::{Collective, volume};

use crate::metrics::StepRecord;

/// Totals over a run's steps (this session's steps, on resume).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// Steps taken in this session.
    pub steps: u64,
    /// Examples processed over all ranks.
    pub samples: u64,
    /// Wall seconds in steps.
    pub seconds: f64,
    /// Seconds in the optimizer's collectives (rank 0).
    pub comm_seconds: f64,
    /// Bytes rank 0 sent.
    pub bytes_sent: u64,
    /// Bytes rank 0 would have sent allreducing the fp32 gradient every step.
    pub fp32_allreduce_bytes: u64,
    /// Mean loss of the last step.
    pub final_loss: f64,
    /// The last evaluation.
    pub eval: Vec<(String, f64)>,
    /// The evaluation of the starting point (step 0), when the run made one.
    pub eval_before: Vec<(String, f64)>,
}

impl RunSummary {
    /// Adds one step of `samples` examples (the global batch) of a model
    /// with `params` parameters on `world` ranks.
    pub fn add(&mut self, record: &StepRecord, samples: u64, params: usize, world: usize) {
        // The step's wall time, as its samples_per_s measured it: the timed
        // phases leave out what waits between them (fp16's overflow check
        // and clipping reading the device, the loss's allreduce), which on a
        // GPU holds the queued forward and backward.
        let step_s = samples as f64 / record.samples_per_s.max(1e-12);
        self.steps += 1;
        self.samples += samples;
        self.seconds += step_s;
        self.comm_seconds += record.comm_ms / 1e3;
        self.bytes_sent += record.bytes_sent;
        self.fp32_allreduce_bytes += volume(Collective::Allreduce, world, 0, 0, params * 4).0;
        // An fp16 step skipped for a forward overflow has an inf loss: the
        // run's last loss is the last finite one.
        if record.loss.is_finite() {
            self.final_loss = record.loss;
        }
    }

    /// The human-readable summary printed at the end of a run.
    pub fn render(&self) -> String {
        if self.steps == 0 {
            // A finished run resumed: evaluated and exported again.
            let eval = self
                .eval
                .iter()
                .map(|(name, value)| format!("; {name} {value:.4}"));
            return format!("no step left to take (resumed at the run's end){}", {
                eval.collect::<String>()
            });
        }
        let throughput = self.samples as f64 / self.seconds.max(1e-9);
        let share = 100.0 * self.comm_seconds / self.seconds.max(1e-9);
        let mut out = format!(
            "{} steps, {} samples in {:.1} s: {throughput:.1} samples/s; communication \
             {share:.1}% of step time; final loss {:.4}",
            self.steps, self.samples, self.seconds, self.final_loss
        );
        let ratio = self.fp32_allreduce_bytes as f64 / self.bytes_sent.max(1) as f64;
        if self.fp32_allreduce_bytes > 0 && (ratio - 1.0).abs() < 0.005 {
            // An uncompressed optimizer: the same bytes, not "1.00× less".
            out.push_str(&format!(
                "; sent {:.2} MB per rank, as an fp32 gradient allreduce does",
                self.bytes_sent as f64 / 1e6
            ));
        } else if self.fp32_allreduce_bytes > 0 {
            out.push_str(&format!(
                "; sent {:.2} MB per rank, {ratio:.2}× less than an fp32 gradient allreduce ({:.2} MB)",
                self.bytes_sent as f64 / 1e6,
                self.fp32_allreduce_bytes as f64 / 1e6
            ));
        }
        for (name, value) in &self.eval {
            match self.eval_before.iter().find(|(before, _)| before == name) {
                Some((_, before)) => out.push_str(&format!("; {name} {before:.4} → {value:.4}")),
                None => out.push_str(&format!("; {name} {value:.4}")),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_shows_each_metric_before_and_after_and_the_saving() {
        let summary = RunSummary {
            steps: 2,
            samples: 64,
            seconds: 4.0,
            comm_seconds: 1.0,
            bytes_sent: 1_000_000,
            fp32_allreduce_bytes: 8_000_000,
            final_loss: 0.5,
            eval: vec![("accuracy".into(), 0.75), ("loss".into(), 0.5)],
            eval_before: vec![("accuracy".into(), 0.5)],
        };
        assert_eq!(
            summary.render(),
            "2 steps, 64 samples in 4.0 s: 16.0 samples/s; communication 25.0% of step time; \
             final loss 0.5000; sent 1.00 MB per rank, 8.00× less than an fp32 gradient \
             allreduce (8.00 MB); accuracy 0.5000 → 0.7500; loss 0.5000"
        );
    }

    #[test]
    fn a_step_counts_at_its_wall_time_not_its_timed_phases() {
        // Timed phases of 25 ms each, 0.1 s in all; the step took 0.4 s.
        let mut record = StepRecord::example(1, 1.0, 0.1, "warmup", 80.0);
        (record.forward_ms, record.backward_ms) = (25.0, 25.0);
        (record.comm_ms, record.optimizer_ms) = (25.0, 25.0);
        let mut summary = RunSummary::default();
        summary.add(&record, 32, 10, 1);
        // 32 samples at 80 per second: 0.4 s, not the timed phases' 0.1 s.
        assert!((summary.seconds - 0.4).abs() < 1e-12, "{}", summary.seconds);
        assert!(
            summary
                .render()
                .starts_with("1 steps, 32 samples in 0.4 s: 80.0 samples/s")
        );
        let resumed_at_end = RunSummary {
            eval: vec![("accuracy".into(), 0.75)],
            ..RunSummary::default()
        };
        assert_eq!(
            resumed_at_end.render(),
            "no step left to take (resumed at the run's end); accuracy 0.7500"
        );
    }
}
