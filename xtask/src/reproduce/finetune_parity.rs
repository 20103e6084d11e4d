//! `reproduce finetune-parity` and `finetune-parity-squad`: 1-bit Adam
//! §7.1 (SQuAD F1 93.32 against 93.33) and Table 3 (GLUE), and the same
//! question for 1-bit LAMB.
//!
//! Claim: fine-tuning with a 1-bit optimizer scores the same as with its
//! uncompressed reference, "the same" meaning the two optimizers' mean
//! scores differ by less than the spread the seed alone causes in the
//! reference's scores. MiniLM on rt-polarity (`finetune-parity`) and on
//! SQuAD (`finetune-parity-squad`, hours: its own experiment), 4 workers,
//! every optimizer with bias correction (a warmup of a few dozen steps
//! leaves the uncorrected variance far too small to freeze), so compression
//! is the only difference within a pair.

use anyhow::Result;

use super::plot::{Chart, Series, draw, loss_curves, whole};
use super::runner::{RunLog, Variant, run_all};
use super::{Claim, Context, Outcome};

mod verdicts;

use verdicts::{compare, late_freeze, percent};

const WORKERS: usize = 4;

/// One fine-tuning task of the experiment, at its scaled size.
struct Task {
    name: &'static str,
    command: &'static [&'static str],
    config: &'static str,
    metric: &'static str,
    metric_label: &'static str,
    steps: u64,
    /// Adam's peak learning rate; each pair scales it (`Pair::peak_scale`).
    peak: f64,
    /// Extra overrides (batch, sequence and data subset sizes).
    extra: Vec<(&'static str, String)>,
    /// The score of the untrained starting point, and the margin the
    /// reference's mean must clear it by before parity means anything.
    untrained: f64,
    margin: f64,
    /// How many examples a run is scored on: the per-run standard error
    /// of its score ([`gates::run_standard_error`]).
    eval_examples: usize,
    /// Also run 1-bit Adam (first seed) freezing at half the steps instead
    /// of a fifth: the test of why it trails Adam (full run only).
    late_freeze_test: bool,
}

/// An uncompressed optimizer and its 1-bit counterpart: one comparison.
struct Pair {
    /// Label and display name of the reference.
    reference: (&'static str, &'static str),
    /// Label and display name of the compressed optimizer.
    compressed: (&'static str, &'static str),
    /// The pair's peak learning rate as a multiple of the task's (Adam's).
    /// LAMB moves each layer by `peak × ‖w‖` per step whatever the
    /// gradient's size, where Adam moves each element by about `peak`: on
    /// MiniLM's 384-wide matrices (‖w‖ ≈ 0.04 × 384) that is roughly ten
    /// times less, so LAMB gets ten times Adam's peak.
    peak_scale: f64,
}

const PAIRS: [Pair; 2] = [
    Pair {
        reference: ("adam", "Adam"),
        compressed: ("onebit_adam", "1-bit Adam"),
        peak_scale: 1.0,
    },
    Pair {
        reference: ("lamb", "LAMB"),
        compressed: ("onebit_lamb", "1-bit LAMB"),
        peak_scale: 10.0,
    },
];

/// rt-polarity: two epochs of the 7,707 training sentences (240 steps of
/// 32 each; `StepOrder` drops the remainder), scored on the held-out 823.
fn rt_polarity(ctx: &Context) -> Task {
    Task {
        name: "rt-polarity",
        command: &["finetune", "glue"],
        config: "configs/finetune-rt-polarity.toml",
        metric: "accuracy",
        metric_label: "held-out accuracy (%)",
        steps: ctx.pick(480, 16),
        // Quick: a higher peak, so 16 steps learn something.
        peak: ctx.pick(5e-5, 2e-4),
        // Quick: half the batch and shorter sentences, within the CI budget.
        extra: if ctx.quick {
            vec![
                ("train.global_batch", "16".into()),
                ("train.micro_batch", "4".into()),
                ("task.max_seq", "32".into()),
            ]
        } else {
            vec![("train.micro_batch", "8".into())]
        },
        // Balanced classes: chance is 50% (MiniLM with its untrained head
        // scores 51.9% on these sentences, README).
        untrained: 50.0,
        margin: 10.0,
        eval_examples: 823,
        late_freeze_test: false,
    }
}

/// SQuAD: `configs/finetune-squad.toml` as `cargo xtask finetune squad`
/// runs it (240 steps of 16 windows of 256, peak 1e-4: Adam's F1 53.48 on
/// the first 1,000 dev questions, README), scored on those 1,000.
fn squad(ctx: &Context) -> Task {
    Task {
        name: "squad",
        command: &["finetune", "squad"],
        config: "configs/finetune-squad.toml",
        metric: "f1",
        metric_label: "F1 on the first dev questions",
        steps: ctx.pick(240, 8),
        peak: ctx.pick(1e-4, 3e-4),
        extra: if ctx.quick {
            vec![
                ("train.micro_batch", "4".into()),
                ("task.max_seq", "128".into()),
                ("task.max_query", "32".into()),
                ("task.doc_stride", "64".into()),
                ("task.dev_questions", "50".into()),
            ]
        } else {
            vec![("train.micro_batch", "4".into())]
        },
        // An untrained span head scores F1 6.33 (README); the issue asks
        // for a reference above 50.
        untrained: 0.0,
        margin: 50.0,
        eval_examples: ctx.pick(1000, 50),
        // 1-bit Adam's first seed ended 10 F1 below Adam's: the gradient
        // norm grows ~4× over the run (Adam's RMS 7.7 over the 48 warmup
        // steps, 34.2 over the last 60), so the variance frozen at step 48
        // is far too small for the later gradients.
        late_freeze_test: true,
    }
}

/// `reproduce finetune-parity`: rt-polarity.
pub fn run(ctx: &Context) -> Result<Outcome> {
    run_task(ctx, rt_polarity(ctx))
}

/// `reproduce finetune-parity-squad`: SQuAD.
pub fn run_squad(ctx: &Context) -> Result<Outcome> {
    run_task(ctx, squad(ctx))
}

fn run_task(ctx: &Context, task: Task) -> Result<Outcome> {
    // Quick: two seeds of the reference give a spread, one seed of the
    // 1-bit optimizer is judged against it (the CI budget).
    let seeds: &[u64] = ctx.pick(&[1, 2, 3], &[1, 2]);
    let mut body = String::new();
    let mut claims = Vec::new();
    let mut all_logs = Vec::new();
    let mut scores_per_seed = Vec::new();
    for pair in &PAIRS {
        let compared = run_pair(ctx, &task, pair, seeds)?;
        body.push_str(&compared.text);
        claims.extend(compared.claims);
        scores_per_seed.extend(compared.series);
        all_logs.extend(compared.logs);
    }
    ctx.report.write_runs(&all_logs)?;
    draw_plots(ctx, &task, seeds, &all_logs, &scores_per_seed)?;
    Ok(Outcome {
        title: format!(
            "Fine-tuning {} with 1-bit Adam and 1-bit LAMB scores like Adam and LAMB (1-bit Adam \
             §7.1, Table 3)",
            task.name
        ),
        body: format!(
            "MiniLM (all-MiniLM-L6-v2) fine-tuned on {WORKERS} workers (local ranks) from the \
             same pretrained weights, `{}` with overrides, every optimizer with bias correction \
             and its 1-bit version freezing at 20% of the steps, seeds {seeds:?}; the seed sets \
             the head's initialisation, the data order and dropout.\n{body}\n\
             ![score per seed](plot.png)\n\n![training loss, first seed](loss.png)\n",
            task.config
        ),
        claims,
    })
}

/// What one pair's comparison produced.
struct Compared {
    /// Its section of table.md.
    text: String,
    claims: Vec<Claim>,
    /// The reference's and the compressed optimizer's score per seed.
    series: Vec<Series>,
    logs: Vec<RunLog>,
}

/// Runs one pair's variants (and, where the task asks for it, 1-bit Adam's
/// late-freeze test) and compares their scores.
fn run_pair(ctx: &Context, task: &Task, pair: &Pair, seeds: &[u64]) -> Result<Compared> {
    let compressed_seeds: &[u64] = ctx.pick(&[1, 2, 3], &[1]);
    let freeze = task.steps / 5;
    let peak = task.peak * pair.peak_scale;
    // (optimizer, label, its own fields, seeds)
    let mut groups = vec![
        (
            pair.reference.0,
            pair.reference.0.to_string(),
            String::new(),
            seeds,
        ),
        (
            pair.compressed.0,
            pair.compressed.0.to_string(),
            format!(", freeze_step = {freeze}"),
            compressed_seeds,
        ),
    ];
    let late_step = task.steps / 2;
    let late_label = format!("{}_freeze{late_step}", pair.compressed.0);
    let late_test = task.late_freeze_test && !ctx.quick && pair.compressed.0 == "onebit_adam";
    if late_test {
        groups.push((
            pair.compressed.0,
            late_label.clone(),
            format!(", freeze_step = {late_step}"),
            &seeds[..1],
        ));
    }
    let mut variants = Vec::new();
    for (name, label, fields, seeds) in groups {
        let optimizer =
            format!("{{ name = \"{name}\", weight_decay = 0.01, bias_correction = true{fields} }}");
        for &seed in seeds {
            let v = seed_variant(task, &label, &optimizer, seed, peak);
            // The late-freeze test's subject.
            variants.push(if label == late_label {
                v.varies("optimizer.freeze_step")
            } else {
                v
            });
        }
    }
    let logs = run_all(ctx, &ctx.runs, &variants)?;
    let scores = |label: &str| -> Result<Vec<(u64, f64)>> {
        let prefix = format!("{}_{label}_seed", task.name);
        logs.iter()
            .filter_map(|l| Some((l, l.label.strip_prefix(&prefix)?.parse().ok()?)))
            .map(|(l, seed)| Ok((seed, percent(task.metric, l.final_eval(task.metric)?))))
            .collect()
    };
    let reference = scores(pair.reference.0)?;
    let compressed = scores(pair.compressed.0)?;
    let (table, claim) = compare(task, pair, ctx.quick, seeds, &reference, &compressed);
    let mut text = format!(
        "\n## {} against {}\n\n{} steps, peak {peak:e}, {} freezes at step {freeze}; score: \
         {}.\n\n{table}",
        pair.compressed.1, pair.reference.1, task.steps, pair.compressed.1, task.metric_label,
    );
    let mut claims = vec![claim];
    if late_test {
        let late = scores(&late_label)?;
        let (late_text, claim) =
            late_freeze(task, &reference, &compressed, &late, late_step, freeze);
        text.push_str(&late_text);
        claims.push(claim);
    }
    let series = [
        (pair.reference.1, &reference),
        (pair.compressed.1, &compressed),
    ]
    .into_iter()
    .map(|(name, scores)| Series {
        label: name.to_string(),
        points: scores.iter().map(|&(s, v)| (s as f64, v)).collect(),
    })
    .collect();
    Ok(Compared {
        text,
        claims,
        series,
        logs,
    })
}

/// One seed of `optimizer` (labelled `label`) fine-tuning the task at
/// learning-rate peak `peak`.
fn seed_variant(task: &Task, label: &str, optimizer: &str, seed: u64, peak: f64) -> Variant {
    let mut v = Variant::new(
        &format!("{}_{label}_seed{seed}", task.name),
        task.command,
        task.config,
        WORKERS,
    )
    .set("optimizer", optimizer)
    .set("train.seed", seed)
    .varies("train.seed")
    .set("train.steps", task.steps)
    .set("train.checkpoint_every", task.steps / 4)
    .set("train.eval_every", 0)
    .set("schedule.peak", peak)
    .set("schedule.warmup_steps", task.steps / 10)
    .set("schedule.total_steps", task.steps);
    for (key, value) in &task.extra {
        v = v.set(key, value);
    }
    v
}

/// plot.png, every seed's score per optimizer; loss.png, the first seed's
/// training loss.
fn draw_plots(
    ctx: &Context,
    task: &Task,
    seeds: &[u64],
    all_logs: &[RunLog],
    scores_per_seed: &[Series],
) -> Result<()> {
    draw(
        &ctx.report.path("plot.png"),
        &Chart {
            x_ticks: Some(whole),
            ..Chart::new(
                &format!("{}: score per seed, {WORKERS} workers", task.name),
                "seed",
                task.metric_label,
            )
        },
        scores_per_seed,
    )?;
    let first_seed: Vec<RunLog> = all_logs
        .iter()
        .filter(|l| l.label.ends_with(&format!("_seed{}", seeds[0])))
        .cloned()
        .collect();
    draw(
        &ctx.report.path("loss.png"),
        &Chart {
            clip_above_start: true,
            ..Chart::new(
                &format!(
                    "{}: training loss of seed {} (moving average)",
                    task.name, seeds[0]
                ),
                "step",
                "loss",
            )
        },
        &loss_curves(&first_seed, 1.0, ctx.pick(20, 2)),
    )
}
