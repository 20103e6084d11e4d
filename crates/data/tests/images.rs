//! Image readers: CIFAR binary files in the official layouts (a committed
//! three-record fixture written by `fixtures/cifar/make_tiny.py`, and files
//! with marked pixels written here), the real MNIST CSV sample against
//! counts taken with Python, real Fashion-MNIST against its paper, and
//! malformed input named by file, record,
//! byte, line and column.

use std::path::{Path, PathBuf};

use terse_data::dataset;
use terse_data::images::{CifarKind, ImageSet, read_cifar_file, read_cifar_split, read_mnist_csv};
use terse_data::{read_idx_images, read_idx_labels};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cifar")
        .join(name)
}

/// A fresh scratch directory, removed when the returned guard drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("terse-images-{name}-"))
        .tempdir()
        .unwrap()
}

fn error_of<T: std::fmt::Debug>(result: Result<T, terse_data::DataError>) -> String {
    result.unwrap_err().to_string()
}

/// One record in the official layout: `labels`, then the R, G and B 32×32
/// planes, all 0 but for `marks` `(channel, y, x, value)`.
fn record(labels: &[u8], marks: &[(usize, usize, usize, u8)]) -> Vec<u8> {
    let mut pixels = vec![0u8; 3072];
    for &(c, y, x, v) in marks {
        pixels[c * 1024 + y * 32 + x] = v;
    }
    [labels, &pixels].concat()
}

#[test]
fn the_committed_fixture_bytes() {
    // make_tiny.py: record i of tiny-cifar10.bin is the label byte i + 3 and
    // pixels (7k + i) mod 256; tiny-cifar100.bin has coarse 19 − i, fine 90 + i.
    let raw = std::fs::read(fixture("tiny-cifar10.bin")).unwrap();
    assert_eq!(raw.len(), 3 * 3073);
    assert_eq!(raw[..5], [3, 0, 7, 14, 21]);
    assert_eq!(raw[3073..3076], [4, 1, 8]);
    let set = read_cifar_file(&fixture("tiny-cifar10.bin"), CifarKind::Cifar10).unwrap();
    assert_eq!(
        (set.len(), set.channels, set.height, set.width),
        (3, 3, 32, 32)
    );
    assert_eq!(set.labels, [3, 4, 5]);
    assert_eq!(set.image(1)[..3], [1, 8, 15]);
    // Record 2, green plane (c = 1) at y = 1, x = 2: k = 1024 + 32 + 2 = 1058,
    // (7·1058 + 2) mod 256 = 7408 − 28·256 = 240.
    assert_eq!(set.image(2)[1058], 240);

    let raw = std::fs::read(fixture("tiny-cifar100.bin")).unwrap();
    assert_eq!(raw.len(), 3 * 3074);
    assert_eq!(raw[..5], [19, 90, 0, 7, 14]);
    let set = read_cifar_file(&fixture("tiny-cifar100.bin"), CifarKind::Cifar100).unwrap();
    assert_eq!(set.labels, [90, 91, 92], "the fine label is the class");
    // Record 1, last blue pixel: k = 3071, (7·3071 + 1) mod 256 = 21498 − 83·256 = 250.
    assert_eq!(set.image(1)[3071], 250);
}

#[test]
fn planes_land_in_chw_order() {
    let dir_tmp = scratch("planes");
    let dir = dir_tmp.path();
    // Red at (y 0, x 1), green at (y 31, x 0), blue at (y 2, x 3); CHW index
    // c·1024 + y·32 + x: 1, 1024 + 992 = 2016, 2048 + 64 + 3 = 2115.
    let marks = [(0, 0, 1, 200), (1, 31, 0, 100), (2, 2, 3, 50)];
    let path = dir.join("test_batch.bin");
    std::fs::write(&path, [record(&[7], &marks), record(&[0], &[])].concat()).unwrap();
    let set = read_cifar_file(&path, CifarKind::Cifar10).unwrap();
    assert_eq!(set.labels, [7, 0]);
    let image = set.image(0);
    assert_eq!((image[1], image[2016], image[2115]), (200, 100, 50));
    assert_eq!(image.iter().map(|&p| u32::from(p)).sum::<u32>(), 350);
    assert!(set.image(1).iter().all(|&p| p == 0));
}

#[test]
fn splits_concatenate_their_files_in_order() {
    let dir_tmp = scratch("split10");
    let dir = dir_tmp.path();
    // data_batch_k holds k records labelled k − 1, with its pixel 0 = k.
    for k in 1..=5u8 {
        let records: Vec<u8> = (0..k)
            .flat_map(|_| record(&[k - 1], &[(0, 0, 0, k)]))
            .collect();
        std::fs::write(dir.join(format!("data_batch_{k}.bin")), records).unwrap();
    }
    std::fs::write(dir.join("test_batch.bin"), record(&[9], &[])).unwrap();
    let train = read_cifar_split(dir, CifarKind::Cifar10, true).unwrap();
    // 1 + 2 + 3 + 4 + 5 = 15 records.
    assert_eq!(train.len(), 15);
    assert_eq!(train.labels, [0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4]);
    assert_eq!(train.image(14)[0], 5);
    train.check().unwrap();
    let test = read_cifar_split(dir, CifarKind::Cifar10, false).unwrap();
    assert_eq!(test.labels, [9]);

    let dir_tmp = scratch("split100");
    let dir = dir_tmp.path();
    let train = [record(&[19, 99], &[]), record(&[0, 0], &[(2, 31, 31, 9)])].concat();
    std::fs::write(dir.join("train.bin"), train).unwrap();
    std::fs::write(dir.join("test.bin"), record(&[4, 42], &[])).unwrap();
    let train = read_cifar_split(dir, CifarKind::Cifar100, true).unwrap();
    assert_eq!(train.labels, [99, 0]);
    assert_eq!(train.image(1)[3071], 9);
    let test = read_cifar_split(dir, CifarKind::Cifar100, false).unwrap();
    assert_eq!(test.labels, [42]);
}

#[test]
fn malformed_cifar_files_are_named() {
    let dir_tmp = scratch("bad");
    let dir = dir_tmp.path();
    let good = std::fs::read(fixture("tiny-cifar10.bin")).unwrap();
    let path = dir.join("data_batch_1.bin");
    std::fs::write(&path, &good[..5000]).unwrap();
    let error = error_of(read_cifar_file(&path, CifarKind::Cifar10));
    assert!(
        error.ends_with(
            "data_batch_1.bin: 5000 bytes is not a whole number of 3073-byte CIFAR-10 \
             records (1 label byte(s) + 3072 pixels)"
        ),
        "{error}"
    );
    std::fs::write(&path, []).unwrap();
    let error = error_of(read_cifar_file(&path, CifarKind::Cifar10));
    assert!(error.contains("0 bytes is not a whole number"), "{error}");
    // A CIFAR-10 file read as CIFAR-100: 9219 = 3·3073 is not a multiple of 3074.
    let error = error_of(read_cifar_file(
        &fixture("tiny-cifar10.bin"),
        CifarKind::Cifar100,
    ));
    assert!(
        error.contains("9219 bytes is not a whole number of 3074-byte CIFAR-100"),
        "{error}"
    );

    let mut label = good.clone();
    label[3073] = 10; // record 1's label byte
    std::fs::write(&path, &label).unwrap();
    let error = error_of(read_cifar_file(&path, CifarKind::Cifar10));
    assert!(
        error.ends_with("data_batch_1.bin: record 1 (byte 3073): label 10 is not in 0..10"),
        "{error}"
    );

    let good = std::fs::read(fixture("tiny-cifar100.bin")).unwrap();
    let mut fine = good.clone();
    fine[3074 + 1] = 100; // record 1's fine label
    std::fs::write(&path, &fine).unwrap();
    let error = error_of(read_cifar_file(&path, CifarKind::Cifar100));
    assert!(
        error.contains("record 1 (byte 3075): label 100 is not in 0..100"),
        "{error}"
    );
    let mut coarse = good;
    coarse[2 * 3074] = 20; // record 2's coarse label
    std::fs::write(&path, &coarse).unwrap();
    let error = error_of(read_cifar_file(&path, CifarKind::Cifar100));
    assert!(
        error.contains("record 2 (byte 6148): coarse label 20 is not in 0..20"),
        "{error}"
    );

    let error = error_of(read_cifar_file(&dir.join("nope.bin"), CifarKind::Cifar10));
    assert!(error.contains("nope.bin"), "{error}");
    // A split with its first four batches only: the missing one is named.
    for k in 1..=4 {
        std::fs::write(dir.join(format!("data_batch_{k}.bin")), record(&[0], &[])).unwrap();
    }
    let error = error_of(read_cifar_split(dir, CifarKind::Cifar10, true));
    assert!(
        error.contains(
            "data_batch_5.bin: missing: the CIFAR-10 training split is data_batch_1.bin, \
             data_batch_2.bin, data_batch_3.bin, data_batch_4.bin, data_batch_5.bin"
        ),
        "{error}"
    );
    let error = error_of(read_cifar_split(dir, CifarKind::Cifar100, false));
    assert!(
        error.contains("test.bin: missing: the CIFAR-100 test split is test.bin"),
        "{error}"
    );
}

/// The dataset paper (Xiao et al. 2017, Table 1) gives 60,000/10,000 images
/// of 28×28 with 6,000/1,000 per class; the first training image is an
/// ankle boot (label 9) and so is the first test image, the second test
/// image a pullover (2), as every Fashion-MNIST loader shows.
#[test]
fn fashion_mnist_has_the_published_sizes_and_balanced_classes() {
    let dir = dataset("fashion-mnist").unwrap();
    for (prefix, count, per_class) in [("train", 60_000, 6_000), ("t10k", 10_000, 1_000)] {
        let images = read_idx_images(&dir.join(format!("{prefix}-images-idx3-ubyte"))).unwrap();
        let labels = read_idx_labels(&dir.join(format!("{prefix}-labels-idx1-ubyte"))).unwrap();
        let set = ImageSet::from_idx(images, &labels).unwrap();
        assert_eq!(
            (set.len(), set.channels, set.height, set.width),
            (count, 1, 28, 28)
        );
        let mut histogram = [0usize; 10];
        for &label in &set.labels {
            histogram[usize::from(label)] += 1;
        }
        assert_eq!(histogram, [per_class; 10], "{prefix}");
        assert_eq!(
            set.labels[0], 9,
            "{prefix}: the first image is an ankle boot"
        );
        if prefix == "t10k" {
            assert_eq!(set.labels[1], 2);
        }
        assert!(set.pixels.contains(&255), "some pixel is saturated");
    }
}

#[test]
fn the_mnist_csv_sample() {
    let set = read_mnist_csv(&dataset("mnist-5k").unwrap().join("mnist_5k.csv.gz")).unwrap();
    // python3 -c "
    // import gzip, collections
    // rows = [l.split(',') for l in gzip.open('…/mnist-5k/mnist_5k.csv.gz', 'rt').read().split()]
    // print(len(rows), {len(r) for r in rows}, sorted(collections.Counter(int(r[784]) for r in rows).items()))
    // print(rows[0][784], rows[0][5*28+15], sum(int(v) for v in rows[0][:784]), rows[4999][784], rows[4999][6*28+8])"
    // 5000 {785} [(0, 500), (1, 500), (2, 500), (3, 500), (4, 500), (5, 500), (6, 500), (7, 500), (8, 500), (9, 500)]
    // 0 238 31095 9 7
    assert_eq!(
        (set.len(), set.channels, set.height, set.width),
        (5000, 1, 28, 28)
    );
    let mut counts = [0usize; 10];
    for &l in &set.labels {
        counts[usize::from(l)] += 1;
    }
    assert_eq!(counts, [500; 10]);
    assert_eq!((set.labels[0], set.labels[4999]), (0, 9));
    // Row-major: (y 5, x 15) of image 0 is column 5·28 + 15 = 155.
    assert_eq!(set.image(0)[5 * 28 + 15], 238);
    assert_eq!(set.image(4999)[6 * 28 + 8], 7);
    let sum: u32 = set.image(0).iter().map(|&p| u32::from(p)).sum();
    assert_eq!(sum, 31_095);
}

#[test]
fn malformed_csv_rows_are_named_by_line_and_column() {
    let dir_tmp = scratch("csv");
    let dir = dir_tmp.path();
    let path = dir.join("bad.csv");
    let row = |label: &str| format!("{}{label}\n", "0,".repeat(784));
    std::fs::write(&path, row("3") + &row("x")).unwrap();
    let error = error_of(read_mnist_csv(&path));
    assert!(
        error.ends_with("bad.csv: line 2, column 785: \"x\" is not an integer"),
        "{error}"
    );
    std::fs::write(&path, row("12")).unwrap();
    let error = error_of(read_mnist_csv(&path));
    assert!(
        error.contains("line 1, column 785: 12 is not in 0..=9"),
        "{error}"
    );
    std::fs::write(&path, format!("300,{}", row("1").split_at(2).1)).unwrap();
    let error = error_of(read_mnist_csv(&path));
    assert!(
        error.contains("line 1, column 1: 300 is not in 0..=255"),
        "{error}"
    );
    std::fs::write(&path, row("1") + "\n1,2,3\n").unwrap();
    let error = error_of(read_mnist_csv(&path));
    assert!(error.contains("line 3: 3 columns, expected 785"), "{error}");
    std::fs::write(&path, "").unwrap();
    assert!(error_of(read_mnist_csv(&path)).ends_with("bad.csv: no rows"));
    // A good plain-text row reads as well as the gzip file does.
    std::fs::write(&path, row("6")).unwrap();
    let set: ImageSet = read_mnist_csv(&path).unwrap();
    assert_eq!((set.len(), set.labels[0]), (1, 6));
}
