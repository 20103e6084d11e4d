//! Image readers and augmentation: CIFAR binary files in the official
//! layouts (committed files written by `fixtures/cifar/make_tiny.py`, and
//! files written here), the real MNIST CSV sample against counts taken with
//! Python, malformed input named by file, record, line and column, and the
//! crop/flip/normalize arithmetic worked by hand.

use std::path::{Path, PathBuf};

use terse_data::dataset;
use terse_data::images::{
    Augment, CIFAR10_MEAN, CIFAR10_STD, CifarKind, read_cifar_file, read_cifar_split,
    read_mnist_csv,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cifar")
        .join(name)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("terse-images-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn cifar_files_in_the_official_layout() {
    let set = read_cifar_file(&fixture("tiny-cifar10.bin"), CifarKind::Cifar10).unwrap();
    assert_eq!(
        (set.len(), set.channels, set.height, set.width),
        (3, 3, 32, 32)
    );
    assert_eq!(set.labels, [3, 4, 5]);
    // Pixel k of record i is (7k + i) mod 256: record 2, green plane
    // (k = 1024 + y·32 + x) at y = 1, x = 2 → k = 1058 → (7·1058 + 2) mod 256 = 240.
    assert_eq!(set.image(2)[1058], ((7 * 1058 + 2) % 256) as u8);
    assert_eq!(set.image(1)[0], 1);
    let set = read_cifar_file(&fixture("tiny-cifar100.bin"), CifarKind::Cifar100).unwrap();
    assert_eq!(set.labels, [90, 91], "the fine label is the class");
    assert_eq!(set.image(1)[3071], ((7 * 3071 + 1) % 256) as u8);

    // A split directory: the five training batches in order.
    let dir = scratch("split");
    let one = std::fs::read(fixture("tiny-cifar10.bin")).unwrap();
    for name in CifarKind::Cifar10.files(true) {
        std::fs::write(dir.join(name), &one).unwrap();
    }
    let train = read_cifar_split(&dir, CifarKind::Cifar10, true).unwrap();
    assert_eq!(train.len(), 15);
    assert_eq!(&train.labels[12..], [3, 4, 5]);
    let error = read_cifar_split(&dir, CifarKind::Cifar10, false)
        .unwrap_err()
        .to_string();
    assert!(error.contains("test_batch.bin: missing"), "{error}");
}

#[test]
fn malformed_cifar_files_are_named() {
    let dir = scratch("bad");
    let good = std::fs::read(fixture("tiny-cifar10.bin")).unwrap();
    let path = dir.join("data_batch_1.bin");
    std::fs::write(&path, &good[..5000]).unwrap();
    let error = read_cifar_file(&path, CifarKind::Cifar10)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("data_batch_1.bin: 5000 bytes is not a whole number of 3073-byte"),
        "{error}"
    );
    let mut label = good.clone();
    label[3073] = 10;
    std::fs::write(&path, &label).unwrap();
    let error = read_cifar_file(&path, CifarKind::Cifar10)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("record 1 (byte 3073): label 10 is not in 0..10"),
        "{error}"
    );
    let mut fine = std::fs::read(fixture("tiny-cifar100.bin")).unwrap();
    fine[3074 + 1] = 100;
    std::fs::write(&path, &fine).unwrap();
    let error = read_cifar_file(&path, CifarKind::Cifar100)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("record 1 (byte 3075): label 100 is not in 0..100"),
        "{error}"
    );
}

#[test]
fn the_mnist_csv_sample() {
    let set = read_mnist_csv(&dataset("mnist-5k").unwrap().join("mnist_5k.csv.gz")).unwrap();
    // python3: rows = [l.split(',') for l in gzip.open(…, 'rt')]; 5000 rows of
    // 785 fields; Counter(r[-1]) = 500 of each digit; rows[0][152:160] =
    // 0 0 48 238 252 252 252 237; sum(rows[0][:-1]) = 31095; rows[0][-1] = 0.
    assert_eq!(
        (set.len(), set.channels, set.height, set.width),
        (5000, 1, 28, 28)
    );
    for digit in 0..10 {
        assert_eq!(set.labels.iter().filter(|&&l| l == digit).count(), 500);
    }
    assert_eq!(set.labels[0], 0);
    assert_eq!(&set.image(0)[152..160], [0, 0, 48, 238, 252, 252, 252, 237]);
    assert_eq!(
        set.image(0).iter().map(|&p| u32::from(p)).sum::<u32>(),
        31_095
    );

    let dir = scratch("csv");
    let path = dir.join("bad.csv");
    let row = |label: &str| format!("{}{label}\n", "0,".repeat(784));
    std::fs::write(&path, row("3") + &row("x")).unwrap();
    let error = read_mnist_csv(&path).unwrap_err().to_string();
    assert!(
        error.contains("bad.csv: line 2, column 785: \"x\" is not an integer"),
        "{error}"
    );
    std::fs::write(&path, row("12")).unwrap();
    let error = read_mnist_csv(&path).unwrap_err().to_string();
    assert!(
        error.contains("line 1, column 785: 12 is not in 0..=9"),
        "{error}"
    );
    std::fs::write(&path, "1,2,3\n").unwrap();
    let error = read_mnist_csv(&path).unwrap_err().to_string();
    assert!(error.contains("line 1: 3 columns, expected 785"), "{error}");
}

#[test]
fn crop_and_flip_by_hand() {
    // One 2×3 channel, pad 1, mean 0, std 1: outputs are pixel / 255.
    //   image      10 20 30
    //              40 50 60
    let image = [10u8, 20, 30, 40, 50, 60];
    let augment = Augment {
        pad: 1,
        flip: true,
        mean: vec![0.0],
        std: vec![1.0],
    };
    let run = |dx, dy, flip| {
        let mut out = [0.0f32; 6];
        augment.apply(&image, (1, 2, 3), dx, dy, flip, &mut out);
        out.map(|v| (v * 255.0).round() as u8)
    };
    // Offset (0, 0) of the padded 4×5 image: shifted down-right, zeros in.
    assert_eq!(run(0, 0, false), [0, 0, 0, 0, 10, 20]);
    // (dx 2, dy 1): one column left.
    assert_eq!(run(2, 1, false), [20, 30, 0, 50, 60, 0]);
    // Centre crop, flipped: rows reversed left to right.
    assert_eq!(run(1, 1, true), [30, 20, 10, 60, 50, 40]);
    // Crop (dx 2) then flip, torchvision's order: 20 30 0 → 0 30 20.
    assert_eq!(run(2, 1, true), [0, 30, 20, 0, 60, 50]);

    // CIFAR normalization of a white pixel in channel 0: (1 − 0.4914)/0.2470.
    let white = vec![255u8; 3 * 32 * 32];
    let mut out = vec![0.0; 3 * 32 * 32];
    Augment::cifar10().apply(&white, (3, 32, 32), 4, 4, false, &mut out);
    assert!((out[0] - (1.0 - CIFAR10_MEAN[0]) / CIFAR10_STD[0]).abs() < 1e-6);
    assert!((out[2048] - (1.0 - CIFAR10_MEAN[2]) / CIFAR10_STD[2]).abs() < 1e-6);
}

#[test]
fn random_choices_depend_only_on_seed_epoch_and_sample() {
    let augment = Augment::cifar10();
    let mut offsets = [[0usize; 9]; 9];
    let mut flips = 0;
    for i in 0..100_000u64 {
        let (dx, dy, flip) = augment.draw(42, 0, i);
        offsets[dy][dx] += 1;
        flips += usize::from(flip);
    }
    // Every one of the 81 offsets occurs (expected ≈ 1,235 each).
    assert!(offsets.iter().flatten().all(|&n| n > 1000), "{offsets:?}");
    // Binomial(1e5, 0.5): sd 158, the bound is 6 sd.
    assert!((flips as f64 / 1e5 - 0.5).abs() < 0.01, "{flips}");

    let set = read_cifar_file(&fixture("tiny-cifar10.bin"), CifarKind::Cifar10).unwrap();
    let n = 3 * 32 * 32;
    let both = augment.batch(&set, &[0, 2], 5, 9, true).unwrap();
    let alone = augment.batch(&set, &[2], 5, 9, true).unwrap();
    assert_eq!(
        &both[n..],
        &alone[..],
        "sample 2 does not depend on its batch"
    );
    let epochs: Vec<_> = (0..8)
        .map(|e| augment.batch(&set, &[2], e, 9, true).unwrap())
        .collect();
    assert!(epochs.windows(2).any(|w| w[0] != w[1]), "epochs differ");
    assert_eq!(augment.batch(&set, &[2], 5, 9, true).unwrap(), alone);
    // Evaluation: centre crop, no flip = plain normalization.
    let eval = augment.batch(&set, &[1], 5, 9, false).unwrap();
    let mut plain = vec![0.0; n];
    Augment::normalize_only(&CIFAR10_MEAN, &CIFAR10_STD).apply(
        set.image(1),
        (3, 32, 32),
        0,
        0,
        false,
        &mut plain,
    );
    assert_eq!(eval, plain);
    assert!(
        Augment::cifar10()
            .batch(&read_mnist_like(), &[0], 0, 0, true)
            .is_err()
    );
}

fn read_mnist_like() -> terse_data::images::ImageSet {
    terse_data::images::ImageSet {
        channels: 1,
        height: 2,
        width: 2,
        pixels: vec![0; 4],
        labels: vec![0],
    }
}
