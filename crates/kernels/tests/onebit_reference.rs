//! The CPU 1-bit compression against a float64 re-implementation of
//! ALGORITHMS.md written here: signs bit-exact, scales within 1e-6 relative,
//! errors within 1e-6 of the block scale, for lengths around word boundaries,
//! one block and several, both scales; and decompress inverts the packing.

use terse_kernels::onebit::{Scale, blocks_for, compress, decompress, words_for};
use terse_rng::SplitMix64 as SplitMix;

#[test]
fn compress_matches_float64_reference() {
    let mut rng = SplitMix::new(11);
    // 2^20 + 7 spans many parallel pieces, inside one block and across blocks
    // larger than a piece.
    for len in [1usize, 31, 32, 33, 1000, 100_003, (1 << 20) + 7] {
        for block in [len, 64, 32 * 37, 3 * (1 << 14) + 32] {
            for scale in [Scale::L1, Scale::L2] {
                let x: Vec<f32> = (0..len).map(|_| rng.symmetric()).collect();
                let e0: Vec<f32> = (0..len).map(|_| 0.1 * rng.symmetric()).collect();
                let mut e = e0.clone();
                let nb = blocks_for(len, block.min(len));
                // Poison the outputs: an unwritten word or scale fails below.
                let mut bits = vec![0xdead_beefu32; words_for(len)];
                let mut scales = vec![f32::NAN; nb];
                compress(&x, &mut e, block, scale, &mut bits, &mut scales);

                let b = block.min(len);
                assert_eq!(scales.len(), nb);
                for (k, &scale_k) in scales.iter().enumerate() {
                    let r = k * b..((k + 1) * b).min(len);
                    // y exactly as f32 addition gives it; scale in f64.
                    let y: Vec<f32> = r.clone().map(|i| x[i] + e0[i]).collect();
                    let n = y.len() as f64;
                    let s_ref = match scale {
                        Scale::L1 => y.iter().map(|&v| f64::from(v).abs()).sum::<f64>() / n,
                        Scale::L2 => {
                            (y.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n).sqrt()
                        }
                    };
                    let s = f64::from(scale_k);
                    assert!(
                        (s - s_ref).abs() <= 1e-6 * s_ref,
                        "len {len} block {block}: scale {s} vs {s_ref}"
                    );
                    for (j, i) in r.enumerate() {
                        let positive = bits[i / 32] >> (i % 32) & 1 == 1;
                        assert_eq!(positive, y[j] >= 0.0, "len {len}: sign of element {i}");
                        let q = if positive { s_ref } else { -s_ref };
                        let e_ref = f64::from(y[j]) - q;
                        assert!(
                            (f64::from(e[i]) - e_ref).abs() <= 1e-6 * s_ref.max(1e-30),
                            "len {len}: error {i}"
                        );
                    }
                }
                if len % 32 != 0 {
                    let last = bits[len / 32];
                    assert_eq!(last >> (len % 32), 0, "len {len}: padding bits must be 0");
                }

                let mut out = vec![f32::NAN; len];
                decompress(&bits, &scales, block, &mut out);
                for i in 0..len {
                    let k = i / b;
                    // q + e recovers y: nothing is lost, only deferred.
                    assert!((out[i] + e[i] - (x[i] + e0[i])).abs() <= 1e-6 * (1.0 + scales[k]));
                }
            }
        }
    }
}

#[test]
fn bit_layout_is_element_32w_plus_b() {
    // Elements 0, 2 and 33 negative, all others positive: word 0 has bits 0
    // and 2 cleared, word 1 has bit 1 cleared; zero counts as non-negative.
    let mut x = vec![1.0f32; 40];
    x[0] = -1.0;
    x[2] = -3.0;
    x[33] = -0.5;
    x[5] = 0.0;
    let mut e = vec![0.0f32; 40];
    let mut bits = vec![0u32; 2];
    let mut scales = vec![0.0f32; 1];
    compress(&x, &mut e, 40, Scale::L1, &mut bits, &mut scales);
    assert_eq!(bits[0], !0b101u32);
    assert_eq!(bits[1], 0b1111_1101);
    // mean |x|: 36 elements of 1.0, then |-1| + |-3| + |-0.5| + |0| = 4.5,
    // so (36 + 4.5) / 40 = 1.0125.
    let expected = 1.0125f32;
    assert!((scales[0] - expected).abs() < 1e-7, "{}", scales[0]);
    // The zero element is sent as +s, so its error is -s.
    assert!((e[5] + expected).abs() < 1e-7);
}

/// A rank that splits the update dequantises only its own part of the
/// compressed allreduce's result: every wanted element must be `±scale` of
/// its chunk's block (derived here from the bit layout, not from
/// `decompress`), and the elements outside the wanted range's whole sign
/// words must stay untouched.
#[test]
fn decompress_part_writes_the_wanted_elements() {
    use terse_kernels::onebit::ChunkLayout;
    use terse_kernels::worker::{HostWorker, Worker};

    let mut rng = SplitMix::new(5);
    for (len, chunk, block) in [
        (1000usize, 256usize, 256usize),
        (1000, 256, 64),
        (100_003, 25_024, 4096),
        (77, 32, 32),
    ] {
        let layout = ChunkLayout::new(chunk, block);
        let per_chunk = layout.slots_per_chunk();
        let bits: Vec<u32> = (0..words_for(len)).map(|_| rng.next_u64() as u32).collect();
        let scales: Vec<f32> = (0..len.div_ceil(chunk) * per_chunk)
            .map(|_| 0.5 + rng.symmetric().abs())
            .collect();
        let expected = |i: usize| {
            let slot = i / chunk * per_chunk + i % chunk / layout.block;
            let s = scales[slot];
            if bits[i / 32] >> (i % 32) & 1 == 1 {
                s
            } else {
                -s
            }
        };
        for wanted in [0..len, 0..1, 3..40, len / 3..len / 2, len - 5..len, 33..33] {
            let mut x = vec![f32::NAN; len];
            let mut error = vec![0.0f32; len];
            let mut worker = HostWorker {
                x: &mut x,
                error: &mut error,
            };
            worker.decompress_part(layout, &bits, &scales, wanted.clone());
            let words = wanted.start / 32 * 32..(wanted.end.div_ceil(32) * 32).min(len);
            for (i, &v) in x.iter().enumerate() {
                if wanted.contains(&i) {
                    assert_eq!(v.to_bits(), expected(i).to_bits(), "len {len}: element {i}");
                } else if !words.contains(&i) || wanted.is_empty() {
                    assert!(v.is_nan(), "len {len} {wanted:?}: element {i} written");
                }
            }
        }
    }
}
