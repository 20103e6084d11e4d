//! `reproduce slamb-ratio`: SLAMB Tables 3, 10 and 14.
//!
//! Claim: SLAMB keeps LAMB's loss down to small k (the paper: k = 0.1 is
//! free, k = 0.01 costs a little) while sending `1/(k + 1/H)` times fewer
//! bytes than LAMB's fp32 allreduce, more than 1-bit LAMB saves end to end.

use anyhow::Result;

use super::gates;
use super::onebit_lamb::{self, WORKERS};
use super::plot::draw_pretraining_loss;
use super::report::Table;
use super::runner::{RunLog, Variant, check_comparable, run_all};
use super::{Claim, Context, Outcome, num};

pub fn run(ctx: &Context) -> Result<Outcome> {
    let (steps, batch, _) = onebit_lamb::shape(ctx);
    let freeze = onebit_lamb::freeze_step(ctx);
    let sync_every = ctx.pick(100, 20);
    let ratios: &[f64] = ctx.pick(&[0.5, 0.2, 0.1, 0.05, 0.01], &[0.1, 0.01]);
    let (logs, variants) = run_variants(ctx, ratios, sync_every)?;
    ctx.report.write_runs(&logs)?;

    let (table, sweep) = sweep_table(&logs, &variants, sync_every)?;
    let claims = claims(ctx, &logs, &sweep, sync_every, steps);
    draw_pretraining_loss(
        ctx,
        "plot.png",
        &logs,
        batch,
        &format!("BERT-Tiny pre-training, {WORKERS} workers: LAMB, 1-bit LAMB, SLAMB"),
        "MLM + NSP loss (moving average)",
    )?;
    Ok(Outcome {
        title: "SLAMB: loss and volume across compression ratios (SLAMB Tables 3, 10, 14)".into(),
        body: format!(
            "BERT-Tiny, State of the Union addresses and SQuAD training articles, seq 128, \
             {steps} steps of batch {batch}, {WORKERS} workers (local ranks), H = {sync_every}; \
             1-bit LAMB freezes at step {freeze}. The config and the LAMB and 1-bit LAMB runs \
             are `reproduce onebit-lamb`'s. Bytes are the traffic meter's count for rank 0 over \
             the whole run.\n\n{}\n\
             ![training loss](plot.png)\n",
            table.markdown()
        ),
        claims,
    })
}

/// Runs (or reuses) LAMB, 1-bit LAMB and SLAMB at each of `ratios`; their
/// logs and variants, in that order.
fn run_variants(
    ctx: &Context,
    ratios: &[f64],
    sync_every: u64,
) -> Result<(Vec<RunLog>, Vec<Variant>)> {
    // LAMB and 1-bit LAMB are onebit-lamb's runs (same config, same
    // optimizer fields): run once, compared in both experiments.
    let shared = onebit_lamb::shared_variants(ctx);
    let slamb: Vec<Variant> = ratios
        .iter()
        .map(|&k| {
            onebit_lamb::variant(
                ctx,
                &format!("slamb_k{k}"),
                &format!("name = \"slamb\", k = {k}, sync_every = {sync_every}"),
            )
            // The subject of the sweep.
            .varies("optimizer.k")
            // A name both optimizers use for different things: SLAMB's β3
            // is its staleness decay (0.93), 1-bit LAMB's its average of
            // the trust ratios (0.9); each keeps its paper's default.
            .varies("optimizer.beta_3")
        })
        .collect();
    let shared_dir = ctx.sibling("onebit-lamb");
    check_comparable(ctx, &[(&shared_dir, &shared), (&ctx.runs, &slamb)])?;
    let logs: Vec<RunLog> = run_all(ctx, &shared_dir, &shared)?
        .into_iter()
        .chain(run_all(ctx, &ctx.runs, &slamb)?)
        .collect();
    Ok((logs, shared.into_iter().chain(slamb).collect()))
}

/// What the sweep's claims compare: 1-bit LAMB's volume reduction and,
/// for each k, SLAMB's reduction and loss.
struct Sweep {
    onebit_reduction: f64,
    /// `(k, volume reduction vs LAMB, final held-out loss)` per ratio.
    reductions: Vec<(f64, f64, f64)>,
}

/// One table row per run, and the sweep's numbers.
fn sweep_table(logs: &[RunLog], variants: &[Variant], sync_every: u64) -> Result<(Table, Sweep)> {
    let lamb_bytes = logs[0].total("bytes_sent");
    let lamb_loss = logs[0].final_eval("held_out_loss")?;
    let mut table = Table::new(&[
        "optimizer",
        "final held-out loss",
        "vs LAMB",
        "MB sent per rank",
        "MLM accuracy",
        "unigram baseline",
        "volume reduction vs LAMB",
        "paper's 1/(k + 1/H)",
    ]);
    let mut reductions = Vec::new();
    for (log, variant) in logs.iter().zip(variants) {
        let loss = log.final_eval("held_out_loss")?;
        let bytes = log.total("bytes_sent");
        let reduction = lamb_bytes / bytes.max(1.0);
        let k = variant
            .label
            .strip_prefix("slamb_k")
            .and_then(|k| k.parse::<f64>().ok());
        let formula = k.map(|k| 1.0 / (k + 1.0 / sync_every as f64));
        table.row(vec![
            log.label.clone(),
            log.show(loss, num),
            log.show(loss, |loss| {
                format!("{:+.2}%", 100.0 * (loss - lamb_loss) / lamb_loss)
            }),
            num(bytes / 1e6),
            log.final_eval("mlm_accuracy")
                .map_or("–".into(), |a| log.show(a, num)),
            log.final_eval("mlm_majority_accuracy")
                .map_or("not logged".into(), num),
            format!("{}×", num(reduction)),
            formula.map_or("–".into(), |f| format!("{}×", num(f))),
        ]);
        if let Some(k) = k {
            reductions.push((k, reduction, loss));
        }
    }
    let onebit_reduction = lamb_bytes / logs[1].total("bytes_sent").max(1.0);
    Ok((
        table,
        Sweep {
            onebit_reduction,
            reductions,
        },
    ))
}

/// The volume reduction grows as k shrinks, and, where k = 0.1 ran, that
/// ratio's claims ([`k01_claims`]).
fn claims(
    ctx: &Context,
    logs: &[RunLog],
    sweep: &Sweep,
    sync_every: u64,
    steps: u64,
) -> Vec<Claim> {
    let reductions = &sweep.reductions;
    let mut claims = vec![Claim::new(
        reductions.windows(2).all(|w| w[1].1 > w[0].1),
        format!(
            "the volume reduction grows as k shrinks: {}",
            reductions
                .iter()
                .map(|(k, r, _)| format!("k={k}: {}×", num(*r)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )];
    if let Some(&(_, reduction, loss)) = reductions.iter().find(|(k, _, _)| *k == 0.1) {
        claims.extend(k01_claims(
            ctx, logs, sweep, reduction, loss, sync_every, steps,
        ));
    }
    claims
}

/// The claims about SLAMB at k = 0.1 (its `reduction` and `loss`): its
/// volume against the formula, the reference learned (full run), quality
/// against k, parity with LAMB (full run), and its saving against 1-bit
/// LAMB's.
fn k01_claims(
    ctx: &Context,
    logs: &[RunLog],
    sweep: &Sweep,
    reduction: f64,
    loss: f64,
    sync_every: u64,
    steps: u64,
) -> Vec<Claim> {
    let reductions = &sweep.reductions;
    let mut claims = Vec::new();
    let paper = 1.0 / (0.1 + 1.0 / sync_every as f64);
    let off = (reduction - paper).abs() / paper;
    claims.push(Claim::new(
        off <= 0.02,
        format!(
            "SLAMB at k = 0.1 sends {}× less than LAMB, within 2% of the formula 1/(k + 1/H) \
             = {}× ({:.2}% off: small always-synchronised segments; paper's Table 1: 9.1× at \
             H = 100)",
            num(reduction),
            num(paper),
            100.0 * off
        ),
    ));
    // Convergence claims need a reference that learned (full run only).
    let (learned, learned_text) = if ctx.quick {
        (true, String::new())
    } else {
        gates::mlm_learned(&logs[0])
    };
    if !ctx.quick {
        claims.push(Claim::new(
            learned,
            format!("the reference learned: {learned_text}"),
        ));
    }
    if let Some(&(_, _, loss_001)) = reductions.iter().find(|(k, _, _)| *k == 0.01) {
        claims.push(gates::claim(
            learned,
            loss <= loss_001,
            format!(
                "quality falls as k shrinks (Table 3: max F1 90.79 at k = 0.1, 87.85 at \
                 0.01): held-out loss {} at k = 0.1, {} at k = 0.01",
                num(loss),
                num(loss_001)
            ),
        ));
    }
    // Table 3 is flat down to k = 0.1 (max F1 90.797 / 90.799 / 90.790 at
    // k = 0.5 / 0.2 / 0.1 against LAMB's 90.754) and costs quality only
    // below: the full run's k >= 0.1 each tracking LAMB (`gates::tracks`:
    // within 2% at the end and at twice the run's length), not only
    // within 2% at the last step, which a gap still growing passes.
    if !ctx.quick {
        let verdicts: Vec<(bool, String)> = reductions
            .iter()
            .filter(|(k, _, _)| *k >= 0.1)
            .map(|&(k, _, _)| {
                let label = format!("slamb_k{k}");
                let (holds, text) = logs
                    .iter()
                    .find(|l| l.label == label)
                    .map_or((false, format!("no {label} run")), |log| {
                        gates::tracks(&logs[0], log, steps, steps / 10)
                    });
                (holds, format!("k = {k}: {text}"))
            })
            .collect();
        claims.push(gates::claim(
            learned,
            !verdicts.is_empty() && verdicts.iter().all(|(holds, _)| *holds),
            format!(
                "no quality lost down to k = 0.1 (SLAMB Table 3, flat from k = 0.5 to 0.1): \
                 each tracks LAMB; {}",
                verdicts
                    .iter()
                    .map(|(_, text)| text.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ));
    }
    // Parity with LAMB needs the full run's length: after 60 quick steps
    // the sparse momenta are still far from the dense one's.
    if !ctx.quick {
        let k01 = logs.iter().find(|l| l.label == "slamb_k0.1");
        let (tracks, tracks_text) = k01.map_or((false, "no k = 0.1 run".into()), |log| {
            gates::tracks(&logs[0], log, steps, steps / 10)
        });
        claims.push(gates::claim(
            learned,
            tracks,
            format!("SLAMB at k = 0.1 tracks LAMB: {tracks_text}"),
        ));
    }
    claims.push(Claim::new(
        reduction > sweep.onebit_reduction,
        format!(
            "end to end, SLAMB at k = 0.1 saves more than 1-bit LAMB with its warmup: {}× \
             vs {}×",
            num(reduction),
            num(sweep.onebit_reduction)
        ),
    ));
    claims
}
