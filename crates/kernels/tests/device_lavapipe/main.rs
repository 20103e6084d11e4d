//! The cubecl compression kernels on a real Vulkan device — Mesa's lavapipe
//! on machines without a GPU (`WgpuDeviceKind::Cpu`) — against the CPU
//! implementation: packed words bit-identical, scales within 1e-6 relative,
//! errors within 1e-6 of the scale, for lengths around word boundaries and
//! 2^20 + 7, one block and several, both scales. Inputs are fresh each run
//! (seeded from the clock, printed for replay); outputs are poisoned before
//! each launch so an element a kernel fails to write fails the test. The
//! server side (average n copies, add the server error, recompress) and
//! SLAMB's hash mask with its gather and scatter the same, and the
//! selection words' offsets (prefix sums) exactly the host's, clipping's
//! squared norm and scaling within f32 rounding of the host's; the fp16
//! conversions of SLAMB's `values = "f16"` bit for bit against the `half`
//! crate the host path rounds with; LAMB's and SLAMB's trust ratios
//! ([`trust`]); 1-bit LAMB's scalars on the device ([`onebit_lamb`]); the
//! gradients' gather into the flat gradient ([`gather`]).

mod gather;
mod onebit_lamb;
mod trust;

use cubecl::device::{WgpuDevice, WgpuDeviceKind};
use cubecl::prelude::*;
use terse_kernels::device::{self, DeviceCompressed};
use terse_kernels::onebit::{self, Scale, blocks_for, words_for};
use terse_rng::SplitMix64;

fn client() -> Client {
    // The Vulkan loader wants a runtime dir; .cargo/config.toml sets one.
    assert!(
        std::env::var_os("XDG_RUNTIME_DIR").is_some(),
        "set XDG_RUNTIME_DIR (e.g. /tmp)"
    );
    cubecl::Device::Wgpu(WgpuDevice::new(WgpuDeviceKind::Cpu)).client()
}

fn read_f32(client: &Client, handle: &cubecl::server::Handle) -> Vec<f32> {
    f32::from_bytes(&client.read_one_unchecked(handle.clone())).to_vec()
}

fn read_u32(client: &Client, handle: &cubecl::server::Handle) -> Vec<u32> {
    u32::from_bytes(&client.read_one_unchecked(handle.clone())).to_vec()
}

/// Inputs fresh each run, seeded from the clock, the seed printed for a
/// replay.
fn fresh_rng() -> (SplitMix64, u64) {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("inputs seeded with {seed}");
    (SplitMix64::new(seed), seed)
}

#[test]
fn compression_matches_the_cpu_implementation() {
    let client = client();
    let (mut rng, seed) = fresh_rng();
    for len in [1usize, 31, 32, 33, 1000, (1 << 20) + 7] {
        for block in [len, 64, 32 * 37] {
            for scale in [Scale::L1, Scale::L2] {
                let what = format!("len {len}, block {block}, {scale:?} (seed {seed})");
                let x: Vec<f32> = (0..len).map(|_| rng.normal()).collect();
                let e0: Vec<f32> = (0..len).map(|_| 0.1 * rng.normal()).collect();
                let (words, blocks) = (words_for(len), blocks_for(len, block));

                let mut e_cpu = e0.clone();
                let mut bits_cpu = vec![0u32; words];
                let mut scales_cpu = vec![0.0f32; blocks];
                onebit::compress(&x, &mut e_cpu, block, scale, &mut bits_cpu, &mut scales_cpu);

                let x_dev = client.create_from_slice(f32::as_bytes(&x));
                let e_dev = client.create_from_slice(f32::as_bytes(&e0));
                let out = DeviceCompressed {
                    bits: client.create_from_slice(u32::as_bytes(&vec![0xdead_beef; words])),
                    scales: client.create_from_slice(f32::as_bytes(&vec![f32::NAN; blocks])),
                };
                device::compress(&client, &x_dev, &e_dev, len, block, scale, &out);
                let bits = read_u32(&client, &out.bits);
                let scales = read_f32(&client, &out.scales);
                let e = read_f32(&client, &e_dev);

                assert_eq!(bits, bits_cpu, "{what}: packed words");
                for (k, (&s, &s_cpu)) in scales.iter().zip(&scales_cpu).enumerate() {
                    let rel = (f64::from(s) - f64::from(s_cpu)).abs() / f64::from(s_cpu).max(1e-30);
                    assert!(rel <= 1e-6, "{what}: scale {k}: {s} vs {s_cpu}");
                }
                let b = block.min(len);
                for i in 0..len {
                    let tol = 1e-6 * f64::from(scales_cpu[i / b]).max(1e-30);
                    let d = (f64::from(e[i]) - f64::from(e_cpu[i])).abs();
                    assert!(d <= tol, "{what}: error {i}: {} vs {}", e[i], e_cpu[i]);
                }

                let restored = client.create_from_slice(f32::as_bytes(&vec![f32::NAN; len]));
                device::decompress(&client, &out, len, block, &restored);
                let restored = read_f32(&client, &restored);
                let mut restored_cpu = vec![0.0f32; len];
                onebit::decompress(&bits, &scales, block, &mut restored_cpu);
                assert_eq!(
                    restored.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    restored_cpu.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{what}: dequantised values"
                );
            }
        }
    }
}

#[test]
fn server_average_and_recompress_matches_the_cpu_implementation() {
    use terse_kernels::device::ReceivedCopies;
    use terse_kernels::server::{self, Compressed};

    let client = client();
    let mut rng = SplitMix64::new(std::process::id() as u64 ^ 0x5e4e);
    for copies in [1usize, 2, 3, 4] {
        for len in [33usize, 1000, (1 << 16) + 5] {
            for (block, scale) in [(len, Scale::L1), (64, Scale::L2)] {
                let what = format!("{copies} copies, len {len}, block {block}, {scale:?}");
                let (words, blocks) = (words_for(len), blocks_for(len, block));
                // Strides larger than needed, as in a padded message.
                let (words_stride, scales_stride) = (words + 1, blocks + 2);
                let mut all_bits = vec![0u32; copies * words_stride];
                let mut all_scales = vec![0.0f32; copies * scales_stride];
                for c in 0..copies {
                    let x: Vec<f32> = (0..len).map(|_| rng.normal()).collect();
                    let mut e = vec![0.0f32; len];
                    onebit::compress(
                        &x,
                        &mut e,
                        block,
                        scale,
                        &mut all_bits[c * words_stride..c * words_stride + words],
                        &mut all_scales[c * scales_stride..c * scales_stride + blocks],
                    );
                }
                let e0: Vec<f32> = (0..len).map(|_| 0.2 * rng.normal()).collect();

                let received: Vec<Compressed<'_>> = (0..copies)
                    .map(|c| Compressed {
                        bits: &all_bits[c * words_stride..c * words_stride + words],
                        scales: &all_scales[c * scales_stride..c * scales_stride + blocks],
                    })
                    .collect();
                let mut avg_cpu = vec![0.0f32; len];
                let mut err_cpu = e0.clone();
                let mut bits_cpu = vec![0u32; words];
                let mut scales_cpu = vec![0.0f32; blocks];
                server::average_and_recompress(
                    &received,
                    block,
                    scale,
                    &mut avg_cpu,
                    &mut err_cpu,
                    &mut bits_cpu,
                    &mut scales_cpu,
                );

                // As the compressed allreduce's messages: each copy's
                // padded sign words, then its padded scales' bits.
                let messages: Vec<u32> = (0..copies)
                    .flat_map(|c| {
                        let bits = &all_bits[c * words_stride..(c + 1) * words_stride];
                        let scales = &all_scales[c * scales_stride..(c + 1) * scales_stride];
                        bits.iter()
                            .copied()
                            .chain(scales.iter().map(|s| s.to_bits()))
                    })
                    .collect();
                let messages_dev = client.create_from_slice(u32::as_bytes(&messages));
                let avg_dev = client.create_from_slice(f32::as_bytes(&vec![f32::NAN; len]));
                let err_dev = client.create_from_slice(f32::as_bytes(&e0));
                let out = DeviceCompressed {
                    bits: client.create_from_slice(u32::as_bytes(&vec![0xdead_beef; words])),
                    scales: client.create_from_slice(f32::as_bytes(&vec![f32::NAN; blocks])),
                };
                let copies_on_device = ReceivedCopies {
                    messages: &messages_dev,
                    copies,
                    message: words_stride + scales_stride,
                    sign_words: words_stride,
                };
                device::average_and_recompress(
                    &client,
                    &copies_on_device,
                    len,
                    block,
                    scale,
                    &avg_dev,
                    &err_dev,
                    &out,
                );
                let avg = read_f32(&client, &avg_dev);
                assert_eq!(
                    avg.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    avg_cpu.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{what}: the average is bit-identical"
                );
                assert_eq!(
                    read_u32(&client, &out.bits),
                    bits_cpu,
                    "{what}: packed words"
                );
                let scales = read_f32(&client, &out.scales);
                for (k, (&s, &s_cpu)) in scales.iter().zip(&scales_cpu).enumerate() {
                    let rel = (f64::from(s) - f64::from(s_cpu)).abs() / f64::from(s_cpu).max(1e-30);
                    assert!(rel <= 1e-6, "{what}: scale {k}: {s} vs {s_cpu}");
                }
                let err = read_f32(&client, &err_dev);
                let b = block.min(len);
                for i in 0..len {
                    let tol = 1e-6 * f64::from(scales_cpu[i / b]).max(1e-30);
                    let d = (f64::from(err[i]) - f64::from(err_cpu[i])).abs();
                    assert!(
                        d <= tol,
                        "{what}: server error {i}: {} vs {}",
                        err[i],
                        err_cpu[i]
                    );
                }
            }
        }
    }
}

/// Both masks' selections, hash and cyclic (the cyclic one over lengths
/// from 1 to past 2^20, so its Feistel width and cycle walking vary, and
/// every chunk of a 3-chunk cycle), against the CPU's.
#[test]
fn mask_gather_and_scatter_match_the_cpu_selection() {
    use terse_kernels::mask::{Mask, Selection};

    let client = client();
    let mut rng = SplitMix64::new(std::process::id() as u64 ^ 0x3a5c);
    for len in [1usize, 33, 1000, 4099, (1 << 20) + 7] {
        let always = [0..1.min(len), (len / 2)..(len / 2 + 40).min(len)];
        let always_dev =
            client.create_from_slice(u32::as_bytes(&device::always_bitmap(len, &always)));
        let masks = [0.1, 1.0]
            .into_iter()
            .map(|k| (Mask::Hash { seed: 77, k }, [1u64, 2].as_slice()))
            .chain([0.1, 0.3, 1.0].into_iter().map(|k| {
                let mask = Mask::Cyclic { seed: 77, k, len };
                (mask, [1u64, 2, 3, 13].as_slice())
            }));
        for (mask, steps) in masks {
            for &t in steps {
                let what = format!("len {len}, {mask:?}, step {t}");
                let cpu = Selection::new(&mask, t, len, &always);
                let dev = device::select(&client, &mask, t, len, &always_dev);
                assert_eq!(dev.count, cpu.len(), "{what}: selected count");
                let words = read_u32(&client, &dev.words);
                let selected: Vec<usize> = (0..len)
                    .filter(|&j| words[j / 32] >> (j % 32) & 1 == 1)
                    .collect();
                assert_eq!(
                    selected,
                    cpu.indices().collect::<Vec<_>>(),
                    "{what}: indices"
                );

                let x: Vec<f32> = (0..len).map(|_| rng.normal()).collect();
                let x_dev = client.create_from_slice(f32::as_bytes(&x));
                let values_dev =
                    client.create_from_slice(f32::as_bytes(&vec![f32::NAN; cpu.len().max(1)]));
                dev.gather(&client, &x_dev, &values_dev);
                let mut values_cpu = vec![0.0f32; cpu.len()];
                cpu.gather(&x, &mut values_cpu);
                let values = read_f32(&client, &values_dev);
                assert_eq!(
                    &values[..cpu.len()],
                    &values_cpu[..],
                    "{what}: gathered values"
                );

                let doubled: Vec<f32> = values_cpu.iter().map(|v| 2.0 * v).collect();
                let doubled_dev = client.create_from_slice(f32::as_bytes(&doubled));
                dev.scatter(&client, &doubled_dev, &x_dev);
                let mut x_cpu = x.clone();
                cpu.scatter(&doubled, &mut x_cpu);
                assert_eq!(read_f32(&client, &x_dev), x_cpu, "{what}: scattered values");
            }
        }
        // One cycle of the 3-chunk mask selects each element once (the
        // always-synchronised ones every step).
        let mask = Mask::Cyclic {
            seed: 77,
            k: 0.3,
            len,
        };
        let mut times = vec![0u32; len];
        for t in 1..=3 {
            let words = read_u32(
                &client,
                &device::select(&client, &mask, t, len, &always_dev).words,
            );
            for (j, n) in times.iter_mut().enumerate() {
                *n += words[j / 32] >> (j % 32) & 1;
            }
        }
        for (j, &n) in times.iter().enumerate() {
            let expected = if always.iter().any(|r| r.contains(&j)) {
                3
            } else {
                1
            };
            assert_eq!(
                n, expected,
                "len {len}: element {j} selected {n} times in a cycle"
            );
        }
    }
}

#[test]
fn word_offsets_are_the_host_prefix_sums() {
    let client = client();
    let (mut rng, _) = fresh_rng();
    // Around a group (64 words) and a block (64 groups), several blocks,
    // and BERT-base's 3.4M words; dense, sparse and full words.
    let lens = [
        0usize,
        1,
        63,
        64,
        65,
        4095,
        4096,
        4097,
        3 * 4096 + 5,
        3_433_000,
    ];
    for n in lens {
        for density in [0.5, 0.05, 1.0] {
            let words: Vec<u32> = (0..n)
                .map(|_| (0..32).fold(0u32, |w, b| w | (u32::from(rng.next_f64() < density) << b)))
                .collect();
            let words_dev = client.create_from_slice(u32::as_bytes(&words));
            let (offsets_dev, count) = device::word_offsets(&client, &words_dev, n);
            let (mut want, mut total) = (Vec::with_capacity(n), 0usize);
            for w in &words {
                want.push(total as u32);
                total += w.count_ones() as usize;
            }
            assert_eq!(count, total, "{n} words, density {density}: count");
            let offsets = read_u32(&client, &offsets_dev);
            if let Some(w) = (0..n).find(|&w| offsets[w] != want[w]) {
                panic!(
                    "{n} words, density {density}: word {w}'s offset {} (want {})",
                    offsets[w], want[w]
                );
            }
        }
    }
}

#[test]
fn clipping_on_the_device_scales_as_the_host_does() {
    use terse_kernels::device::optim::{self as kernels, DeviceChunks};

    let client = client();
    let (mut rng, _) = fresh_rng();
    // One chunk; several segments; more chunks than a cube's 256 units
    // (each unit then sums a strided share of the partials).
    for lens in [vec![5usize], vec![1000, 70_001, 5], vec![300 * 4096 + 3, 7]] {
        let len: usize = lens.iter().sum();
        let x: Vec<f32> = (0..len).map(|_| rng.normal()).collect();
        let chunks = DeviceChunks::new(&client, &lens, &vec![0.0; lens.len()]);
        let host = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
        for (what, max_norm) in [("binding", 0.3 * host.sqrt()), ("loose", 2.0 * host.sqrt())] {
            let what = format!("{len} values, {what}");
            let x_dev = client.create_from_slice(f32::as_bytes(&x));
            let total =
                kernels::queue_sum_of_squares(&client, &chunks, &x_dev).total(&client, &chunks);
            let squares = read_f32(&client, &total)[0];
            assert!(
                (f64::from(squares) - host).abs() <= 1e-6 * host,
                "{what}: Σx² {squares} vs {host}"
            );
            kernels::clip_to_norm(&client, &x_dev, len, &total, max_norm as f32);
            let clipped = read_f32(&client, &x_dev);
            let norm = f64::from(squares).sqrt();
            for (i, (&c, &v)) in clipped.iter().zip(&x).enumerate() {
                let want = if norm > max_norm {
                    f64::from(v) * max_norm / norm
                } else {
                    f64::from(v)
                };
                assert!(
                    (f64::from(c) - want).abs() <= 4.0 * f64::from(f32::EPSILON) * want.abs(),
                    "{what}: element {i} {c} vs {want}"
                );
            }
        }
    }
}

#[test]
fn whole_buffer_kernels_stop_at_their_length_in_a_longer_buffer() {
    use terse_kernels::device::optim as kernels;

    // A padded flat buffer (its storage rounded up to the device's
    // alignment) is longer than its values: copying into it, scaling and
    // clipping it must leave the padding as it is (here 7s). A kernel's
    // `len()` is its handle's size, so bounding by it wrote past `len`.
    let client = client();
    let (len, padded) = (300usize, 1000usize);
    let x: Vec<f32> = (0..len).map(|i| i as f32 + 1.0).collect();
    let x_dev = client.create_from_slice(f32::as_bytes(&x));
    let y = client.create_from_slice(f32::as_bytes(&vec![7.0f32; padded]));
    kernels::copy(&client, &x_dev, &y, len);
    kernels::scale(&client, &y, len, 2.0);
    let squares = client.create_from_slice(f32::as_bytes(&[1e6f32]));
    kernels::clip_to_norm(&client, &y, len, &squares, 10.0);
    let out = read_f32(&client, &y);
    for (i, &v) in out.iter().enumerate() {
        let want = if i < len {
            x[i] * 2.0 * (10.0 / 1000.0)
        } else {
            7.0
        };
        assert!(
            (v - want).abs() <= 1e-6 * want,
            "element {i}: {v} vs {want}"
        );
    }
}

#[test]
fn partial_range_kernels_ignore_the_rest_of_their_buffers() {
    use terse_kernels::device::optim as kernels;

    // The same trap through kernels that take a count: a gradient written
    // into the flat gradient from a view of a longer buffer, and the
    // compression of a padded flat buffer's first `len` elements, whose
    // padding here holds 5s (a padded buffer's is zeros, which hid it).
    let _alone = gather::GATHERS.lock().unwrap_or_else(|p| p.into_inner());
    let client = client();
    let (len, padded, block) = (300usize, 1000usize, 256usize);
    let x: Vec<f32> = (0..len).map(|i| (i as f32 - 150.0) / 7.0).collect();
    let with_padding = |v: &[f32]| {
        let mut p = v.to_vec();
        p.resize(padded, 5.0);
        p
    };

    let x_long = client.create_from_slice(f32::as_bytes(&with_padding(&x)));
    let y = client.create_from_slice(f32::as_bytes(&vec![7.0f32; 2 * padded]));
    let part = kernels::GatherPart {
        source: x_long.clone(),
        len,
        offset: 100,
    };
    kernels::gather_at(&client, &[part], &y, 2 * padded, false);
    let y = read_f32(&client, &y);
    for (i, &v) in y.iter().enumerate() {
        let want = if (100..100 + len).contains(&i) {
            x[i - 100]
        } else {
            7.0
        };
        assert_eq!(v, want, "flat gradient element {i}");
    }

    let e0: Vec<f32> = (0..len).map(|i| 0.01 * (i % 13) as f32).collect();
    let (words, blocks) = (words_for(len), blocks_for(len, block));
    let mut e_cpu = e0.clone();
    let mut bits_cpu = vec![0u32; words];
    let mut scales_cpu = vec![0.0f32; blocks];
    onebit::compress(
        &x,
        &mut e_cpu,
        block,
        Scale::L1,
        &mut bits_cpu,
        &mut scales_cpu,
    );
    let e_dev = client.create_from_slice(f32::as_bytes(&with_padding(&e0)));
    let out = DeviceCompressed {
        bits: client.create_from_slice(u32::as_bytes(&vec![0u32; words])),
        scales: client.create_from_slice(f32::as_bytes(&vec![0.0f32; blocks])),
    };
    device::compress(&client, &x_long, &e_dev, len, block, Scale::L1, &out);
    assert_eq!(read_u32(&client, &out.bits), bits_cpu, "packed words");
    let scales = read_f32(&client, &out.scales);
    for (k, (&s, &s_cpu)) in scales.iter().zip(&scales_cpu).enumerate() {
        assert!(
            (s - s_cpu).abs() <= 1e-6 * s_cpu,
            "scale {k}: {s} vs {s_cpu}"
        );
    }
    let e = read_f32(&client, &e_dev);
    for i in 0..padded {
        let want = if i < len { e_cpu[i] } else { 5.0 };
        assert!((e[i] - want).abs() <= 1e-6, "error {i}: {} vs {want}", e[i]);
    }
    let restored = client.create_from_slice(f32::as_bytes(&vec![7.0f32; padded]));
    device::decompress(&client, &out, len, block, &restored);
    let restored = read_f32(&client, &restored);
    assert!(
        restored[len..].iter().all(|&v| v == 7.0),
        "decompression wrote past its {len} elements"
    );
}

/// The f32 inputs that decide an fp16 rounding: every finite fp16 value,
/// the midpoints between neighbours (ties, which go to the even one) and
/// the f32 values one spacing either side of both, of either sign; the
/// edges (fp16's largest, the overflow threshold, f32's subnormals,
/// infinities); and random bit patterns.
fn rounding_inputs(rng: &mut SplitMix64) -> Vec<f32> {
    let mut xs = Vec::new();
    for h in 0u16..0x7C00 {
        let v = half::f16::from_bits(h).to_f32();
        let next = half::f16::from_bits(h + 1).to_f32();
        let mid = ((f64::from(v) + f64::from(next)) / 2.0) as f32;
        for x in [v, mid] {
            let b = x.to_bits();
            xs.extend([b.saturating_sub(1), b, b + 1].map(f32::from_bits));
        }
    }
    xs.extend([
        0.0,
        65504.0,
        65519.99,
        65520.0,
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x007F_FFFF),
        f32::INFINITY,
    ]);
    xs.extend((0..1 << 20).map(|_| f32::from_bits(rng.next_u64() as u32)));
    let negated: Vec<f32> = xs.iter().map(|x| -x).collect();
    xs.extend(negated);
    xs
}

#[test]
fn fp16_conversions_match_the_half_crate() {
    let client = client();
    let (mut rng, _) = fresh_rng();

    // Rounding: every input, then three halves of padding that must be 0.
    let xs = rounding_inputs(&mut rng);
    let values = client.create_from_slice(f32::as_bytes(&xs));
    let packed = device::round_to_f16(&client, &values, xs.len(), xs.len() + 3);
    let words = read_u32(&client, &packed);
    let half_at = |j: usize| (words[j / 2] >> (16 * (j % 2))) as u16;
    for (j, &x) in xs.iter().enumerate() {
        let (got, want) = (half_at(j), half::f16::from_f32(x));
        if want.is_nan() {
            assert!(half::f16::from_bits(got).is_nan(), "{x:e} → {got:#06x}");
        } else {
            assert_eq!(got, want.to_bits(), "{x:e} ({:#010x})", x.to_bits());
        }
    }
    assert_eq!([half_at(xs.len()), half_at(xs.len() + 2)], [0, 0]);

    // Widening: all 65536 halves.
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let pairs: Vec<u32> = all
        .chunks(2)
        .map(|p| u32::from(p[0]) | u32::from(p[1]) << 16)
        .collect();
    let packed = client.create_from_slice(u32::as_bytes(&pairs));
    let wide = read_f32(&client, &device::widen_f16(&client, &packed, all.len()));
    for (&h, &got) in all.iter().zip(&wide) {
        let want = half::f16::from_bits(h).to_f32();
        if want.is_nan() {
            assert!(got.is_nan(), "{h:#06x} → {got}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
}
