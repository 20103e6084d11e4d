//! `reproduce zero-one-adam`: 0/1 Adam (Lu et al., ICLR 2023) against Adam
//! and 1-bit Adam on `onebit-adam`'s data, model and settings (its Adam and
//! 1-bit Adam runs are shared, not re-run, when that experiment produced
//! them).
//!
//! Claims: (a) 0/1 Adam tracks Adam as 1-bit Adam is judged; (b) it sends
//! less data in fewer communication rounds than 1-bit Adam — measured
//! within 2% of the counts its schedules give, and set against the paper's
//! "up to 87% less volume, 54% fewer rounds"; (c) its optimizer step over
//! the run's schedule on slow links against 1-bit Adam's, each kind of
//! step timed over netlab (`zero_one_step_time`) and set against the
//! paper's "up to 2× throughput".

use anyhow::Result;

use super::gates::{self, percent_or_diverged};
use super::runner::{RunLog, Variant, check_comparable, run_all};
use super::zero_one_schedule::Schedule;
use super::{Claim, Context, Outcome, num, onebit_adam, zero_one_step_time};

/// Largest gap, in percent, between a measured count and its analytic value.
const COUNT_TOLERANCE_PERCENT: f64 = 2.0;

/// The paper's headline reductions against 1-bit Adam (abstract).
const PAPER_VOLUME_REDUCTION: f64 = 87.0;
const PAPER_ROUND_REDUCTION: f64 = 54.0;

/// DeepSpeed's κ (variance updates before the interval doubles) and H (the
/// largest interval between synchronisations): the paper's and
/// DeepSpeed's defaults.
const VAR_UPDATE_SCALER: u64 = 16;
const LOCAL_STEP_CLIPPER: u64 = 16;

/// The local steps after which the synchronisation interval doubles: a
/// twentieth of the run (so 1, 2, 4, 8 and then 16 over the last 60%).
fn local_step_scaler(steps: u64) -> u64 {
    (steps / 20).max(1)
}

/// 0/1 Adam's `--set optimizer=…` table: the variance stage as long as
/// 1-bit Adam's warmup (20% of the steps), bias correction on as in every
/// variant of `onebit-adam` (its variance stage is as short).
fn zero_one_optimizer(steps: u64) -> String {
    format!(
        "{{ name = \"zero_one_adam\", weight_decay = 0.01, bias_correction = true, \
         var_freeze_step = {}, var_update_scaler = {VAR_UPDATE_SCALER}, local_step_scaler = \
         {}, local_step_clipper = {LOCAL_STEP_CLIPPER} }}",
        steps / 5,
        local_step_scaler(steps)
    )
}

/// A step's analytic volume in units of a 1-bit allreduce of the model
/// (an fp32 allreduce of it is 32 such units).
const FP32_UNITS: f64 = 32.0;

pub fn run(ctx: &Context) -> Result<Outcome> {
    let steps = onebit_adam::shape(ctx).0;
    let freeze = steps / 5;
    let shared: Vec<Variant> = ["adam", "onebit_adam"]
        .iter()
        .map(|&label| {
            let optimizer = onebit_adam::optimizer(ctx, label, label != "adam", "");
            onebit_adam::variant(ctx, label, optimizer)
        })
        .collect();
    let own = [onebit_adam::variant(
        ctx,
        "zero_one_adam",
        zero_one_optimizer(steps),
    )];
    let shared_dir = ctx.sibling("onebit-adam");
    check_comparable(ctx, &[(&shared_dir, &shared), (&ctx.runs, &own)])?;
    let mut logs = run_all(ctx, &shared_dir, &shared)?;
    logs.extend(run_all(ctx, &ctx.runs, &own)?);
    onebit_adam::write_runs_and_plot(ctx, &logs)?;
    let schedule = Schedule::of(
        steps,
        freeze,
        VAR_UPDATE_SCALER,
        local_step_scaler(steps),
        LOCAL_STEP_CLIPPER,
    );
    let times = zero_one_step_time::measure(ctx)?;
    let mut outcome = summarize(ctx, &logs, steps, freeze, schedule)?;
    let (body, claim) = zero_one_step_time::summarize(ctx, &times, steps, freeze, &schedule);
    outcome.body.push_str(&format!("\n{body}"));
    outcome.claims.push(claim);
    Ok(outcome)
}

/// Measured bytes and rounds of a run: the total bytes sent, and the steps
/// that sent any (every optimizer here sends something in each step that
/// communicates).
fn measured(log: &RunLog) -> (f64, u64) {
    let series = log.series("bytes_sent");
    let rounds = series.iter().filter(|&&(_, bytes)| bytes > 0.0).count();
    (series.iter().map(|&(_, b)| b).sum(), rounds as u64)
}

fn summarize(
    ctx: &Context,
    logs: &[RunLog],
    steps: u64,
    freeze: u64,
    schedule: Schedule,
) -> Result<Outcome> {
    let of = |label: &str| {
        logs.iter()
            .find(|log| log.label == label)
            .expect("a variant above")
    };
    let (adam, onebit, zero_one) = (of("adam"), of("onebit_adam"), of("zero_one_adam"));
    let volumes = Volumes::of(adam, onebit, zero_one, steps, freeze, &schedule);
    let tail = (steps / 10) as usize;
    let mut table = onebit_adam::loss_table(
        tail,
        &[
            "MB sent per rank",
            "rounds (steps that communicate)",
            "collective calls",
        ],
    );
    let mut held = Vec::new();
    for log in logs {
        let (loss, mut cells) = onebit_adam::loss_cells(log, tail)?;
        held.push(loss);
        let (bytes, rounds) = measured(log);
        cells.extend([
            num(bytes / 1e6),
            rounds.to_string(),
            match log.series("collectives").is_empty() {
                true => "not logged".into(),
                false => format!("{}", log.total("collectives") as u64),
            },
        ]);
        table.row(cells);
    }
    let [adam_loss, onebit_loss, zero_one_loss] = held[..] else {
        unreachable!("three variants")
    };
    let claims = claims(
        ctx,
        (adam, zero_one),
        (adam_loss, onebit_loss, zero_one_loss),
        &volumes,
        steps,
        &schedule,
    );
    Ok(Outcome {
        title: "0/1 Adam vs Adam and 1-bit Adam: BERT pre-training (0/1 Adam, ICLR 2023)".into(),
        body: format!(
            "`reproduce onebit-adam`'s runs (BERT-Tiny, {steps} steps of {}, 4 workers as local \
             ranks, bias correction on in every variant) beside 0/1 Adam: variance stage of \
             {freeze} steps (κ = {VAR_UPDATE_SCALER}), then local steps whose interval doubles \
             every {} local steps up to H = {LOCAL_STEP_CLIPPER}. Rounds are the steps whose \
             optimizer communicates (a 1-bit allreduce is one round, made of several \
             collective calls). The analytic volume counts an fp32 allreduce of the model as \
             32 1-bit ones (Adam's measured step as the unit), leaving out the compression \
             scales.\n\n{}\n![training loss](plot.png)\n\n\
             The paper's reductions come from runs of 150,000+ steps with the variance stage \
             ending at the learning rate's warmup; at {steps} steps the variance stage is 20% \
             of the run and the longest interval, {LOCAL_STEP_CLIPPER}, holds for the last \
             60%.\n",
            onebit_adam::shape(ctx).1,
            local_step_scaler(steps),
            table.markdown()
        ),
        claims,
    })
}

/// The claims: the byte and round counts as the schedules give them and,
/// in the quick run, 0/1 Adam near Adam while sending less; in the full
/// run, the reference learned, 0/1 Adam tracks Adam and the paper's
/// reductions are reached.
fn claims(
    ctx: &Context,
    (adam, zero_one): (&RunLog, &RunLog),
    (adam_loss, onebit_loss, zero_one_loss): (f64, f64, f64),
    volumes: &Volumes,
    steps: u64,
    schedule: &Schedule,
) -> Vec<Claim> {
    let gap = |x: f64| 100.0 * (x - adam_loss) / adam_loss;
    let counts = volumes.counts_claim(steps, schedule);
    let (volume_cut, round_cut) = volumes.cuts();
    if ctx.quick {
        vec![
            counts,
            Claim::new(
                gap(zero_one_loss).abs() < 20.0 && volume_cut > 0.0 && round_cut > 0.0,
                format!(
                    "quick scale: 0/1 Adam ends within 20% of Adam ({:+.2}%) while sending \
                     {volume_cut:.1}% less than 1-bit Adam in {round_cut:.1}% fewer rounds",
                    gap(zero_one_loss)
                ),
            ),
        ]
    } else {
        let (learned, learned_text) = gates::mlm_learned(adam);
        let (tracks, tracks_text) = gates::tracks(adam, zero_one, steps, steps / 10);
        vec![
            Claim::new(learned, format!("the reference learned: {learned_text}")),
            gates::claim(
                learned,
                tracks,
                format!(
                    "0/1 Adam tracks Adam as 1-bit Adam is judged: it {tracks_text} (1-bit \
                     Adam: {})",
                    percent_or_diverged(gap(onebit_loss))
                ),
            ),
            counts,
            Claim::new(
                volume_cut >= PAPER_VOLUME_REDUCTION,
                format!(
                    "the paper's volume reduction reached: {volume_cut:.1}% less than 1-bit Adam \
                     (paper: up to {PAPER_VOLUME_REDUCTION}%)"
                ),
            ),
            Claim::new(
                round_cut >= PAPER_ROUND_REDUCTION,
                format!(
                    "the paper's round reduction reached: {round_cut:.1}% fewer rounds than \
                     1-bit Adam (paper: up to {PAPER_ROUND_REDUCTION}%)"
                ),
            ),
        ]
    }
}

/// 1-bit Adam's and 0/1 Adam's measured bytes and rounds beside the
/// volumes their schedules give.
struct Volumes {
    analytic_onebit: f64,
    analytic_zero_one: f64,
    onebit_bytes: f64,
    onebit_rounds: u64,
    zero_one_bytes: f64,
    zero_one_rounds: u64,
}

impl Volumes {
    fn of(
        adam: &RunLog,
        onebit: &RunLog,
        zero_one: &RunLog,
        steps: u64,
        freeze: u64,
        schedule: &Schedule,
    ) -> Self {
        // One fp32 allreduce of the model, in bytes: Adam's step.
        let fp32_step = adam.series("bytes_sent").first().map_or(0.0, |&(_, b)| b);
        let unit = fp32_step / FP32_UNITS;
        let (onebit_bytes, onebit_rounds) = measured(onebit);
        let (zero_one_bytes, zero_one_rounds) = measured(zero_one);
        Self {
            analytic_onebit: (freeze as f64 * FP32_UNITS + (steps - freeze) as f64) * unit,
            analytic_zero_one: (schedule.exact as f64 * FP32_UNITS
                + (schedule.compressed + schedule.syncs) as f64)
                * unit,
            onebit_bytes,
            onebit_rounds,
            zero_one_bytes,
            zero_one_rounds,
        }
    }

    /// 0/1 Adam's volume and rounds below 1-bit Adam's, in percent.
    fn cuts(&self) -> (f64, f64) {
        (
            100.0 * (1.0 - self.zero_one_bytes / self.onebit_bytes),
            100.0 * (1.0 - self.zero_one_rounds as f64 / self.onebit_rounds as f64),
        )
    }

    /// Bytes within [`COUNT_TOLERANCE_PERCENT`] of the analytic volumes
    /// and rounds exactly as the schedules give them.
    fn counts_claim(&self, steps: u64, schedule: &Schedule) -> Claim {
        let off = |measured: f64, analytic: f64| 100.0 * (measured - analytic).abs() / analytic;
        let Self {
            analytic_onebit,
            analytic_zero_one,
            onebit_bytes,
            onebit_rounds,
            zero_one_bytes,
            zero_one_rounds,
        } = *self;
        let counts_agree = off(onebit_bytes, analytic_onebit) <= COUNT_TOLERANCE_PERCENT
            && off(zero_one_bytes, analytic_zero_one) <= COUNT_TOLERANCE_PERCENT
            && zero_one_rounds == schedule.rounds()
            && onebit_rounds == steps;
        Claim::new(
            counts_agree,
            format!(
                "bytes and rounds as the schedules give them: 1-bit Adam {} MB ({:.2}% from \
                 {} analytic), {onebit_rounds} rounds (analytic {steps}); 0/1 Adam {} MB \
                 ({:.2}% from {}), {zero_one_rounds} rounds (analytic {}: {} exact variance \
                 steps, {} compressed, {} synchronisations, {} silent local steps)",
                num(onebit_bytes / 1e6),
                off(onebit_bytes, analytic_onebit),
                num(analytic_onebit / 1e6),
                num(zero_one_bytes / 1e6),
                off(zero_one_bytes, analytic_zero_one),
                num(analytic_zero_one / 1e6),
                schedule.rounds(),
                schedule.exact,
                schedule.compressed,
                schedule.syncs,
                schedule.silent
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-derived: 40 variance steps with κ = 2 update v at t = 1, 2, 3,
    /// 5, 7, 11, 15, 23, 31 (DeepSpeed's s = t + 1 a multiple of the
    /// interval); local steps 41–60 with scaler 4, clipper 4 synchronise
    /// at 41–44, 45, 47, 51, 55, 59.
    #[test]
    fn the_schedule_counts_each_kind_of_step() {
        let s = Schedule::of(60, 40, 2, 4, 4);
        assert_eq!(
            s,
            Schedule {
                exact: 9,
                compressed: 31,
                syncs: 9,
                silent: 11
            }
        );
        assert_eq!(s.rounds(), 49);
        // The full run: 1,000 steps, variance stage 200, scaler 50, H 16.
        let full = Schedule::of(1000, 200, 16, 50, 16);
        assert_eq!(full.exact + full.compressed, 200);
        assert_eq!(full.syncs + full.silent, 800);
    }
}
