//! `reproduce deepspeed-settings`: the pre-training claims that do not hold
//! at terse's settings (1-bit LAMB tracks LAMB, SLAMB at k = 0.1 tracks
//! LAMB, 1-bit Adam tracks Adam), re-run with the settings the papers'
//! code and DeepSpeed's BERT configs use (issue 53), three seeds each:
//! - every optimizer without bias correction (DeepSpeed's 1-bit optimizers
//!   never apply it; the references follow so that only compression
//!   differs) and gradients clipped at norm 1.0 (`gradient_clipping`);
//! - 1-bit Adam and 1-bit LAMB with DeepSpeed's arithmetic: the
//!   whole-buffer worker scale (`scale = "deepspeed"`), 1-bit LAMB's factor
//!   blended with the weight decay's share, its `exp_avg_mask` as a
//!   momentum mask over the position rows past the sequence length instead
//!   of terse's hold of zero-variance coordinates, and the freeze at 25% of
//!   the steps, after the learning-rate warmup (terse's runs freeze at its
//!   end);
//! - SLAMB with LAMB's trust clip (`phi_max = 0.3`, LAMB's `c_max`), which
//!   `slamb-ratio` compares at 0.4.
//!
//! The LAMB family runs `onebit-lamb`'s large-batch config, the Adam pair
//! `onebit-adam`'s; their earlier results are the terse-settings side of
//! the comparison. A run takes 16–40 minutes on 2 cores, fifteen runs more
//! than one session: finished variants are kept in `results/…/finished/`
//! until all have run.

use anyhow::Result;

use super::gates;
use super::plot::draw_pretraining_loss;
use super::report::Table;
use super::runner::{RunLog, Variant, check_comparable, run_all};
use super::{Claim, Context, Outcome, num, onebit_adam, onebit_lamb};

/// DeepSpeedExamples' `exp_avg_mask`: BERT's position rows past the
/// sequence length (128 of BERT-Tiny's 512) never see a gradient.
const POSITION_MASK: &str =
    "momentum_mask = [\"bert.embeddings.position_embeddings.weight[128:]\"]";

/// One comparison: a reference and a compressed optimizer, run on the same
/// seeds, and what terse's own settings gave (the earlier results).
struct Comparison {
    what: &'static str,
    reference: &'static str,
    compressed: &'static str,
    /// The compressed optimizer's final held-out gap at terse's settings,
    /// percent, and where it is recorded.
    terse_gap: (f64, &'static str),
}

const COMPARISONS: [Comparison; 3] = [
    Comparison {
        what: "1-bit LAMB tracks LAMB",
        reference: "lamb",
        compressed: "onebit_lamb",
        terse_gap: (8.97, "results/onebit-lamb"),
    },
    Comparison {
        what: "SLAMB at k = 0.1 tracks LAMB",
        reference: "lamb",
        compressed: "slamb_k0.1",
        terse_gap: (1.10, "results/slamb-ratio"),
    },
    Comparison {
        what: "1-bit Adam tracks Adam",
        reference: "adam",
        compressed: "onebit_adam",
        terse_gap: (2.84, "results/onebit-adam"),
    },
];

fn label(name: &str, seed: u64) -> String {
    format!("{name}_seed{seed}")
}

/// The label of `name`'s run of `seed` with `r` turned back.
pub(super) fn reverted_label(name: &str, seed: u64, r: Reversion) -> String {
    format!("{}{}", label(name, seed), r.suffix())
}

/// One of DeepSpeed's settings turned back to terse's, for
/// `deepspeed-attribution` (which of them moved each claim); `None` is
/// DeepSpeed's settings throughout, this experiment's runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reversion {
    None,
    /// Bias correction on and no gradient clipping, for the references too.
    RunSettings,
    /// Bias correction on, for the references too; clipping kept.
    BiasCorrection,
    /// The freeze where terse's runs put it: at 20% of the steps (1-bit
    /// LAMB: the end of its warmup) instead of at 25%.
    Freeze,
    /// terse's per-chunk L1 worker scale instead of DeepSpeed's
    /// whole-buffer L2.
    Scale,
    /// terse's hold of zero-variance coordinates instead of DeepSpeed's
    /// position-row `exp_avg_mask`.
    Hold,
    /// 1-bit LAMB's factor without DeepSpeed's weight-decay blend.
    DecayBlend,
}

impl Reversion {
    /// The label suffix of a variant with this reversion.
    fn suffix(self) -> &'static str {
        match self {
            Self::None => "",
            Self::RunSettings => "_terse_run",
            Self::BiasCorrection => "_bias_correction",
            Self::Freeze => "_terse_freeze",
            Self::Scale => "_terse_scale",
            Self::Hold => "_terse_hold",
            Self::DecayBlend => "_no_decay_blend",
        }
    }

    /// Whether a variant with this reversion corrects the moments' bias.
    pub(super) fn bias_correction(self) -> bool {
        matches!(self, Self::RunSettings | Self::BiasCorrection)
    }

    /// The config keys a variant with this reversion differs in from
    /// DeepSpeed's settings.
    fn keys(self) -> &'static [&'static str] {
        match self {
            Self::None => &[],
            Self::RunSettings => &["optimizer.bias_correction", "train.max_grad_norm"],
            Self::BiasCorrection => &["optimizer.bias_correction"],
            Self::Freeze => &["optimizer.freeze_step"],
            Self::Scale => &["optimizer.scale"],
            Self::Hold => &["optimizer.hold_zero_variance", "optimizer.momentum_mask"],
            Self::DecayBlend => &["optimizer.decay_blend"],
        }
    }
}

/// The 1-bit optimizers' compression fields under `r`: the freeze at 25%
/// of `steps` (20% when reverted), DeepSpeed's scale, `own` (the
/// optimizer's own fields), DeepSpeed's mask. (Their order is the recorded
/// command line that a finished run is reused by.)
fn compression_fields(r: Reversion, steps: u64, own: &str) -> String {
    let freeze = if r == Reversion::Freeze {
        steps / 5
    } else {
        steps / 4
    };
    let scale = if r == Reversion::Scale {
        String::new()
    } else {
        ", scale = \"deepspeed\"".into()
    };
    let mask = if r == Reversion::Hold {
        String::new()
    } else {
        format!(", hold_zero_variance = false, {POSITION_MASK}")
    };
    format!("freeze_step = {freeze}{scale}{own}{mask}")
}

/// The settings every variant shares: clipping, and the seed under study.
fn shared(variant: Variant, seed: u64, r: Reversion) -> Variant {
    // terse's runs leave clipping out (`max_grad_norm` absent).
    let clipped = if r == Reversion::RunSettings {
        variant
    } else {
        variant.set("train.max_grad_norm", 1.0)
    };
    r.keys().iter().fold(
        clipped.set("train.seed", seed).varies("train.seed"),
        |v, key| v.varies(key),
    )
}

/// LAMB, 1-bit LAMB and SLAMB on `onebit-lamb`'s large-batch config.
pub(super) fn lamb_family(ctx: &Context, seed: u64, r: Reversion) -> Vec<Variant> {
    let blend = format!(", decay_blend = {}", r != Reversion::DecayBlend);
    let compression = compression_fields(r, onebit_lamb::shape(ctx).0, &blend);
    [
        ("lamb", "name = \"lamb\"".to_string()),
        (
            "onebit_lamb",
            format!("name = \"onebit_lamb\", {compression}"),
        ),
        (
            "slamb_k0.1",
            "name = \"slamb\", k = 0.1, phi_max = 0.3".to_string(),
        ),
    ]
    .into_iter()
    .map(|(name, fields)| {
        let label = reverted_label(name, seed, r);
        let bias_correction = r.bias_correction();
        let v = onebit_lamb::variant_with(ctx, &label, &fields, bias_correction);
        // 1-bit LAMB's β3 (its coefficients' average) and SLAMB's (its
        // freshness decay) share a name, not a meaning.
        shared(v, seed, r).varies("optimizer.beta_3")
    })
    .collect()
}

/// Adam and 1-bit Adam on `onebit-adam`'s config.
pub(super) fn adam_pair(ctx: &Context, seed: u64, r: Reversion) -> Vec<Variant> {
    let compression = compression_fields(r, onebit_adam::shape(ctx).0, "");
    let bias_correction = r.bias_correction();
    [
        ("adam", "name = \"adam\"".to_string()),
        (
            "onebit_adam",
            format!("name = \"onebit_adam\", {compression}"),
        ),
    ]
    .into_iter()
    .map(|(name, fields)| {
        let optimizer =
            format!("{{ {fields}, weight_decay = 0.01, bias_correction = {bias_correction} }}");
        let label = reverted_label(name, seed, r);
        shared(onebit_adam::variant(ctx, &label, optimizer), seed, r)
    })
    .collect()
}

pub fn run(ctx: &Context) -> Result<Outcome> {
    let seeds: &[u64] = ctx.pick(&[1, 2, 3], &[1]);
    let families: Vec<[Vec<Variant>; 2]> = seeds
        .iter()
        .map(|&seed| {
            [
                lamb_family(ctx, seed, Reversion::None),
                adam_pair(ctx, seed, Reversion::None),
            ]
        })
        .collect();
    // Every seed of a family compared with the others before anything runs.
    for family in 0..2 {
        let all: Vec<Variant> = families.iter().flat_map(|f| f[family].clone()).collect();
        check_comparable(ctx, &[(&ctx.runs, &all)])?;
    }
    // Seed by seed, both families, so that an interrupted run has whole
    // comparisons of its first seeds.
    let mut logs = Vec::new();
    for family in families.iter().flatten() {
        logs.extend(run_all(ctx, &ctx.runs, family)?);
    }
    ctx.report.write_runs(&logs)?;
    let log = |name: &str, seed: u64| {
        logs.iter()
            .find(|l| l.label == label(name, seed))
            .expect("a variant above")
    };

    let mut table = Table::new(&[
        "run",
        "final held-out loss",
        "vs its reference, same seed",
        "MLM accuracy",
        "unigram baseline",
        "MB sent per rank",
    ]);
    let mut claims = Vec::new();
    for (reference, members) in [
        ("lamb", &["lamb", "onebit_lamb", "slamb_k0.1"][..]),
        ("adam", &["adam", "onebit_adam"][..]),
    ] {
        for &seed in seeds {
            for &name in members {
                let l = log(name, seed);
                let loss = l.final_eval("held_out_loss")?;
                table.row(vec![
                    l.label.clone(),
                    l.show(loss, num),
                    gates::percent_or_diverged(gates::held_out_gap(log(reference, seed), l)?),
                    l.show(l.final_eval("mlm_accuracy")?, num),
                    l.final_eval("mlm_majority_accuracy")
                        .map_or("not logged".into(), num),
                    num(l.total("bytes_sent") / 1e6),
                ]);
            }
        }
    }
    for c in &COMPARISONS {
        claims.push(if ctx.quick {
            quick_claim(c, log(c.reference, 1), log(c.compressed, 1))
        } else {
            let pairs: Vec<(&RunLog, &RunLog)> = seeds
                .iter()
                .map(|&s| (log(c.reference, s), log(c.compressed, s)))
                .collect();
            let steps = if c.reference == "adam" {
                onebit_adam::shape(ctx).0
            } else {
                onebit_lamb::shape(ctx).0
            };
            full_claim(c, &pairs, steps)
        });
    }
    let lamb_log: Vec<RunLog> = logs
        .iter()
        .filter(|l| l.label.ends_with("_seed1") && !l.label.contains("adam"))
        .cloned()
        .collect();
    draw_pretraining_loss(
        ctx,
        "plot.png",
        &lamb_log,
        onebit_lamb::shape(ctx).1,
        "BERT-Tiny, DeepSpeed's settings, seed 1: LAMB, 1-bit LAMB, SLAMB k = 0.1",
        "MLM + NSP loss (moving average)",
    )?;
    Ok(Outcome {
        title: "The claims that do not hold at terse's settings, with DeepSpeed's (issue 53)"
            .into(),
        body: format!(
            "Seeds {seeds:?}. Every optimizer without bias correction, gradients clipped at \
             1.0; 1-bit Adam and 1-bit LAMB with DeepSpeed's arithmetic (`scale = \
             \"deepspeed\"`, 1-bit LAMB's `decay_blend`, the position rows past 128 masked as \
             DeepSpeedExamples' `exp_avg_mask`, no hold of zero-variance coordinates), \
             freezing at 25% of the steps, after the 20% (LAMB) or 10% (Adam) warmup; SLAMB \
             at k = 0.1 with LAMB's trust clip 0.3. The LAMB family on `onebit-lamb`'s config \
             ({} steps of {}), the Adam pair on `onebit-adam`'s ({} steps of {}). A claim \
             holds when it holds on every seed, does not hold when on none, and is undecided \
             when the seeds disagree.\n\n{}\n![training loss](plot.png)\n",
            onebit_lamb::shape(ctx).0,
            onebit_lamb::shape(ctx).1,
            onebit_adam::shape(ctx).0,
            onebit_adam::shape(ctx).1,
            table.markdown()
        ),
        claims,
    })
}

/// The quick run checks the pipeline: each compressed optimizer ends within
/// 20% of its reference.
fn quick_claim(c: &Comparison, reference: &RunLog, compressed: &RunLog) -> Claim {
    let gap = gates::held_out_gap(reference, compressed).unwrap_or(f64::NAN);
    Claim::new(
        gap.abs() < 20.0,
        format!(
            "quick scale, DeepSpeed's settings: {} ends within 20% of {} ({})",
            c.compressed,
            c.reference,
            gates::percent_or_diverged(gap)
        ),
    )
}

/// A "tracks" claim over seeds: the gate on every seed's pair.
fn full_claim(c: &Comparison, pairs: &[(&RunLog, &RunLog)], steps: u64) -> Claim {
    let mut learned = true;
    let mut verdicts = Vec::new();
    let mut texts = Vec::new();
    for (reference, compressed) in pairs {
        let (clearly, learned_text) = gates::mlm_learned(reference);
        learned &= clearly;
        let (tracks, text) = gates::tracks(reference, compressed, steps, steps / 10);
        verdicts.push(tracks);
        texts.push(format!("{}: it {text}; {learned_text}", compressed.label));
    }
    let text = format!(
        "{} with DeepSpeed's settings, on every seed (at terse's settings: {:+.2}%, {}): {}",
        c.what,
        c.terse_gap.0,
        c.terse_gap.1,
        texts.join(" | ")
    );
    let claim = if verdicts.iter().all(|&t| t) {
        Claim::new(true, text)
    } else if verdicts.iter().all(|&t| !t) {
        Claim::new(false, text)
    } else {
        Claim::undecided(format!("{text} — undecided: the seeds disagree"))
    };
    if learned {
        claim
    } else {
        gates::claim(false, false, claim.text)
    }
}
