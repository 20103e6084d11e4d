//! Throughput of one BERT pre-training step on the flex CPU backend: the
//! same step as `benches/pytorch_bert_step.py` (BertForPreTraining in train
//! mode with dropout 0.1, MLM at 15% of the positions + NSP, backward, AdamW
//! with weight decay 0.01, lr 1e-4, eps 1e-6), the same inputs' recipe, seq
//! 128. `cargo xtask bench model` runs this and the PyTorch script in the
//! same run and prints the ratio.
//!
//! Args (after `--`): `--presets mini,base`, `--batch 8`, `--seq 128`,
//! `--warmup 2`, `--steps 5`, `--no-dropout` (to see what dropout costs),
//! `--quick` (tiny preset, 2 steps: a smoke run).
//! Prints one JSON line per preset.

use std::time::Instant;
use terse_optim::WithMoments;

use burn::tensor::{Device, Int, Tensor, TensorData};
use terse_comm::SingleRank;
use terse_models::bert::{BertForPreTraining, BertInput, BertPreset};
use terse_optim::{
    AdamConfig, LrSchedule, Optimizer, OptimizerConfig, ParamLayout, gather_grads, gather_params,
    tensor_to_host, write_back,
};
use terse_rng::SplitMix64;

struct Args {
    presets: Vec<BertPreset>,
    batch: usize,
    seq: usize,
    warmup: usize,
    steps: usize,
    dropout: bool,
}

fn parse() -> Args {
    let mut args = Args {
        presets: vec![BertPreset::Mini, BertPreset::Base],
        batch: 8,
        seq: 128,
        warmup: 2,
        steps: 5,
        dropout: true,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = |i: usize| argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--quick" => {
                args.presets = vec![BertPreset::Tiny];
                (args.warmup, args.steps) = (1, 2);
                i += 1;
                continue;
            }
            "--presets" => {
                args.presets = value(i)
                    .split(',')
                    .map(|p| {
                        BertPreset::ALL
                            .into_iter()
                            .find(|q| q.name() == p)
                            .unwrap_or_else(|| panic!("unknown preset {p}"))
                    })
                    .collect();
            }
            "--no-dropout" => {
                args.dropout = false;
                i += 1;
                continue;
            }
            "--batch" => args.batch = value(i).parse().expect("--batch N"),
            "--seq" => args.seq = value(i).parse().expect("--seq N"),
            "--warmup" => args.warmup = value(i).parse().expect("--warmup N"),
            "--steps" => args.steps = value(i).parse().expect("--steps N"),
            // cargo's own bench flags
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    args
}

fn main() {
    let args = parse();
    terse_train::allocator::tune_for_training();
    let device = Device::flex().autodiff();
    for preset in &args.presets {
        device.seed(0);
        let mut config = preset.config();
        if !args.dropout {
            config.hidden_dropout_prob = 0.0;
            config.attention_probs_dropout_prob = 0.0;
        }
        let (b, t) = (args.batch, args.seq);
        let mut rng = SplitMix64::new(7);
        let mut ids: Vec<i64> = (0..b * t)
            .map(|_| 999 + (rng.next_u64() % (config.vocab_size as u64 - 999)) as i64)
            .collect();
        let types: Vec<i64> = (0..b * t).map(|i| i64::from(i % t >= t / 2)).collect();
        let mask = vec![1i64; b * t];
        let mut masked = Vec::new();
        let mut labels = Vec::new();
        for (j, id) in ids.iter_mut().enumerate() {
            if rng.next_u64() % 100 < 15 {
                masked.push(j as i64);
                labels.push(*id);
                *id = 103;
            }
        }
        let nsp: Vec<i64> = (0..b).map(|_| (rng.next_u64() % 2) as i64).collect();
        let input = BertInput::from_rows(ids, types, mask, [b, t], &device);
        let ints = |v: &Vec<i64>| {
            Tensor::<1, Int>::from_data(TensorData::new(v.clone(), [v.len()]), &device)
        };
        let (masked, labels, nsp) = (ints(&masked), ints(&labels), ints(&nsp));

        let mut model = BertForPreTraining::new(&config, &device);
        let comm = SingleRank::new();
        let adam =
            OptimizerConfig::Adam(AdamConfig::default().with_weight_decay(0.01).with_eps(1e-6));
        let schedule = LrSchedule::Constant { lr: 1e-4 };
        let mut optimizer: Option<Optimizer> = None;
        let mut times = Vec::new();
        let mut parts = [0.0f64; 3];
        for step in 0..args.warmup + args.steps {
            let start = Instant::now();
            let out = model.forward(input.clone(), masked.clone());
            let loss = model.loss(&out, labels.clone(), nsp.clone());
            // Reading the loss waits for the forward pass.
            let _ = loss.clone().into_scalar::<f32>();
            let forward = start.elapsed().as_secs_f64() * 1e3;
            let grads = loss.backward();
            let backward = start.elapsed().as_secs_f64() * 1e3 - forward;
            let opt = optimizer.get_or_insert_with(|| {
                let layout = ParamLayout::from_module(&model);
                Optimizer::new(adam.clone(), schedule.clone(), layout, &comm).unwrap()
            });
            // The trainer's round trip: flat parameters and gradients,
            // one step, written back.
            let layout = opt.layout().clone();
            let mut x = tensor_to_host(gather_params(&layout, &model).unwrap()).unwrap();
            let flat_grads = gather_grads(&layout, &model, &grads).unwrap();
            let mut g = tensor_to_host(flat_grads).unwrap();
            opt.step_flat(&mut x, &mut g, &comm).unwrap();
            let n = x.len();
            let flat = Tensor::<1>::from_data(TensorData::new(x, [n]), &device);
            model = write_back(&layout, model, flat).unwrap();
            let ms = start.elapsed().as_secs_f64() * 1e3;
            if step >= args.warmup {
                times.push(ms);
                parts[0] += forward;
                parts[1] += backward;
                parts[2] += ms - forward - backward;
            }
        }
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        println!(
            "{{\"framework\": \"terse\", \"preset\": \"{}\", \"batch\": {b}, \"seq\": {t}, \
             \"threads\": {}, \"samples_per_s\": {:.3}, \"step_ms\": {:.1}, \
             \"forward_ms\": {:.1}, \"backward_ms\": {:.1}, \"optimizer_ms\": {:.1}}}",
            preset.name(),
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            b as f64 / (mean / 1e3),
            mean,
            parts[0] / times.len() as f64,
            parts[1] / times.len() as f64,
            parts[2] / times.len() as f64,
        );
    }
}
