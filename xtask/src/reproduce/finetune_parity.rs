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
use super::report::Table;
use super::runner::{RunLog, Variant, run_all};
use super::{Claim, Context, Outcome, gates, num};

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

/// The late-freeze test: 1-bit Adam's first seed frozen at `late` instead
/// of `freeze` ends closer to Adam's mean than the same seed frozen at
/// `freeze`.
fn late_freeze(
    task: &Task,
    reference: &[(u64, f64)],
    compressed: &[(u64, f64)],
    late: &[(u64, f64)],
    late_step: u64,
    freeze: u64,
) -> (String, Claim) {
    let adam = mean(&reference.iter().map(|&(_, v)| v).collect::<Vec<_>>());
    let Some(&(seed, late_score)) = late.first() else {
        return (
            String::new(),
            Claim::new(false, "the late-freeze test did not run".to_string()),
        );
    };
    let early = compressed
        .iter()
        .find(|&&(s, _)| s == seed)
        .map_or(f64::NAN, |&(_, v)| v);
    let claim = Claim::new(
        (late_score - adam).abs() < (early - adam).abs(),
        format!(
            "{}, the test of why 1-bit Adam trails Adam: freezing at step {late_step} instead \
             of {freeze}, seed {seed} ends closer to Adam's mean {}: {} against {}",
            task.name,
            num(adam),
            num(late_score),
            num(early)
        ),
    );
    let text = format!(
        "\nThe test of why: 1-bit Adam, seed {seed}, freezing at step {late_step} (half the \
         steps) instead of {freeze}: {} {} against {} (Adam's mean {}).\n",
        task.metric_label,
        num(late_score),
        num(early),
        num(adam)
    );
    (text, claim)
}

/// Accuracies are logged as fractions, F1 as percent.
fn percent(metric: &str, value: f64) -> f64 {
    if metric == "accuracy" {
        100.0 * value
    } else {
        value
    }
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

fn spread(xs: &[f64]) -> f64 {
    let max = xs.iter().copied().fold(f64::MIN, f64::max);
    let min = xs.iter().copied().fold(f64::MAX, f64::min);
    max - min
}

/// A pair's table and its claim: the means differ by no more than the
/// reference's seed spread (max − min over seeds), the noise of the
/// baseline itself.
fn compare(
    task: &Task,
    pair: &Pair,
    quick: bool,
    seeds: &[u64],
    reference: &[(u64, f64)],
    compressed: &[(u64, f64)],
) -> (String, Claim) {
    let mut header = vec!["optimizer".to_string()];
    header.extend(seeds.iter().map(|s| format!("seed {s}")));
    header.extend(["mean".into(), "spread (max − min)".into()]);
    let mut table = Table::new(&header.iter().map(String::as_str).collect::<Vec<_>>());
    let values = |scores: &[(u64, f64)]| scores.iter().map(|&(_, v)| v).collect::<Vec<_>>();
    for (name, scores) in [
        (pair.reference.1, reference),
        (pair.compressed.1, compressed),
    ] {
        let mut row = vec![name.to_string()];
        row.extend(seeds.iter().map(|seed| {
            scores
                .iter()
                .find(|(s, _)| s == seed)
                .map_or("–".into(), |&(_, v)| num(v))
        }));
        row.extend([num(mean(&values(scores))), num(spread(&values(scores)))]);
        table.row(row);
    }
    let (reference, compressed) = (values(reference), values(compressed));
    let difference = (mean(&compressed) - mean(&reference)).abs();
    let tolerance = spread(&reference);
    // The evaluation set's own noise: every run is scored on the same
    // examples, so averaging seeds does not shrink it; taken as
    // independent for the two optimizers (an upper bound: the per-example
    // scores that would pair them are not logged).
    let se = |score: f64| gates::run_standard_error(score, task.eval_examples);
    let se_difference = se(mean(&reference)).hypot(se(mean(&compressed)));
    let (learned, learned_text) = if quick {
        (
            true,
            "quick scale: a direction check, not a reproduction".to_string(),
        )
    } else {
        gates::score_learned(
            pair.reference.1,
            mean(&reference),
            (task.untrained, task.margin),
            se(mean(&reference)),
            task.metric_label,
        )
    };
    let text = format!(
        "{}: {}'s mean {} is within the seeds' spread of {}'s {} (difference {}, {}'s spread \
         {}); {learned_text}",
        task.name,
        pair.compressed.1,
        num(mean(&compressed)),
        pair.reference.1,
        num(mean(&reference)),
        num(difference),
        pair.reference.1,
        num(tolerance),
    );
    let claim = if quick {
        Claim::new(difference <= tolerance, text)
    } else if !learned {
        Claim::undecided(format!("{text} — undecided: the reference has not learned"))
    } else {
        gates::parity(difference, se_difference, tolerance, text)
    };
    (table.markdown(), claim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reproduce::Verdict;

    #[test]
    fn parity_is_judged_against_the_seed_spread_and_the_evaluation_sets_noise() {
        // An evaluation set so large that its noise (0.04 points) is
        // negligible against the seeds' spread.
        let mut task = Task {
            name: "t",
            command: &["finetune", "glue"],
            config: "c.toml",
            metric: "accuracy",
            metric_label: "accuracy",
            steps: 10,
            peak: 1e-4,
            extra: vec![],
            untrained: 50.0,
            margin: 10.0,
            eval_examples: 1_000_000,
            late_freeze_test: false,
        };
        let lamb = &PAIRS[1];
        let scores = |v: [f64; 3]| vec![(1, v[0]), (2, v[1]), (3, v[2])];
        let reference = scores([79.0, 80.0, 81.0]);
        // Means 80 and 81, the reference's spread 2: within.
        let (_, claim) = compare(
            &task,
            lamb,
            false,
            &[1, 2, 3],
            &reference,
            &scores([80.5, 81.0, 81.5]),
        );
        assert!(claim.holds(), "{}", claim.text);
        assert!(
            claim.text.starts_with("t: 1-bit LAMB's mean 81.00"),
            "{}",
            claim.text
        );
        // Means 80 and 84, the reference's spread 2: outside.
        let (table, claim) = compare(
            &task,
            lamb,
            false,
            &[1, 2, 3],
            &reference,
            &scores([83.5, 84.0, 84.5]),
        );
        assert!(!claim.holds(), "{}", claim.text);
        assert!(
            table.contains("| 1-bit LAMB | 83.50 | 84.00 | 84.50 | 84.00 | 1.000 |"),
            "{table}"
        );
        // One compressed seed against the reference's two: missing seeds
        // shown as –.
        let (table, claim) = compare(
            &task,
            &PAIRS[0],
            false,
            &[1, 2],
            &reference[..2],
            &[(1, 80.0)],
        );
        assert!(claim.holds(), "{}", claim.text);
        assert!(
            table.contains("| 1-bit Adam | 80.00 | – | 80.00 | 0 |"),
            "{table}"
        );
        // Parity between two models that did not learn is not a result:
        // the reference's mean 55 is short of chance 50 + 10.
        let low = scores([54.0, 55.0, 56.0]);
        let (_, claim) = compare(
            &task,
            lamb,
            false,
            &[1, 2, 3],
            &low,
            &scores([55.0, 55.0, 55.0]),
        );
        assert!(
            claim.verdict == Verdict::Undecided && claim.text.contains("has not learned"),
            "{}",
            claim.text
        );
        // On 823 examples each mean carries ±1.4 points of the set's own
        // noise: means 80 and 81 can be neither within the spread 2 nor
        // outside it; 80 and 86 are outside whatever the noise.
        task.eval_examples = 823;
        let (_, claim) = compare(
            &task,
            lamb,
            false,
            &[1, 2, 3],
            &reference,
            &scores([80.5, 81.0, 81.5]),
        );
        assert_eq!(claim.verdict, Verdict::Undecided, "{}", claim.text);
        let (_, claim) = compare(
            &task,
            lamb,
            false,
            &[1, 2, 3],
            &reference,
            &scores([85.5, 86.0, 86.5]),
        );
        assert_eq!(claim.verdict, Verdict::DoesNotHold, "{}", claim.text);
    }

    #[test]
    fn the_late_freeze_test_compares_the_same_seed_with_the_reference_mean() {
        let task = Task {
            name: "squad",
            command: &["finetune", "squad"],
            config: "c.toml",
            metric: "f1",
            metric_label: "F1",
            steps: 240,
            peak: 1e-4,
            extra: vec![],
            untrained: 0.0,
            margin: 50.0,
            eval_examples: 1000,
            late_freeze_test: true,
        };
        let adam = vec![(1, 54.0), (2, 56.0), (3, 57.0)];
        let early = vec![(1, 44.0), (2, 50.0), (3, 52.0)];
        // Adam's mean 55.67: 50 is closer than seed 1's 44.
        let (text, claim) = late_freeze(&task, &adam, &early, &[(1, 50.0)], 120, 48);
        assert!(claim.holds(), "{}", claim.text);
        assert!(
            claim
                .text
                .contains("freezing at step 120 instead of 48, seed 1"),
            "{}",
            claim.text
        );
        assert!(text.contains("50.00 against 44.00"), "{text}");
        // 38 is farther from 55.67 than 44.
        let (_, claim) = late_freeze(&task, &adam, &early, &[(1, 38.0)], 120, 48);
        assert!(!claim.holds(), "{}", claim.text);
        // Overshooting Adam by more than seed 1 trails it is also farther.
        let (_, claim) = late_freeze(&task, &adam, &early, &[(1, 68.0)], 120, 48);
        assert!(!claim.holds(), "{}", claim.text);
        // Not run: never holds.
        let (_, claim) = late_freeze(&task, &adam, &early, &[], 120, 48);
        assert!(!claim.holds(), "{}", claim.text);
    }
}
