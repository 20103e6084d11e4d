//! `reproduce zero-one-adam`'s claim (c): the optimizer step's time on
//! slow links, 0/1 Adam against 1-bit Adam, over the schedule of the
//! experiment's own run.
//!
//! Each kind of step is timed on 4 netlab hosts (the `optim_network`
//! benchmark, as `reproduce bandwidth` runs it) at 1 Gbit/s and 100 Mbit/s:
//! Adam's fp32 gradient allreduce (0/1 Adam's exact variance steps and
//! 1-bit Adam's warmup are that step), 1-bit Adam's compressed step (0/1
//! Adam's compressed variance steps send the same 1-bit allreduce of the
//! whole buffer around the same two passes, and are timed as it), and 0/1
//! Adam's local steps and synchronisations. The mean step of each
//! optimizer over the run is then the schedule's count of each kind times
//! its time. Only the optimizer step is timed: forward and backward, the
//! same for both, would dilute the gain (`reproduce step-profile` has them).

use anyhow::Result;

use super::network::{Bench, RANKS, Run, StepRow, mean, rows_of};
use super::report::Table;
use super::zero_one_schedule::Schedule;
use super::{Claim, Context, num};
use crate::netlab::lab::{Lab, Shape};
use crate::netlab::rate::{self, Rate};

/// BERT-base's parameter count (the quick run: 4M).
const ELEMENTS: u64 = 110_000_000;

/// The paper's throughput gain over 1-bit Adam (abstract: "up to 2×").
const PAPER_GAIN: f64 = 2.0;

/// The measured steps of one rate, in ms.
#[derive(Debug, Clone, Copy)]
pub struct StepTimes {
    pub rate: Rate,
    /// Adam's step: an fp32 allreduce of the gradient and the update.
    pub exact_ms: f64,
    /// 1-bit Adam's compression-stage step.
    pub compressed_ms: f64,
    /// 0/1 Adam's local step that sends nothing.
    pub local_ms: f64,
    /// 0/1 Adam's local step that ends in a synchronisation.
    pub sync_ms: f64,
}

impl StepTimes {
    /// 1-bit Adam's mean step over `steps` steps with `freeze` warmup steps.
    pub fn onebit_mean(&self, steps: u64, freeze: u64) -> f64 {
        (freeze as f64 * self.exact_ms + (steps - freeze) as f64 * self.compressed_ms)
            / steps as f64
    }

    /// 0/1 Adam's mean step over `schedule`.
    pub fn zero_one_mean(&self, schedule: &Schedule) -> f64 {
        let s = schedule;
        let steps = s.exact + s.compressed + s.syncs + s.silent;
        (s.exact as f64 * self.exact_ms
            + s.compressed as f64 * self.compressed_ms
            + s.syncs as f64 * self.sync_ms
            + s.silent as f64 * self.local_ms)
            / steps as f64
    }
}

/// The runs of one rate: (optimizer, warmup, settle, measured steps). 0/1
/// Adam's benchmark config has one exact variance step, then local steps
/// that synchronise every second step, so its measured steps alternate.
const RUNS: [(&str, u64, u64, u64); 3] = [
    ("adam", 0, 1, 2),
    ("onebit_adam", 1, 1, 2),
    ("zero_one_adam", 1, 1, 4),
];

/// Times each kind of step at each rate (or reads the committed
/// `step-time.jsonl` back with `--from-results`).
pub fn measure(ctx: &Context) -> Result<Vec<StepTimes>> {
    let rates = rate::parse_all(&["1gbit", "100mbit"][..])?;
    let elements = ctx.pick(ELEMENTS, 4_000_000);
    let log = ctx.report.path("step-time.jsonl");
    let fast = Shape::at("10gbit".parse()?);
    let measuring = match &ctx.replay {
        None => Some((Bench::build()?, Lab::up(RANKS, fast)?)),
        Some(_) => None,
    };
    let mut times = Vec::new();
    for &rate in &rates {
        let mut measured = Vec::new();
        for (optimizer, warmup, settle, steps) in RUNS {
            let run = Run {
                optimizer,
                elements,
                warmup,
                settle,
                steps,
                label: rate.to_string(),
                measure_at: Some(rate),
            };
            let rows = rows_of(measuring.as_ref(), fast, &run, &log)?;
            measured.push(run.measured(&rows).into_iter().cloned().collect::<Vec<_>>());
        }
        let step_ms = |rows: &[StepRow], stage: &str| {
            let of: Vec<&StepRow> = rows.iter().filter(|r| r.stage == stage).collect();
            anyhow::ensure!(!of.is_empty(), "no measured `{stage}` step at {rate}");
            Ok(mean(&of, |r| r.step_ms))
        };
        times.push(StepTimes {
            rate,
            exact_ms: step_ms(&measured[0], "full")?,
            compressed_ms: step_ms(&measured[1], "compression")?,
            local_ms: step_ms(&measured[2], "local")?,
            sync_ms: step_ms(&measured[2], "compression")?,
        });
    }
    Ok(times)
}

/// The table of step times and the claim, for a run of `steps` steps
/// whose 1-bit Adam warms up for `freeze` and whose 0/1 Adam follows
/// `schedule`.
pub fn summarize(
    ctx: &Context,
    times: &[StepTimes],
    steps: u64,
    freeze: u64,
    schedule: &Schedule,
) -> (String, Claim) {
    let mut table = Table::new(&[
        "link rate",
        "Adam step ms (fp32 allreduce)",
        "1-bit Adam compressed step ms",
        "0/1 Adam local step ms",
        "0/1 Adam synchronisation ms",
        "1-bit Adam mean step ms",
        "0/1 Adam mean step ms",
        "0/1 Adam's gain",
    ]);
    let gain = |t: &StepTimes| t.onebit_mean(steps, freeze) / t.zero_one_mean(schedule);
    for t in times {
        table.row(vec![
            t.rate.to_string(),
            num(t.exact_ms),
            num(t.compressed_ms),
            num(t.local_ms),
            num(t.sync_ms),
            num(t.onebit_mean(steps, freeze)),
            num(t.zero_one_mean(schedule)),
            format!("{}×", num(gain(t))),
        ]);
    }
    let slowest = times.last().expect("two rates");
    let gains: Vec<String> = times
        .iter()
        .map(|t| format!("{}× at {}", num(gain(t)), t.rate))
        .collect();
    let claim = if ctx.quick {
        Claim::new(
            times.iter().all(|t| gain(t) > 1.0),
            format!(
                "quick scale: 0/1 Adam's optimizer step over the run's schedule is faster \
                 than 1-bit Adam's at every rate: {}",
                gains.join(", ")
            ),
        )
    } else {
        Claim::new(
            gain(slowest) >= PAPER_GAIN,
            format!(
                "the paper's gain reached in the optimizer step at the slowest link: 0/1 \
                 Adam's optimizer step over the run's schedule is {} faster than 1-bit Adam's \
                 (paper: up to {PAPER_GAIN}× training throughput, which adds the forward and \
                 backward passes both share and so gains less; not measured here)",
                gains.join(", ")
            ),
        )
    };
    let body = format!(
        "## Step time over netlab\n\nEach kind of optimizer step timed on {RANKS} netlab \
         hosts ({}elements{}), every link shaped to the rate; the means of the measured \
         steps, after one unmeasured step on 10 Gbit/s links (and, for the 1-bit \
         optimizers, one warmup step there too). The mean steps weigh each kind by its \
         count in this run: 1-bit Adam {freeze} fp32 steps and {} compressed; 0/1 Adam \
         {} fp32 variance steps, {} compressed ones (timed as 1-bit Adam's compressed \
         step: the same 1-bit allreduce and passes), {} synchronisations and {} local \
         steps. Optimizer step only: forward and backward, the same for both, are left \
         out.\n\n{}\n",
        ctx.pick("110,000,000 ", "4,000,000 "),
        ctx.pick(", a BERT-base-sized buffer", ""),
        steps - freeze,
        schedule.exact,
        schedule.compressed,
        schedule.syncs,
        schedule.silent,
        table.markdown()
    );
    (body, claim)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-derived means: 1-bit Adam (2·100 + 8·10)/10 = 28 ms; 0/1 Adam
    /// (1·100 + 1·10 + 2·12 + 6·1)/10 = 14 ms.
    #[test]
    fn mean_steps_weigh_each_kind_by_its_count() {
        let t = StepTimes {
            rate: "1gbit".parse().unwrap(),
            exact_ms: 100.0,
            compressed_ms: 10.0,
            local_ms: 1.0,
            sync_ms: 12.0,
        };
        assert_eq!(t.onebit_mean(10, 2), 28.0);
        let schedule = Schedule {
            exact: 1,
            compressed: 1,
            syncs: 2,
            silent: 6,
        };
        assert_eq!(t.zero_one_mean(&schedule), 14.0);
    }
}
