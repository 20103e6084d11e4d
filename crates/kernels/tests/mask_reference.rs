//! SLAMB's masks: the hash mask selects a fraction k of the elements, fresh
//! and independent each step, identical for the same seed and different for
//! another; the cyclic mask synchronises every element exactly once per
//! cycle in equal chunks; always-synchronised ranges are always in; gather
//! and scatter invert each other.

use terse_kernels::mask::{Mask, Selection, permute, unpermute};

fn selected(mask: &Mask, t: u64, len: usize, always: &[std::ops::Range<usize>]) -> Vec<bool> {
    let mut s = vec![false; len];
    Selection::new(mask, t, len, always)
        .indices()
        .for_each(|j| s[j] = true);
    s
}

#[test]
fn hash_mask_selects_k_independently_each_step() {
    let len = 1_000_000;
    let k = 0.1;
    let mask = Mask::Hash { seed: 42, k };
    let a = selected(&mask, 1, len, &[]);
    let b = selected(&mask, 2, len, &[]);
    let count = |s: &[bool]| s.iter().filter(|&&x| x).count() as f64;
    // Binomial(len, k): five standard deviations.
    let sd = (len as f64 * k * (1.0 - k)).sqrt();
    for s in [&a, &b] {
        assert!((count(s) - k * len as f64).abs() < 5.0 * sd, "{}", count(s));
    }
    // Independent steps overlap in k² of the elements.
    let both = a.iter().zip(&b).filter(|(x, y)| **x && **y).count() as f64;
    let sd2 = (len as f64 * k * k).sqrt();
    assert!(
        (both - k * k * len as f64).abs() < 5.0 * sd2,
        "overlap {both}"
    );
    // No structure along the buffer: each tenth holds its share.
    for part in a.chunks(len / 10) {
        let c = count(part);
        assert!(
            (c - k * part.len() as f64).abs() < 5.0 * (part.len() as f64 * k).sqrt(),
            "{c}"
        );
    }
    // Same seed and step: same mask (what every rank relies on); another seed differs.
    assert_eq!(a, selected(&mask, 1, len, &[]));
    assert_ne!(a, selected(&Mask::Hash { seed: 43, k }, 1, len, &[]));
    // k = 1 selects everything.
    assert!(
        selected(&Mask::Hash { seed: 1, k: 1.0 }, 5, 1000, &[])
            .iter()
            .all(|&x| x)
    );
}

#[test]
fn cyclic_mask_covers_every_element_once_per_cycle() {
    for len in [1usize, 10, 1000, 65_537] {
        let k = 0.25;
        let mask = Mask::Cyclic { seed: 9, k, len };
        let mut times = vec![0; len];
        let mut sizes = Vec::new();
        for t in 1..=4 {
            let s = selected(&mask, t, len, &[]);
            sizes.push(s.iter().filter(|&&x| x).count());
            for (c, x) in times.iter_mut().zip(&s) {
                *c += usize::from(*x);
            }
        }
        assert!(times.iter().all(|&c| c == 1), "len {len}: {times:?}");
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(max - min <= 1, "len {len}: chunk sizes {sizes:?}");
        // The next cycle repeats the first.
        assert_eq!(selected(&mask, 1, len, &[]), selected(&mask, 5, len, &[]));
    }
}

#[test]
fn permutation_is_a_bijection() {
    for len in [1u32, 2, 3, 100, 4097] {
        let mut half = 1;
        while 1u64 << (2 * half) < u64::from(len) {
            half += 1;
        }
        let mut seen = vec![false; len as usize];
        for j in 0..len {
            let p = permute(j, [1, 2, 3, 4], half, len);
            assert!(p < len && !seen[p as usize], "len {len}: {j} -> {p}");
            seen[p as usize] = true;
            assert_eq!(
                unpermute(p, [1, 2, 3, 4], half, len),
                j,
                "len {len}: π⁻¹(π({j}))"
            );
        }
    }
}

#[test]
fn always_ranges_are_selected_and_gather_scatter_invert() {
    let len = 100_000;
    let always = [5..9, 16_380..16_390, 99_990..100_000];
    let mask = Mask::Hash { seed: 1, k: 0.01 };
    let selection = Selection::new(&mask, 3, len, &always);
    let s = selected(&mask, 3, len, &always);
    for r in &always {
        assert!(r.clone().all(|j| s[j]), "{r:?}");
    }
    let without = selected(&mask, 3, len, &[]);
    for j in 0..len {
        let forced = always.iter().any(|r| r.contains(&j));
        assert_eq!(s[j], without[j] || forced, "element {j}");
    }
    let indices: Vec<usize> = selection.indices().collect();
    assert!(indices.windows(2).all(|w| w[0] < w[1]), "ascending");
    let x: Vec<f32> = (0..len).map(|i| i as f32).collect();
    let mut values = vec![f32::NAN; selection.len()];
    selection.gather(&x, &mut values);
    assert!(values.iter().zip(&indices).all(|(&v, &j)| v == j as f32));
    let mut y = vec![-1.0f32; len];
    let doubled: Vec<f32> = values.iter().map(|v| 2.0 * v).collect();
    selection.scatter(&doubled, &mut y);
    for j in 0..len {
        let want = if s[j] { 2.0 * j as f32 } else { -1.0 };
        assert_eq!(y[j], want, "element {j}");
    }
}

/// The cyclic selection (made from π⁻¹ of the step's chunk) is the mask's
/// definition evaluated at every element, `⌊π(j)·chunks/len⌋ == t mod
/// chunks` or inside an always range, ascending: over lengths whose pieces
/// (16,384 elements) split the always ranges, chunk counts that do not
/// divide the length, and k = 1.
#[test]
fn cyclic_selection_is_the_definition_at_every_element() {
    for len in [1usize, 10, 16_385, 100_000, (1 << 20) + 3] {
        // Overlapping ranges too (5..9 and 7..12; at small lengths, the
        // same empty or clipped range more than once).
        let always = [5..9, 7..12, 16_380..16_390, 99_990..100_000]
            .map(|r| r.start.min(len)..r.end.min(len));
        for k in [0.1, 0.3, 1.0] {
            let mask = Mask::Cyclic { seed: 4, k, len };
            for t in [1u64, 2, 7] {
                let step = mask.at_step(t);
                let chosen: Vec<usize> = Selection::new(&mask, t, len, &always).indices().collect();
                let want: Vec<usize> = (0..len)
                    .filter(|&j| step.selected(j as u32) || always.iter().any(|r| r.contains(&j)))
                    .collect();
                assert_eq!(chosen, want, "len {len}, k {k}, step {t}");
            }
        }
    }
}
