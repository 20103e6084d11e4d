//! The CIFAR augmentation: crop/flip outputs worked by hand on a 1×2×3
//! image, normalization against values computed with Python, the spread of
//! the random choices, and their independence of batch composition.

use terse_data::images::{
    Augment, CIFAR10_MEAN, CIFAR10_STD, FASHION_MNIST_MEAN, FASHION_MNIST_STD, ImageSet,
    MNIST_MEAN, MNIST_STD, read_cifar_file,
};
use terse_data::{CifarKind, DataError};

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

#[test]
fn crop_then_flip_by_hand() {
    // One 2×3 channel, the default pad 4, mean 0.5, std 0.5: a pixel p comes
    // out as 2p/255 − 1, so padding (byte 0) is −1.
    //   image   10 20 30
    //           40 50 60
    // The padded image is 10×11 with the original at rows 4..6, columns
    // 4..7; the crop at (dx, dy) is rows dy..dy+2, columns dx..dx+3, and the
    // flip reverses each cropped row (torchvision: crop, then flip).
    let image = [10u8, 20, 30, 40, 50, 60];
    let augment = Augment {
        mean: vec![0.5],
        std: vec![0.5],
        ..Augment::default()
    };
    const P: i32 = 0; // stands for the padding in the tables below
    let run = |dx, dy, flip| {
        let mut out = [0.0f32; 6];
        augment
            .apply(&image, (1, 2, 3), (dx, dy, flip), &mut out)
            .unwrap();
        out
    };
    let expect = |pixels: [i32; 6]| pixels.map(|p| 2.0 * p as f32 / 255.0 - 1.0);
    let cases = [
        // (4, 4): the original.
        ((4, 4, false), [10, 20, 30, 40, 50, 60]),
        // (5, 4): one column further right in the padded image: shifted left.
        ((5, 4, false), [20, 30, P, 50, 60, P]),
        // (3, 5): row 0 is image row 1 shifted right; row 1 is padding.
        ((3, 5, false), [P, 40, 50, P, P, P]),
        // (0, 0) and (8, 8): corners, all padding.
        ((0, 0, false), [P; 6]),
        ((8, 8, true), [P; 6]),
        // (4, 4) flipped: each row reversed.
        ((4, 4, true), [30, 20, 10, 60, 50, 40]),
        // (5, 4) then flip: 20 30 P → P 30 20.
        ((5, 4, true), [P, 30, 20, P, 60, 50]),
        // (3, 3) then flip: row 0 padding; row 1 is P 10 20 → 20 10 P.
        ((3, 3, true), [P, P, P, 20, 10, P]),
    ];
    for (choice, pixels) in cases {
        let out = run(choice.0, choice.1, choice.2);
        assert!(close(&out, &expect(pixels), 1e-6), "{choice:?}: {out:?}");
    }
    assert_eq!(run(0, 0, false)[0], -1.0, "padding is −mean/std");

    let mut out = [0.0f32; 6];
    let error = augment
        .apply(&image, (1, 2, 3), (9, 0, false), &mut out)
        .unwrap_err()
        .to_string();
    assert_eq!(error, "augment: offset (9, 0) is outside 0..=8 for pad 4");
    let error = augment
        .apply(&image[..5], (1, 2, 3), (4, 4, false), &mut out)
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "augment: 5 pixels in and 6 values out for a 1×2×3 image"
    );
}

#[test]
fn normalization_values() {
    // python3 -c "
    // m=[0.4914,0.4822,0.4465]; s=[0.2470,0.2435,0.2616]
    // print([(0-a)/b for a,b in zip(m,s)], [(1-a)/b for a,b in zip(m,s)], [(128/255-a)/b for a,b in zip(m,s)])
    // print((0-0.1307)/0.3081, (1-0.1307)/0.3081, (0-0.2860)/0.3530, (1-0.2860)/0.3530)"
    // [-1.9894736842105263, -1.980287474332649, -1.7068042813455657]
    // [2.0591093117408903, 2.126488706365503, 2.1158256880733943]
    // [0.042756211796459435, 0.08115311833152142, 0.21200605624512797]
    // -0.424212917883804 2.82148653034729 -0.8101983002832861 2.0226628895184136
    let cifar = Augment::normalize_only(&CIFAR10_MEAN, &CIFAR10_STD);
    // A 3×1×3 image: in every channel the pixels 0, 255, 128.
    let image = [0u8, 255, 128, 0, 255, 128, 0, 255, 128];
    let mut out = [0.0f32; 9];
    cifar
        .apply(&image, (3, 1, 3), (0, 0, false), &mut out)
        .unwrap();
    let want = [
        -1.989_473_7,
        2.059_109_3,
        0.042_756_21,
        -1.980_287_5,
        2.126_488_7,
        0.081_153_12,
        -1.706_804_3,
        2.115_825_7,
        0.212_006_06,
    ];
    assert!(close(&out, &want, 1e-5), "{out:?}");

    let grey = [0u8, 255];
    for (mean, std, want) in [
        (MNIST_MEAN, MNIST_STD, [-0.424_212_9, 2.821_486_5]),
        (
            FASHION_MNIST_MEAN,
            FASHION_MNIST_STD,
            [-0.810_198_3, 2.022_662_9],
        ),
    ] {
        let mut out = [0.0f32; 2];
        Augment::normalize_only(&mean, &std)
            .apply(&grey, (1, 1, 2), (0, 0, false), &mut out)
            .unwrap();
        assert!(close(&out, &want, 1e-5), "{out:?}");
    }
}

#[test]
fn every_offset_and_both_flips_occur_at_their_rates() {
    let augment = Augment::cifar10();
    let mut offsets = [[0usize; 9]; 9];
    let mut flips = 0usize;
    for i in 0..100_000u64 {
        let (dx, dy, flip) = augment.draw(42, 3, i);
        offsets[dy][dx] += 1;
        flips += usize::from(flip);
    }
    // Each of the 81 offsets is Binomial(1e5, 1/81): mean 1,235, sd 35;
    // 1,000 is 6.7 sd below.
    assert!(offsets.iter().flatten().all(|&n| n > 1000), "{offsets:?}");
    // Binomial(1e5, 0.5): sd 158 = 0.0016 of the rate; 0.01 is 6 sd.
    let rate = flips as f64 / 1e5;
    assert!((rate - 0.5).abs() < 0.01, "{rate}");
    // Flips off: never; pad 0: always the identity offset.
    let plain = Augment {
        pad: 0,
        flip: false,
        ..Augment::default()
    };
    assert!((0..1000).all(|i| plain.draw(42, 3, i) == (0, 0, false)));
}

/// Sixteen 1×4×4 images, image i filled with bytes 16i … 16i + 15.
fn ramp_set() -> ImageSet {
    let pixels = (0..=255u8).collect();
    ImageSet::new(1, 4, 4, pixels, (0..16).collect()).unwrap()
}

#[test]
fn a_sample_is_augmented_the_same_in_any_batch() {
    let set = ramp_set();
    let augment = Augment {
        pad: 2,
        mean: vec![0.5],
        std: vec![0.25],
        ..Augment::default()
    };
    let n = 16;
    let all: Vec<usize> = (0..16).collect();
    let whole = augment.batch(&set, &all, 7, 2, true).unwrap();
    // Sample 5 alone, and inside a shuffled batch at position 1.
    let alone = augment.batch(&set, &[5], 7, 2, true).unwrap();
    let mixed = augment.batch(&set, &[11, 5, 0], 7, 2, true).unwrap();
    assert_eq!(alone, whole[5 * n..6 * n]);
    assert_eq!(mixed[n..2 * n], alone[..]);
    assert_eq!(mixed[..n], whole[11 * n..12 * n]);
    // Two "ranks" each taking every other sample see what one rank sees.
    for rank in 0..2 {
        let mine: Vec<usize> = (rank..16).step_by(2).collect();
        let mut out = vec![0.0; mine.len() * n];
        augment
            .batch_into(&set, &mine, 7, 2, true, &mut out)
            .unwrap();
        for (slot, &i) in out.chunks_exact(n).zip(&mine) {
            assert_eq!(slot, &whole[i * n..(i + 1) * n]);
        }
    }
    // Evaluation is the plain normalization of the image.
    let eval = augment.batch(&set, &[3], 7, 2, false).unwrap();
    let want: Vec<f32> = set
        .image(3)
        .iter()
        .map(|&p| (f32::from(p) / 255.0 - 0.5) / 0.25)
        .collect();
    assert_eq!(eval, want);
}

#[test]
fn epochs_and_seeds_change_the_choices() {
    let augment = Augment::cifar10();
    // Two independent draws agree with probability 1/(81·2) = 1/162: about
    // 6 of 1,000 samples; 30 is far above (Poisson(6.2) tail < 1e-10).
    let same = |a: (u64, u64), b: (u64, u64)| {
        (0..1000u64)
            .filter(|&i| augment.draw(a.0, a.1, i) == augment.draw(b.0, b.1, i))
            .count()
    };
    assert!(same((1, 0), (1, 1)) < 30, "epochs 0 and 1");
    assert!(same((1, 0), (2, 0)) < 30, "seeds 1 and 2");
    assert_eq!(same((1, 4), (1, 4)), 1000, "the same key, the same choice");

    let set = read_cifar_file(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cifar/tiny-cifar10.bin"),
        CifarKind::Cifar10,
    )
    .unwrap();
    let epoch = |e| augment.batch(&set, &[0, 1, 2], 9, e, true).unwrap();
    assert_ne!(epoch(0), epoch(1));
    assert_eq!(epoch(1), epoch(1));
}

#[test]
fn bad_batches_and_configs_are_errors() {
    let set = ramp_set();
    let error = |r: Result<Vec<f32>, DataError>| r.unwrap_err().to_string();
    assert_eq!(
        error(Augment::cifar10().batch(&set, &[0], 0, 0, true)),
        "augment: 3 means and 3 standard deviations for 1-channel images"
    );
    let grey = Augment::normalize_only(&MNIST_MEAN, &MNIST_STD);
    assert_eq!(
        error(grey.batch(&set, &[0, 16], 0, 0, true)),
        "augment: batch position 1 asks for image 16 of a 16-image set"
    );
    let mut broken = set.clone();
    broken.pixels.pop();
    assert!(error(grey.batch(&broken, &[0], 0, 0, true)).contains("255 pixels for 16 labels"));
    let mut out = vec![0.0; 3];
    assert!(
        grey.batch_into(&set, &[0], 0, 0, true, &mut out)
            .unwrap_err()
            .to_string()
            .contains("a buffer of 3 values for 1 images of 16")
    );
    let zero_std = Augment::normalize_only(&[0.5], &[0.0]);
    assert!(error(zero_std.batch(&set, &[0], 0, 0, true)).contains("must be positive"));

    // The serde config: defaults on every field, unknown fields refused.
    let parsed: Augment = serde_json::from_str("{}").unwrap();
    assert_eq!(parsed, Augment::cifar10());
    assert_eq!((parsed.pad, parsed.flip), (4, true));
    let parsed: Augment =
        serde_json::from_str(r#"{"pad": 2, "flip": false, "mean": [0.1307], "std": [0.3081]}"#)
            .unwrap();
    parsed.validate(1).unwrap();
    assert!(serde_json::from_str::<Augment>(r#"{"padding": 4}"#).is_err());
}

#[test]
fn a_cifar_image_matches_a_python_reference() {
    // Record 2 of the fixture (pixel k = (7k + 2) mod 256), crop (dx 1, dy 6),
    // flipped, CIFAR-10 statistics, written out in plain Python:
    // python3 -c "
    // img=bytes((7*k+2)%256 for k in range(3072)); m=[0.4914,0.4822,0.4465]; s=[0.2470,0.2435,0.2616]
    // dx,dy,flip=1,6,True
    // def px(c,y,x):
    //     sy,sx=y-4,x-4
    //     return img[c*1024+sy*32+sx] if 0<=sy<32 and 0<=sx<32 else 0
    // out=[[(px(c,y+dy,(31-x if flip else x)+dx)/255-m[c])/s[c] for y in range(32) for x in range(32)] for c in range(3)]
    // print([sum(o) for o in out], out[0][0], out[0][31], out[1][30*32+5], out[2][1023])"
    // [-263.2113677859814, -228.30557635785328, -72.76608502728318] 0.138016988171787
    // -1.9894736842105263 -1.980287474332649 -1.7068042813455657
    let set = read_cifar_file(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cifar/tiny-cifar10.bin"),
        CifarKind::Cifar10,
    )
    .unwrap();
    let mut out = vec![0.0f32; 3072];
    Augment::cifar10()
        .apply(set.image(2), (3, 32, 32), (1, 6, true), &mut out)
        .unwrap();
    let sums: Vec<f64> = out
        .chunks_exact(1024)
        .map(|plane| plane.iter().map(|&v| f64::from(v)).sum())
        .collect();
    let want = [-263.211_367_8, -228.305_576_4, -72.766_085_0];
    // 1,024 f32 values of magnitude ≤ 2.2, each within ~2e-7 relative.
    assert!(
        sums.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-3),
        "{sums:?}"
    );
    let picks = [out[0], out[31], out[1024 + 30 * 32 + 5], out[3071]];
    let want = [0.138_016_99, -1.989_473_7, -1.980_287_5, -1.706_804_3];
    assert!(close(&picks, &want, 1e-5), "{picks:?}");
}
