//! Reads the real Fashion-MNIST from Debian's `dataset-fashion-mnist` package
//! (installed by `.ci/run`). Expected values: the dataset paper (Xiao et al.
//! 2017, Table 1) gives 60,000/10,000 images of 28×28 with 6,000/1,000 per
//! class; the first training image is an ankle boot (label 9) and the first
//! test image too, as every Fashion-MNIST loader shows.

use terse_data::FashionMnist;

#[test]
fn both_splits_have_the_published_sizes_and_balanced_classes() {
    for (train, count, per_class) in [(true, 60_000, 6_000), (false, 10_000, 1_000)] {
        let split = FashionMnist::load_debian(train).expect("dataset-fashion-mnist is installed");
        assert_eq!(split.len(), count);
        assert_eq!((split.images.rows, split.images.cols), (28, 28));
        let mut histogram = [0usize; 10];
        for &label in &split.labels {
            histogram[usize::from(label)] += 1;
        }
        assert_eq!(histogram, [per_class; 10], "train = {train}");
        assert_eq!(split.labels[0], 9, "first image is an ankle boot");
    }
}

#[test]
fn batches_scale_pixels_to_unit_range() {
    let test = FashionMnist::load_debian(false).unwrap();
    let (features, labels) = test.batch(0..2);
    assert_eq!(features.len(), 2 * 784);
    assert_eq!(labels, [9, 2]);
    let expected: Vec<f32> = test
        .images
        .image(1)
        .iter()
        .map(|&p| f32::from(p) / 255.0)
        .collect();
    assert_eq!(&features[784..], expected.as_slice());
    assert!(features.iter().all(|&f| (0.0..=1.0).contains(&f)));
    assert!(features.contains(&1.0), "some pixel is saturated");
}
