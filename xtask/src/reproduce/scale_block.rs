//! `reproduce scale-block` (beyond the papers): does one compression scale
//! per 2,048 elements, instead of one per chunk, remove 1-bit Adam's
//! divergence without moving ε inside the square root?
//!
//! Tarasov & Ershov trace the divergence to one scale per chunk handing
//! small-gradient coordinates the momentum size of large ones. A scale per
//! block of 2,048 elements keeps that mismatch local. The question is asked
//! on the same runs as `eps-fix` (VGG-16, ε outside) and `onebit-adam`
//! (BERT-Tiny): their per-chunk runs are shared, not re-run, when those
//! experiments already produced them.

use anyhow::Result;

use super::plot::{Chart, Series, draw, smooth};
use super::report::Table;
use super::runner::{RunLog, run_all};
use super::{Claim, Context, Outcome, eps_fix, num, onebit_adam};

/// Elements per compression scale in the block-scaled runs.
const BLOCK: usize = 2048;

pub fn run(ctx: &Context) -> Result<Outcome> {
    let (bert_table, mut claims, bert_logs) = bert(ctx)?;
    let mut body = bert_table;
    let mut logs = bert_logs;
    if !ctx.quick {
        let (vgg_table, vgg_claims, vgg_logs) = vgg(ctx)?;
        body.push_str(&vgg_table);
        claims.extend(vgg_claims);
        logs.extend(vgg_logs);
    }
    ctx.report.write_runs(&logs)?;
    Ok(Outcome {
        title: format!(
            "1-bit Adam with one scale per {BLOCK} elements against one per chunk (beyond the \
             papers)"
        ),
        body,
        claims,
    })
}

fn bert(ctx: &Context) -> Result<(String, Vec<Claim>, Vec<RunLog>)> {
    let (steps, batch, _) = onebit_adam::shape(ctx);
    let shared = run_all(
        &ctx.terse,
        &ctx.sibling("onebit-adam"),
        &[
            onebit_adam::variant(ctx, "adam", onebit_adam::optimizer(ctx, "adam", false, "")),
            onebit_adam::variant(
                ctx,
                "onebit_adam",
                onebit_adam::optimizer(ctx, "onebit_adam", true, ""),
            ),
        ],
    )?;
    let block = run_all(
        &ctx.terse,
        &ctx.runs,
        &[onebit_adam::variant(
            ctx,
            "onebit_adam_block2048",
            onebit_adam::optimizer(
                ctx,
                "onebit_adam",
                true,
                &format!(", scale_block = {BLOCK}"),
            ),
        )],
    )?;
    let logs = prefixed("bert_", shared.into_iter().chain(block));
    let mut table = Table::new(&[
        "optimizer",
        "final held-out loss",
        "vs Adam",
        "MB sent per rank",
    ]);
    let mut held = Vec::new();
    for log in &logs {
        held.push(log.final_eval("held_out_loss")?);
    }
    let adam = held[0];
    for (log, &loss) in logs.iter().zip(&held) {
        table.row(vec![
            log.label.clone(),
            num(loss),
            format!("{:+.2}%", 100.0 * (loss - adam) / adam),
            num(log.total("bytes_sent") / 1e6),
        ]);
    }
    let [_, chunk, block] = held[..] else {
        unreachable!("three variants")
    };
    let claims = vec![Claim::new(
        (block - adam).abs() / adam < 0.05 && (block - chunk).abs() / chunk < 0.05,
        format!(
            "BERT-Tiny: block scaling keeps 1-bit Adam where it was: held-out loss {} (per \
             chunk {}, Adam {})",
            num(block),
            num(chunk),
            num(adam)
        ),
    )];
    draw(
        &ctx.report.path("bert.png"),
        &Chart {
            title: "BERT-Tiny pre-training, 4 workers: per-chunk vs per-2048 scales",
            x_label: "samples",
            y_label: "MLM + NSP loss (moving average)",
            log_y: false,
        },
        &loss_series(&logs, batch as f64, ctx.pick(20, 5)),
    )?;
    Ok((
        format!(
            "## BERT-Tiny pre-training (`reproduce onebit-adam`'s runs)\n\n{steps} steps of \
             batch {batch}, 4 workers, 1-bit Adam freezing at step {}, ε outside.\n\n{}\n\
             ![BERT-Tiny loss](bert.png)\n",
            steps / 5,
            table.markdown()
        ),
        claims,
        logs,
    ))
}

fn vgg(ctx: &Context) -> Result<(String, Vec<Claim>, Vec<RunLog>)> {
    let [adam, outside, inside] = eps_fix::optimizers(eps_fix::VGG_FREEZE);
    let shared = run_all(
        &ctx.terse,
        &eps_fix::vgg_runs(ctx),
        &[adam, outside.clone(), inside]
            .map(|(label, optimizer)| eps_fix::vgg_variant(label, optimizer)),
    )?;
    let block_optimizer =
        outside.1.trim_end_matches('}').to_string() + &format!(", scale_block = {BLOCK} }}");
    let block = run_all(
        &ctx.terse,
        &ctx.runs.join("vgg16"),
        &[eps_fix::vgg_variant(
            "onebit_adam_eps_outside_block2048",
            block_optimizer,
        )],
    )?;
    let logs = prefixed("vgg16_", shared.into_iter().chain(block));
    let mut table = Table::new(&["optimizer", "train loss, last 30 steps", "test accuracy"]);
    let mut accuracy = Vec::new();
    for log in &logs {
        let acc = log.final_eval("test_accuracy")?;
        accuracy.push(acc);
        table.row(vec![
            log.label.clone(),
            num(log.tail_mean("loss", 30)),
            format!("{:.2}%", 100.0 * acc),
        ]);
    }
    let [adam, chunk, inside, block] = accuracy[..] else {
        unreachable!("four variants")
    };
    let claims = vec![Claim::new(
        block > chunk + 0.2 && block > adam - 0.05,
        format!(
            "VGG-16, ε outside: one scale per {BLOCK} elements trains where one per chunk does \
             not (test accuracy {:.2}% against {:.2}%; ε inside {:.2}%, Adam {:.2}%)",
            100.0 * block,
            100.0 * chunk,
            100.0 * inside,
            100.0 * adam
        ),
    )];
    draw(
        &ctx.report.path("vgg16.png"),
        &Chart {
            title: "VGG-16 on Fashion-MNIST, 4 workers: per-chunk vs per-2048 scales",
            x_label: "step",
            y_label: "training loss (moving average)",
            log_y: true,
        },
        &loss_series(&logs, 1.0, 10),
    )?;
    Ok((
        format!(
            "\n## VGG-16 on Fashion-MNIST (`reproduce eps-fix`'s runs)\n\n{} steps of batch 64, \
             4 workers, 1-bit Adam freezing at step {}.\n\n{}\n![VGG-16 loss](vgg16.png)\n",
            eps_fix::VGG_STEPS,
            eps_fix::VGG_FREEZE,
            table.markdown()
        ),
        claims,
        logs,
    ))
}

/// The logs with their labels prefixed, so the two models' runs of the same
/// optimizer stay apart in metrics.jsonl and configs/.
fn prefixed(prefix: &str, logs: impl Iterator<Item = RunLog>) -> Vec<RunLog> {
    logs.map(|mut log| {
        log.label = format!("{prefix}{}", log.label);
        log
    })
    .collect()
}

/// Each run's smoothed training loss against steps × `x_per_step`.
fn loss_series(logs: &[RunLog], x_per_step: f64, window: usize) -> Vec<Series> {
    logs.iter()
        .map(|log| Series {
            label: log.label.clone(),
            points: smooth(
                &log.series("loss")
                    .iter()
                    .map(|&(s, l)| (s as f64 * x_per_step, l))
                    .collect::<Vec<_>>(),
                window,
            ),
        })
        .collect()
}
