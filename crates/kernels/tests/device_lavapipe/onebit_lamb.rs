//! 1-bit LAMB's per-segment scalars kept on the device: the running trust
//! average of the warmup and the compression stage's variance ratios
//! (each segment's largest over 0 to 1.2M elements, clipped against the
//! last ratio and to `[r_min, r_max]`) with the update they scale, against
//! the f64 rules written out here.

use cubecl::prelude::*;

use super::{client, fresh_rng, read_f32};
use terse_kernels::device::optim::{self as kernels, DeviceChunks, MomentCoefficients};

/// β1 = 0.9 and β2 = 0 (the fresh variance is this step's `g²`), no bias
/// correction, ε = 1e-6.
const COEFFICIENTS: MomentCoefficients = MomentCoefficients {
    beta_1: 0.9,
    beta_2: 0.0,
    one_minus_beta_1: 0.1,
    one_minus_beta_2: 1.0,
    inv_bias_1: 1.0,
    inv_bias_2: 1.0,
    eps: 1e-6,
    grad_scale: 1.0,
};

#[test]
fn variance_ratios_and_their_update_on_the_device_are_the_host_f64_ones() {
    let client = client();
    let (mut rng, _) = fresh_rng();
    let (r_min, r_max, threshold, lr) = (0.5f64, 4.0f64, 0.1f64, 0.01f64);
    // (length, largest ratio the data is drawn to, last ratio, weight
    // decay, share of v exactly 0): the ratio within its threshold of the
    // last over 301 chunks (more than a cube's 256 units, each folding a
    // strided share), an empty segment (ratio 0: clipped down), one
    // clipped up to 1.1× the last, one down to 0.9×, one then at r_max, one
    // at r_min; the third holds some zero variances (m zeroed, x kept).
    let segments: [(usize, f64, f64, f32, f64); 6] = [
        (300 * 4096 + 3, 2.0, 2.0, 0.0, 0.0),
        (0, 1.0, 1.5, 0.0, 0.0),
        (5000, 3.0, 1.0, 0.01, 0.1),
        (77, 0.3, 1.0, 0.0, 0.0),
        (1000, 5.0, 3.9, 0.01, 0.0),
        (33, 0.2, 0.52, 0.0, 0.0),
    ];
    let p = segments.len();
    let lens: Vec<usize> = segments.iter().map(|s| s.0).collect();
    let decays: Vec<f32> = segments.iter().map(|s| s.3).collect();
    let c_avg: Vec<f32> = (0..p).map(|_| 0.1 + 2.0 * rng.next_f64() as f32).collect();
    let (mut x, mut m, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for &(len, largest, _, _, zeros) in &segments {
        for k in 0..len {
            let mk = rng.normal();
            // m_last = 0: g = m/(1-β1) = 10·m, v_fresh = g², so the ratio
            // (√v + ε)/(|g| + ε) is about largest·√u, u in (0, 1], growing
            // along the segment so that a fold missing chunks is off.
            let u = (k + 1) as f64 / len as f64 * rng.next_f64().sqrt();
            let root = largest * u.sqrt() * (10.0 * f64::from(mk).abs());
            let zero = rng.next_f64() < zeros;
            m.push(mk);
            v.push(if zero { 0.0 } else { (root * root) as f32 });
            x.push(rng.normal());
        }
    }
    let n = x.len();
    let scalars: Vec<f32> = c_avg
        .iter()
        .copied()
        .chain(segments.iter().map(|s| s.2 as f32))
        .collect();
    let chunks = DeviceChunks::new(&client, &lens, &decays);
    let upload = |values: &[f32]| client.create_from_slice(f32::as_bytes(values));
    let [xd, md, lastd, vd, freshd] = [&x, &m, &vec![0.0; n], &v, &vec![7.0; n]].map(|b| upload(b));
    let scalars_d = upload(&scalars);
    let constants = kernels::FreshVarianceConstants {
        coefficients: &COEFFICIENTS,
        inv_one_minus_beta_1: 10.0,
        inside: false,
        variance: false,
    };
    let rule = kernels::VarianceRatioRule {
        lr: lr as f32,
        r_min: r_min as f32,
        r_max: r_max as f32,
        r_threshold: threshold as f32,
    };
    kernels::fresh_variance_update(
        &client,
        &chunks,
        [&xd, &md, &lastd, &vd, &freshd],
        &scalars_d,
        &constants,
        &rule,
        true,
    );
    let (stepped, moments, fresh) = (
        read_f32(&client, &xd),
        read_f32(&client, &md),
        read_f32(&client, &freshd),
    );
    let kept = read_f32(&client, &scalars_d);
    let mut offset = 0;
    for (s, &(len, _, prev, wd, _)) in segments.iter().enumerate() {
        let range = offset..offset + len;
        offset += len;
        let denominator = |v: f64| v.sqrt() + 1e-6;
        let mut raw = 0.0f64;
        for i in range.clone() {
            let g = 10.0 * f64::from(m[i]);
            assert!(
                (f64::from(fresh[i]) - g * g).abs() <= 1e-6 * g * g,
                "element {i}: v_fresh {} vs {}",
                fresh[i],
                g * g
            );
            raw = raw.max(denominator(f64::from(v[i])) / denominator(g * g));
        }
        let want = raw
            .clamp((1.0 - threshold) * prev, (1.0 + threshold) * prev)
            .clamp(r_min, r_max);
        let r = kept[p + s];
        eprintln!("segment {s} ({len}): largest ratio {raw}, r {r} vs {want}");
        assert!(
            (f64::from(r) - want).abs() <= 1e-5 * want,
            "segment {s}: r {r} vs {want}"
        );
        assert_eq!(kept[s], c_avg[s], "segment {s}: c_avg is only read");
        let rate = lr * want * f64::from(c_avg[s]);
        for i in range {
            if v[i] == 0.0 {
                assert_eq!((stepped[i], moments[i]), (x[i], 0.0), "element {i}: held");
                continue;
            }
            let u =
                f64::from(m[i]) / denominator(f64::from(v[i])) + f64::from(wd) * f64::from(x[i]);
            let expected = f64::from(x[i]) - rate * u;
            let scale = rate * u.abs() + f64::from(x[i]).abs();
            assert!(
                (f64::from(stepped[i]) - expected).abs() <= 1e-5 * scale,
                "segment {s}, element {i}: {} vs {expected}",
                stepped[i]
            );
        }
    }
}

#[test]
fn the_running_trust_average_on_the_device_skips_degenerate_segments() {
    let client = client();
    let (mut rng, _) = fresh_rng();
    // x all 0 in the second segment (degenerate: its average stays), an
    // empty third (degenerate too), 301 chunks in the fourth.
    let lens = [7usize, 100, 0, 300 * 4096 + 3];
    let scales = [1.0f32, 0.0, 1.0, 0.5];
    let (mut x, mut g) = (Vec::new(), Vec::new());
    for (&len, &scale) in lens.iter().zip(&scales) {
        x.extend((0..len).map(|_| scale * rng.normal()));
        g.extend((0..len).map(|_| rng.normal()));
    }
    let n = x.len();
    let chunks = DeviceChunks::new(&client, &lens, &[0.0; 4]);
    let upload = |values: &[f32]| client.create_from_slice(f32::as_bytes(values));
    let [xd, md, vd, gd] = [&x, &vec![0.0; n], &vec![0.0; n], &g].map(|b| upload(b));
    let before: Vec<f32> = (0..4).map(|_| rng.next_f64() as f32).collect();
    // c_avg then r_prev, as 1-bit LAMB keeps them.
    let scalars = upload(&[before.clone(), vec![1.0; 4]].concat());
    let trust = kernels::TrustConstants {
        lr: 0.01,
        c_min: 0.01,
        c_max: 10.0,
        trusted: &[true; 4],
    };
    let queued = kernels::lamb_step(
        &client,
        &chunks,
        [&xd, &md, &vd, &gd],
        &COEFFICIENTS,
        false,
        &trust,
    );
    let beta_3 = 0.9f32;
    queued.average_into(&scalars, beta_3);
    let trusts = queued.read();
    let after = read_f32(&client, &scalars);
    for (s, &(c, degenerate)) in trusts.iter().enumerate() {
        let want = if degenerate {
            f64::from(before[s])
        } else {
            0.9 * f64::from(before[s]) + 0.1 * f64::from(c)
        };
        eprintln!(
            "segment {s}: c {c} (degenerate {degenerate}), c_avg {} vs {want}",
            after[s]
        );
        assert_eq!(degenerate, s == 1 || s == 2, "segment {s}: degenerate");
        assert!(
            (f64::from(after[s]) - want).abs() <= 1e-6 * want,
            "segment {s}"
        );
        assert_eq!(after[4 + s], 1.0, "segment {s}: the ratios are untouched");
    }
}
