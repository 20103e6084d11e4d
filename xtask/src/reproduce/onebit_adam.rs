//! `reproduce onebit-adam`: 1-bit Adam Fig. 1, Fig. 4a and §7.2 Fig. 6.
//!
//! Claim: with its warmup, 1-bit Adam's sample-wise loss tracks Adam's (as
//! does the fp32-momentum ablation), while compressing the gradient from the
//! first step ("naive", v from compressed gradients) does not.

use anyhow::Result;

use super::gates::{self, PARITY_PERCENT, percent_or_diverged};
use super::plot::draw_pretraining_loss;
use super::report::Table;
use super::runner::{RunLog, Variant, run_all};
use super::{Claim, Context, Outcome, num};

const CONFIG: &str = "configs/reproduce-onebit-adam.toml";
const WORKERS: usize = 4;

/// The label of 1-bit Adam with its warmup at 40% of the steps (full run).
const LONG_WARMUP: &str = "onebit_adam_long_warmup";

/// Steps, global batch and micro-batch (quick: 80 steps of a quarter of the
/// batch, same proportions of warmup and freeze).
///
/// 1,000 steps of 64: Adam's MLM accuracy reaches twice the unigram
/// baseline by step 750 (a sizing run: 12.8% against 6.4%); four variants
/// take about 50 minutes on 2 cores.
///
/// `--steps` replaces the 1,000 (`--quick` keeps its 80).
pub fn shape(ctx: &Context) -> (u64, usize, usize) {
    ctx.pick((ctx.scale.steps.unwrap_or(1000), 64, 16), (80, 16, 4))
}

/// The model's name for titles: `BERT-Tiny`, or the `--model` preset's.
fn model_name(ctx: &Context) -> String {
    let preset = ctx.scale.model.as_deref().unwrap_or("tiny");
    let mut chars = preset.chars();
    let capitalised: String = chars
        .next()
        .map(|c| c.to_ascii_uppercase())
        .into_iter()
        .chain(chars)
        .collect();
    format!("BERT-{capitalised}")
}

/// The `--set optimizer=…` table of `name`, freezing at 20% of the steps when
/// `freezes`, plus `extra` fields (e.g. `scale_block = 2048`).
///
/// Bias correction is on, unlike the papers' BertAdam: their variance is
/// frozen after 23,000 steps, ours after 200 (the quick run's after 16),
/// where without the correction `v` is still 1 − 0.999²⁰⁰ ≈ 18% of its
/// value (1.6% at 16) and the frozen preconditioner makes 1-bit Adam
/// diverge at the freeze (measured: loss 7.7 → 55 in an earlier quick
/// run without it).
pub fn optimizer(ctx: &Context, name: &str, freezes: bool, extra: &str) -> String {
    let (steps, _, _) = shape(ctx);
    let freeze = if freezes {
        format!(", freeze_step = {}", steps / 5)
    } else {
        String::new()
    };
    format!("{{ name = \"{name}\", weight_decay = 0.01, bias_correction = true{freeze}{extra} }}")
}

/// A pre-training run of the experiment with `optimizer`.
pub fn variant(ctx: &Context, label: &str, optimizer: String) -> Variant {
    let steps = shape(ctx).0;
    let variant = Variant::new(label, &["pretrain"], CONFIG, WORKERS)
        .set("optimizer", optimizer)
        .pretraining(shape(ctx), steps / 10);
    let variant = match &ctx.scale.model {
        Some(model) => variant.set("model.preset", model),
        None => variant,
    };
    let variant = match &ctx.scale.device {
        Some(device) => variant.set("train.device", device),
        None => variant,
    };
    match &ctx.scale.precision {
        Some(precision) => variant.set("train.precision", precision),
        None => variant,
    }
}

pub fn run(ctx: &Context) -> Result<Outcome> {
    let (steps, batch, _) = shape(ctx);
    let freeze = steps / 5;
    let v = |label: &str, freezes: bool| variant(ctx, label, optimizer(ctx, label, freezes, ""));
    let mut variants = vec![
        v("adam", false),
        v("onebit_adam", true),
        // The naive ablation compresses from step 1 and never freezes: its
        // freeze_step (the default) is unused.
        v("adam_onebit_naive", false).varies("optimizer.freeze_step"),
    ];
    if !ctx.quick {
        variants.insert(2, v("onebit_adam_fp32", true));
        // The test of the likeliest reason 1-bit Adam trails Adam here
        // (a variance frozen after 200 steps, not the paper's 23,000):
        // the same run with the warmup twice as long.
        variants.push(
            variant(
                ctx,
                LONG_WARMUP,
                optimizer(
                    ctx,
                    "onebit_adam",
                    false,
                    &format!(", freeze_step = {}", 2 * steps / 5),
                ),
            )
            .varies("optimizer.freeze_step"),
        );
    }
    let logs = run_all(ctx, &ctx.runs, &variants)?;
    write_runs_and_plot(ctx, &logs)?;
    summarize(ctx, &logs, steps, batch, freeze)
}

/// Writes the runs' metrics and configs to the report and their training
/// loss to its plot.png: this experiment's and `zero-one-adam`'s, which
/// adds 0/1 Adam to its runs.
pub fn write_runs_and_plot(ctx: &Context, logs: &[RunLog]) -> Result<()> {
    ctx.report.write_runs(logs)?;
    draw_pretraining_loss(
        ctx,
        "plot.png",
        logs,
        shape(ctx).1,
        &format!(
            "{} pre-training, {WORKERS} workers: training loss (moving average)",
            model_name(ctx)
        ),
        "MLM + NSP loss",
    )
}

fn summarize(
    ctx: &Context,
    logs: &[RunLog],
    steps: u64,
    batch: usize,
    freeze: u64,
) -> Result<Outcome> {
    let tail = (steps / 10) as usize;
    let mut table = loss_table(tail, &["unigram baseline", "MB sent per rank"]);
    let mut held = Vec::new();
    for log in logs {
        let (loss, mut cells) = loss_cells(log, tail)?;
        held.push(loss);
        cells.extend([
            log.final_eval("mlm_majority_accuracy")
                .map_or("not logged".into(), num),
            num(log.total("bytes_sent") / 1e6),
        ]);
        table.row(cells);
    }
    let losses = Losses::of(logs, &held);
    let claims = if ctx.quick {
        vec![quick_claim(logs, &losses)]
    } else {
        full_claims(logs, &losses, steps, freeze)
    };
    Ok(Outcome {
        title: "1-bit Adam vs Adam: BERT pre-training (1-bit Adam Fig. 1, 4a, 6)".into(),
        body: format!(
            "{}, State of the Union addresses and SQuAD training articles, seq 128, {} \
             steps of {batch}, 4 workers (local ranks){}, learning rate warmed up over the first \
             10% and decayed linearly to 0; 1-bit Adam freezes at step {freeze} (20%). \
             Held-out loss: masked LM + next sentence on 512 held-out sequences after the last \
             step.\n\n{}\n\
             ![training loss](plot.png)\n\n\
             All variants run with bias correction, unlike the papers' BertAdam: their variance \
             is frozen after 23,000 steps, ours after {freeze}, where the uncorrected `v` is \
             still {:.1}% of its value (1 − 0.999^{freeze}) and the frozen preconditioner \
             makes 1-bit Adam diverge at the freeze (seen in an earlier quick run without \
             it: loss 7.7 → 55).\n",
            model_name(ctx),
            steps,
            ctx.scale
                .device
                .as_ref()
                .map_or(String::new(), |device| format!(" on `{device}`")),
            table.markdown(),
            100.0 * (1.0 - 0.999f64.powi(freeze as i32)),
        ),
        claims,
    })
}

/// A results table whose first columns are the optimizer, its final
/// held-out loss, its training loss over the last `tail` steps and its MLM
/// accuracy, followed by the columns `more`.
pub fn loss_table(tail: usize, more: &[&str]) -> Table {
    let tail_header = format!("train loss, last {tail} steps");
    let mut header = vec![
        "optimizer",
        "final held-out loss",
        &tail_header,
        "MLM accuracy",
    ];
    header.extend_from_slice(more);
    Table::new(&header)
}

/// A run's final held-out loss and the first cells of its row in a
/// [`loss_table`].
pub fn loss_cells(log: &RunLog, tail: usize) -> Result<(f64, Vec<String>)> {
    let loss = log.final_eval("held_out_loss")?;
    let cells = vec![
        log.label.clone(),
        log.show(loss, num),
        log.show(log.tail_mean("loss", tail), num),
        log.show(log.final_eval("mlm_accuracy")?, num),
    ];
    Ok((loss, cells))
}

/// The final held-out losses the claims compare (NaN for a variant the
/// run lacks: the full run's fp32 ablation and long warmup).
struct Losses {
    adam: f64,
    onebit: f64,
    naive: f64,
    fp32: f64,
    long: f64,
}

impl Losses {
    fn of(logs: &[RunLog], held: &[f64]) -> Self {
        let held_of = |label: &str| {
            logs.iter()
                .zip(held)
                .find(|(log, _)| log.label == label)
                .map(|(_, &loss)| loss)
        };
        let (adam, onebit, naive) = match (
            held_of("adam"),
            held_of("onebit_adam"),
            held_of("adam_onebit_naive"),
        ) {
            (Some(a), Some(o), Some(n)) => (a, o, n),
            _ => unreachable!("the variants above"),
        };
        Self {
            adam,
            onebit,
            naive,
            fp32: held_of("onebit_adam_fp32").unwrap_or(f64::NAN),
            long: held_of(LONG_WARMUP).unwrap_or(f64::NAN),
        }
    }

    /// A loss's gap to Adam's, in percent.
    fn gap(&self, x: f64) -> f64 {
        100.0 * (x - self.adam) / self.adam
    }
}

/// At 80 steps the warmup is 16 steps and naive compression has not yet
/// failed (it does after ~300: the full run); the quick run checks that
/// 1-bit Adam compresses and stays near Adam.
fn quick_claim(logs: &[RunLog], losses: &Losses) -> Claim {
    let sent = |label: &str| {
        logs.iter()
            .find(|log| log.label == label)
            .map_or(0.0, |log| log.total("bytes_sent"))
    };
    let reduction = sent("adam") / sent("onebit_adam").max(1.0);
    let gap_onebit = losses.gap(losses.onebit);
    Claim::new(
        gap_onebit.abs() < 20.0 && reduction > 3.0,
        format!(
            "quick scale: 1-bit Adam ends within 20% of Adam ({:+.2}%) while sending {}× \
             less",
            gap_onebit,
            num(reduction)
        ),
    )
}

/// The full run's claims: the reference learned, naive compression ends
/// worse and farther from Adam, 1-bit Adam and its fp32 ablation track
/// Adam, and the long warmup's answer.
fn full_claims(logs: &[RunLog], losses: &Losses, steps: u64, freeze: u64) -> Vec<Claim> {
    let Losses {
        adam,
        onebit,
        naive,
        fp32,
        long,
    } = *losses;
    let gap = |x: f64| losses.gap(x);
    let log_of = |label: &str| logs.iter().find(|log| log.label == label);
    let reference = log_of("adam").expect("a variant above");
    let (learned, learned_text) = gates::mlm_learned(reference);
    let onebit_log = log_of("onebit_adam").expect("a variant above");
    let (tracks, tracks_text) = gates::tracks(reference, onebit_log, steps, steps / 10);
    vec![
        Claim::new(learned, format!("the reference learned: {learned_text}")),
        gates::claim(
            learned,
            naive > onebit,
            format!(
                "naive 1-bit Adam ends worse than 1-bit Adam: held-out loss {} vs {}",
                num(naive),
                num(onebit)
            ),
        ),
        gates::claim(
            learned,
            (onebit - adam).abs() < (naive - adam).abs(),
            format!(
                "1-bit Adam stays closer to Adam than naive compression: {:+.2}% vs \
                 {:+.2}% from Adam's {}",
                gap(onebit),
                gap(naive),
                num(adam)
            ),
        ),
        gates::claim(
            learned,
            tracks,
            format!("1-bit Adam tracks Adam: {tracks_text}"),
        ),
        gates::claim(
            learned,
            gap(fp32).abs() < PARITY_PERCENT,
            format!(
                "the fp32-momentum ablation (zero-gradient coordinates masked) ends within \
                 {PARITY_PERCENT}% of Adam: {}",
                percent_or_diverged(gap(fp32))
            ),
        ),
        gates::claim(
            learned,
            long.is_finite() && gap(long).abs() < gap(onebit).abs(),
            format!(
                "frozen after {} steps instead of {freeze}, 1-bit Adam ends closer to Adam: \
                 {} vs {:+.2}% (a variant with twice the uncompressed warmup: it does not \
                 tell a variance frozen early from less compression)",
                2 * freeze,
                percent_or_diverged(gap(long)),
                gap(onebit)
            ),
        ),
    ]
}
