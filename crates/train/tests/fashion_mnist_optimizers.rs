//! Each optimizer of terse-optim trains a real classifier on real data
//! through the one training loop: the shipped MLP configs
//! (configs/train-mlp-fashion-mnist{,-lamb,-sgd}.toml: a 784-128-10 MLP,
//! 2,340 steps of batch 128 = 5 epochs of Fashion-MNIST fetched and
//! checksummed, seed 17), run by `Trainer` on one rank through burn
//! autodiff on the flex backend, tested on all 10,000 test images after
//! every 468 steps.
//!
//! The bound, 85% test accuracy, sits below what each optimizer reaches
//! (printed by this test; the numbers are in the README) and far above what
//! a broken update reaches: chance is 10%, and one epoch of a correct
//! optimizer already gives 80-83%. The mean training loss must fall from
//! each 468-step epoch to the next.

use std::path::{Path, PathBuf};

use terse_comm::SingleRank;
use terse_train::{RunConfig, TaskAction, TrainError, Trainer, with_task};

const BOUND: f64 = 0.85;

struct Train<'a>(&'a Trainer<'a>);

impl TaskAction for Train<'_> {
    type Output = Vec<(String, f64)>;
    fn act<T: terse_train::Task>(self, task: T) -> Result<Self::Output, TrainError> {
        Ok(self.0.run(&task, &SingleRank::new())?.summary.eval)
    }
}

/// Mean training loss of each epoch of `steps_per_epoch` steps, from the
/// run's metrics.jsonl.
fn epoch_losses(run_dir: &Path, steps_per_epoch: u64) -> Vec<f64> {
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let mut sums: Vec<(f64, u64)> = Vec::new();
    for line in text.lines() {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        let (Some(step), Some(loss)) = (record["step"].as_u64(), record["loss"].as_f64()) else {
            continue; // an evaluation line
        };
        let epoch = ((step - 1) / steps_per_epoch) as usize;
        if sums.len() <= epoch {
            sums.resize(epoch + 1, (0.0, 0));
        }
        sums[epoch].0 += loss;
        sums[epoch].1 += 1;
    }
    sums.iter().map(|&(sum, n)| sum / n as f64).collect()
}

fn final_accuracy(config: &str) -> f64 {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../configs")
        .join(config);
    let config = RunConfig::load(&path).unwrap();
    assert_eq!(config.train.steps, 2340);
    let scratch = tempfile::Builder::new()
        .prefix(&format!("terse-test-mlp-{}-", config.optimizer.name()))
        .tempdir()
        .unwrap();
    let run_dir: PathBuf = scratch.path().join("run");
    let trainer = Trainer {
        config: &config,
        run_dir: &run_dir,
        resume: false,
        resume_from: None,
        progress: false,
    };
    let eval = with_task(&config, &SingleRank::new(), &run_dir, Train(&trainer))
        .expect("training runs (Fashion-MNIST is fetched and checked)");
    let losses = epoch_losses(&run_dir, config.train.eval_every);
    let name = config.optimizer.name();
    assert_eq!(losses.len(), 5, "{name}: {losses:?}");
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "{name}: the epoch loss should fall every epoch: {losses:?}"
    );
    let accuracy = eval
        .iter()
        .find(|(metric, _)| metric == "test_accuracy")
        .expect("the image task reports test_accuracy")
        .1;
    println!("{name}: test accuracy {accuracy:.4} (epoch losses {losses:.4?})");
    accuracy
}

#[test]
fn adam_trains_fashion_mnist() {
    let accuracy = final_accuracy("train-mlp-fashion-mnist.toml");
    assert!(accuracy >= BOUND, "adam reached only {accuracy:.4}");
}

#[test]
fn lamb_trains_fashion_mnist() {
    let accuracy = final_accuracy("train-mlp-fashion-mnist-lamb.toml");
    assert!(accuracy >= BOUND, "lamb reached only {accuracy:.4}");
}

#[test]
fn sgd_trains_fashion_mnist() {
    let accuracy = final_accuracy("train-mlp-fashion-mnist-sgd.toml");
    assert!(accuracy >= BOUND, "sgd reached only {accuracy:.4}");
}
