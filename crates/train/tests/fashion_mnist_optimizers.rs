//! Each optimizer of terse-optim trains a real classifier on real data: the
//! shipped default run of `terse train mlp` (a 784-128-10 MLP, 5 epochs of
//! 468 batches of 128 on Fashion-MNIST from Debian's `dataset-fashion-mnist`,
//! seed 17), through burn autodiff on the flex backend, every update done by
//! `Optimizer::step_module`, tested on all 10,000 test images.
//!
//! The bound, 85% test accuracy, sits below what each optimizer reaches here
//! (measured on this 2-core machine: Adam 86.26%, LAMB 87.12%, SGD 86.35%;
//! recorded in the README, printed by this test) and far above what a broken
//! update reaches: chance is 10%, and one epoch of a correct optimizer already
//! gives 80-83%.

use std::path::Path;

use terse_data::FASHION_MNIST_DEBIAN_DIR;
use terse_train::ClassifierRun;

const BOUND: f64 = 0.85;

fn final_accuracy(optimizer: &str) -> f64 {
    let run = ClassifierRun::fashion_mnist_default(optimizer).unwrap();
    assert_eq!(run.epochs, 5);
    let reports = run
        .train_fashion_mnist(Path::new(FASHION_MNIST_DEBIAN_DIR), false, |_| {})
        .expect("training runs (dataset-fashion-mnist must be installed)");
    let losses: Vec<f64> = reports.iter().map(|r| r.train_loss).collect();
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "{optimizer}: the epoch loss should fall every epoch: {losses:?}"
    );
    let accuracy = reports.last().unwrap().test_accuracy;
    println!("{optimizer}: test accuracy {accuracy:.4} (train losses {losses:.4?})");
    accuracy
}

#[test]
fn adam_trains_fashion_mnist() {
    let accuracy = final_accuracy("adam");
    assert!(accuracy >= BOUND, "adam reached only {accuracy:.4}");
}

#[test]
fn lamb_trains_fashion_mnist() {
    let accuracy = final_accuracy("lamb");
    assert!(accuracy >= BOUND, "lamb reached only {accuracy:.4}");
}

#[test]
fn sgd_trains_fashion_mnist() {
    let accuracy = final_accuracy("sgd");
    assert!(accuracy >= BOUND, "sgd reached only {accuracy:.4}");
}
