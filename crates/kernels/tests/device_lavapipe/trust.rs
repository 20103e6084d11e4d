//! LAMB's and SLAMB's trust ratios computed on the device (each segment's
//! chunk partials totalled there in f32) against the f64 rules written
//! out here, over segments of 0 to 1.2M elements and every case the rules
//! single out.

use cubecl::prelude::*;

use super::{client, fresh_rng, read_f32};

#[test]
fn lamb_trust_coefficients_on_the_device_are_the_host_f64_ones() {
    use terse_kernels::device::optim::{self as kernels, DeviceChunks, MomentCoefficients};

    let client = client();
    let (mut rng, _) = fresh_rng();
    // (length, scale of x, weight decay, trusted): a ratio clipped at
    // c_max, an empty segment, one of 301 chunks (more than a cube's 256
    // units: each unit sums a strided share), one clipped at c_min, x all 0
    // (degenerate: c = 1), one without a trust ratio, one decaying.
    let segments: [(usize, f32, f32, bool); 7] = [
        (5, 100.0, 0.0, true),
        (0, 1.0, 0.0, true),
        (300 * 4096 + 3, 1.0, 0.0, true),
        (7, 1e-4, 0.0, true),
        (4096, 0.0, 0.0, true),
        (70_001, 1.0, 0.0, false),
        (1000, 0.5, 0.01, true),
    ];
    let lens: Vec<usize> = segments.iter().map(|s| s.0).collect();
    let decays: Vec<f32> = segments.iter().map(|s| s.2).collect();
    let trusted: Vec<bool> = segments.iter().map(|s| s.3).collect();
    let (mut x, mut g) = (Vec::new(), Vec::new());
    for &(len, scale, _, _) in &segments {
        // Growing along the segment, so that a total missing some chunks
        // is visibly off.
        x.extend((0..len).map(|k| scale * (1.0 + 3.0 * k as f32 / len as f32) * rng.normal()));
        g.extend((0..len).map(|_| rng.normal()));
    }
    // β1 = β2 = 0: m = g and v = g², so u = g/(|g| + ε) + wd·x.
    let coefficients = MomentCoefficients {
        beta_1: 0.0,
        beta_2: 0.0,
        one_minus_beta_1: 1.0,
        one_minus_beta_2: 1.0,
        inv_bias_1: 1.0,
        inv_bias_2: 1.0,
        eps: 1e-6,
        grad_scale: 1.0,
    };
    let (lr, c_min, c_max) = (0.01f32, 0.05f32, 10.0f32);
    let chunks = DeviceChunks::new(&client, &lens, &decays);
    let buffers = [&x, &vec![0.0; x.len()], &vec![0.0; x.len()], &g]
        .map(|b| client.create_from_slice(f32::as_bytes(b)));
    let trust = kernels::TrustConstants {
        lr,
        c_min,
        c_max,
        trusted: &trusted,
    };
    let [xd, md, vd, gd] = &buffers;
    let queued = kernels::lamb_step(
        &client,
        &chunks,
        [xd, md, vd, gd],
        &coefficients,
        false,
        &trust,
    );
    let trusts = queued.read();
    let stepped = read_f32(&client, xd);
    let mut offset = 0;
    for (s, &(len, _, wd, trusted)) in segments.iter().enumerate() {
        let range = offset..offset + len;
        offset += len;
        let u: Vec<f64> = range
            .clone()
            .map(|i| {
                let g = f64::from(g[i]);
                g / (g.abs() + 1e-6) + f64::from(wd) * f64::from(x[i])
            })
            .collect();
        let xx: f64 = range.clone().map(|i| f64::from(x[i]).powi(2)).sum();
        let uu: f64 = u.iter().map(|u| u * u).sum();
        let degenerate = trusted && (xx == 0.0 || uu == 0.0);
        let want = if !trusted || degenerate {
            1.0
        } else {
            (xx.sqrt() / uu.sqrt()).clamp(f64::from(c_min), f64::from(c_max))
        };
        let (c, marked) = trusts[s];
        eprintln!("segment {s} ({len}): c {c} vs {want}, degenerate {marked}");
        assert_eq!(marked, degenerate, "segment {s}: degenerate");
        assert!(
            (f64::from(c) - want).abs() <= 1e-5 * want,
            "segment {s}: c {c} vs {want}"
        );
        // The update used that coefficient: x - lr·c·u.
        for (k, i) in range.enumerate() {
            let expected = f64::from(x[i]) - f64::from(lr) * want * u[k];
            let scale = f64::from(lr) * want * u[k].abs() + f64::from(x[i]).abs();
            assert!(
                (f64::from(stepped[i]) - expected).abs() <= 1e-5 * scale + 1e-12,
                "segment {s}, element {i}: {} vs {expected}",
                stepped[i]
            );
        }
    }
}

#[test]
fn slamb_trust_ratios_on_the_device_are_the_host_f64_ones() {
    use terse_kernels::device::optim::{DeviceChunks, MomentCoefficients};
    use terse_kernels::device::slamb_trust::{SlambTrust, trust_ratios};

    let client = client();
    let (mut rng, _) = fresh_rng();
    // (length, scale of x, share selected, 1-D): both kinds over 301
    // chunks (more than a cube's units), none selected, all selected, x all
    // 0, a ratio the paper clips at φ_max, an empty segment, a 1-D one.
    let segments: [(usize, f32, f64, bool); 7] = [
        (300 * 4096 + 3, 1.0, 0.3, false),
        (5000, 0.5, 0.0, false),
        (77, 0.5, 1.0, false),
        (4096, 0.0, 0.5, false),
        (33, 100.0, 0.5, false),
        (0, 1.0, 0.5, false),
        (768, 0.2, 0.5, true),
    ];
    let lens: Vec<usize> = segments.iter().map(|s| s.0).collect();
    let one_dimensional: Vec<bool> = segments.iter().map(|s| s.3).collect();
    let (mut x, mut m, mut picked) = (Vec::new(), Vec::new(), Vec::new());
    for &(len, scale, share, _) in &segments {
        // Growing along the segment, so that a total missing some chunks
        // is visibly off.
        x.extend((0..len).map(|k| scale * (1.0 + 3.0 * k as f32 / len as f32) * rng.normal()));
        m.extend((0..len).map(|_| rng.normal()));
        picked.extend((0..len).map(|_| rng.next_f64() < share));
    }
    let mut words = vec![0u32; x.len().div_ceil(32).max(1)];
    for (i, _) in picked.iter().enumerate().filter(|(_, p)| **p) {
        words[i / 32] |= 1 << (i % 32);
    }
    // v = 1, no bias correction, ε = 0, no decay: u = m.
    let coefficients = MomentCoefficients {
        beta_1: 0.9,
        beta_2: 0.999,
        one_minus_beta_1: 0.1,
        one_minus_beta_2: 0.001,
        inv_bias_1: 1.0,
        inv_bias_2: 1.0,
        eps: 0.0,
        grad_scale: 1.0,
    };
    let chunks = DeviceChunks::new(&client, &lens, &vec![0.0; lens.len()]);
    let [xd, md, vd] =
        [&x, &m, &vec![1.0; x.len()]].map(|b| client.create_from_slice(f32::as_bytes(b)));
    let wd = client.create_from_slice(u32::as_bytes(&words));
    let (phi_min, phi_max) = (0.05f32, 5.0f32);
    for authors in [false, true] {
        let rule = SlambTrust {
            authors,
            phi_min,
            phi_max,
            one_dimensional: &one_dimensional,
        };
        let phi = trust_ratios(
            &client,
            &chunks,
            [&xd, &md, &vd],
            &wd,
            &coefficients,
            false,
            &rule,
        );
        let phi = read_f32(&client, &phi);
        let mut offset = 0;
        for (s, &(len, _, _, one_d)) in segments.iter().enumerate() {
            let range = offset..offset + len;
            offset += len;
            let mut n = [0.0f64; 4];
            let (mut selected, mut rest) = (0, 0);
            for i in range {
                let (x, u) = (f64::from(x[i]), f64::from(m[i]));
                let side = if picked[i] { 0 } else { 2 };
                n[side] += x * x;
                n[side + 1] += u * u;
                *(if picked[i] { &mut selected } else { &mut rest }) += 1;
            }
            let ratio = |x: f64, u: f64, clip: bool| {
                if x == 0.0 || u == 0.0 {
                    1.0
                } else if clip {
                    (x.sqrt() / u.sqrt()).clamp(f64::from(phi_min), f64::from(phi_max))
                } else {
                    x.sqrt() / u.sqrt()
                }
            };
            let unbounded = (0.0, f64::from(f32::MAX));
            let want = if !authors {
                let (sel, others) = (ratio(n[0], n[1], true), ratio(n[2], n[3], true));
                let (fresh, stale) = match (selected, rest) {
                    (_, 0) => (sel, sel),
                    (0, _) => (others, others),
                    _ => (sel, others),
                };
                [fresh, stale, unbounded.0, unbounded.1]
            } else if one_d {
                let both = ratio(n[0] + n[2], n[1] + n[3], false);
                [both, both, unbounded.0, unbounded.1]
            } else {
                let bounds = (f64::from(phi_min), f64::from(phi_max));
                [
                    ratio(n[0], n[1], false),
                    ratio(n[2], n[3], false),
                    bounds.0,
                    bounds.1,
                ]
            };
            let got = &phi[4 * s..4 * s + 4];
            eprintln!("authors {authors}, segment {s} ({len}): {got:?} vs {want:?}");
            for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= 1e-5 * w.abs(),
                    "authors {authors}, segment {s}: phi[{k}] {g} vs {w}"
                );
            }
        }
    }
}
