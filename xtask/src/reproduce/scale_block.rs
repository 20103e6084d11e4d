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

use super::plot::{Chart, draw, draw_pretraining_loss, loss_curves};
use super::report::Table;
use super::runner::{RunLog, check_comparable, run_all};
use super::{Claim, Context, Outcome, eps_fix, num, onebit_adam};

/// Elements per compression scale in the block-scaled runs.
const BLOCK: usize = 2048;

pub fn run(ctx: &Context) -> Result<Outcome> {
    let (toy_table, mut claims) = sum_of_squares(ctx)?;
    let mut body = toy_table;
    let mut logs = Vec::new();
    if !ctx.quick {
        let (bert_table, bert_claims, bert_logs) = bert(ctx)?;
        body.push_str(&bert_table);
        claims.extend(bert_claims);
        logs.extend(bert_logs);
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

/// The mechanism in isolation: `eps-fix`'s sum of squares with each
/// coordinate repeated over a block of 2,048, so a large block and a tiny
/// one share a chunk (one scale) or get a scale each.
fn sum_of_squares(ctx: &Context) -> Result<(String, Vec<Claim>)> {
    let freeze = 100;
    let [_, (_, outside), _] = eps_fix::optimizers(freeze, false);
    let block = outside.trim_end_matches('}').to_string() + &format!(", scale_block = {BLOCK} }}");
    let runs = [
        ("one scale per chunk", outside),
        ("one scale per 2048", block),
    ];
    let curves = eps_fix::toy_runs(
        ctx,
        &runs,
        Some(BLOCK),
        "x² + y² over blocks of 2048 (x = 1, y = 1e-6): 1-bit Adam, ε outside",
    )?;
    let (table, around) = eps_fix::freeze_table(
        [
            "1-bit Adam, ε outside",
            "f at the freeze (step 100)",
            "max f after the freeze",
            "final f",
        ],
        &runs,
        &curves,
        freeze,
        |(at_freeze, peak, last)| [at_freeze, peak, last],
    );
    let peaks: Vec<f64> = around
        .iter()
        .map(|&(at_freeze, peak, _)| peak / at_freeze)
        .collect();
    let claims = vec![Claim::new(
        peaks[0] > 10.0 && peaks[1] < 1.1,
        format!(
            "sum of squares over two blocks of {BLOCK}: with one scale per chunk f rises {}× \
             after the freeze, with one scale per block {}×",
            num(peaks[0]),
            num(peaks[1])
        ),
    )];
    Ok((
        format!(
            "## Sum of squares over blocks (`eps-fix`'s problem)\n\n`terse-sum-of-squares \
             --config configs/reproduce-eps-fix-sum-of-squares.toml --repeat {BLOCK}`: \
             {BLOCK} coordinates at 1 and {BLOCK} at 10⁻⁶, lr 10⁻⁵, 2 workers with the same gradient (each compresses one copy of the problem per chunk), 1-bit Adam \
             with ε outside freezing at step {freeze}.\n\n{}\n\
             ![f over steps](sum-of-squares.png)\n",
            table.markdown()
        ),
        claims,
    ))
}

fn bert(ctx: &Context) -> Result<(String, Vec<Claim>, Vec<RunLog>)> {
    let (steps, batch, _) = onebit_adam::shape(ctx);
    let shared_variants = [
        onebit_adam::variant(ctx, "adam", onebit_adam::optimizer(ctx, "adam", false, "")),
        onebit_adam::variant(
            ctx,
            "onebit_adam",
            onebit_adam::optimizer(ctx, "onebit_adam", true, ""),
        ),
    ];
    let block_variants = [onebit_adam::variant(
        ctx,
        "onebit_adam_block2048",
        onebit_adam::optimizer(
            ctx,
            "onebit_adam",
            true,
            &format!(", scale_block = {BLOCK}"),
        ),
    )
    .varies("optimizer.scale_block")];
    let shared_dir = ctx.sibling("onebit-adam");
    check_comparable(
        ctx,
        &[
            (&shared_dir, &shared_variants),
            (&ctx.runs, &block_variants),
        ],
    )?;
    let shared = run_all(ctx, &shared_dir, &shared_variants)?;
    let block = run_all(ctx, &ctx.runs, &block_variants)?;
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
            log.show(loss, num),
            log.show(loss, |loss| {
                format!("{:+.2}%", 100.0 * (loss - adam) / adam)
            }),
            num(log.total("bytes_sent") / 1e6),
        ]);
    }
    let [_, chunk, block] = held[..] else {
        unreachable!("three variants")
    };
    let claims = vec![Claim::new(
        (block - adam).abs() < (chunk - adam).abs(),
        format!(
            "BERT-Tiny: one scale per {BLOCK} brings 1-bit Adam closer to Adam than one per \
             chunk: held-out loss {} (per chunk {}, Adam {})",
            num(block),
            num(chunk),
            num(adam)
        ),
    )];
    draw_pretraining_loss(
        ctx,
        "bert.png",
        &logs,
        batch,
        "BERT-Tiny pre-training, 4 workers: per-chunk vs per-2048 scales",
        "MLM + NSP loss (moving average)",
    )?;
    Ok((
        format!(
            "\n## BERT-Tiny pre-training (`reproduce onebit-adam`'s runs)\n\n{steps} steps of \
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
    let [adam, outside, inside] = eps_fix::vgg_optimizers();
    let shared_variants = eps_fix::vgg_variants([adam, outside.clone(), inside]);
    let block_optimizer =
        outside.1.trim_end_matches('}').to_string() + &format!(", scale_block = {BLOCK} }}");
    let block_variants =
        [
            eps_fix::vgg_variant("onebit_adam_eps_outside_block2048", block_optimizer)
                .varies("optimizer.scale_block"),
        ];
    let (shared_dir, block_dir) = (eps_fix::vgg_runs(ctx), ctx.runs.join("vgg16"));
    check_comparable(
        ctx,
        &[
            (&shared_dir, &shared_variants),
            (&block_dir, &block_variants),
        ],
    )?;
    let shared = run_all(ctx, &shared_dir, &shared_variants)?;
    let block = run_all(ctx, &block_dir, &block_variants)?;
    let logs = prefixed("vgg16_", shared.into_iter().chain(block));
    let mut table = Table::new(&["optimizer", "train loss, last 30 steps", "test accuracy"]);
    let mut accuracy = Vec::new();
    for log in &logs {
        let acc = log.final_eval("test_accuracy")?;
        accuracy.push(acc);
        table.row(vec![
            log.label.clone(),
            num(log.tail_mean("loss", 30)),
            log.show(acc, |acc| format!("{:.2}%", 100.0 * acc)),
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
            log_y: true,
            clip_above_start: true,
            ..Chart::new(
                "VGG-16 on Fashion-MNIST, 4 workers: per-chunk vs per-2048 scales",
                "step",
                "training loss (moving average)",
            )
        },
        &loss_curves(&logs, 1.0, 10),
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
