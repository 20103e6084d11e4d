//! `gather_at`: many buffers into ranges of one in a few launches (the
//! parameters' gradients into the flat gradient), bit for bit against the
//! host.

use cubecl::prelude::*;
use terse_kernels::device::optim as kernels;
use terse_kernels::dispatches::DispatchCounter;

use super::{client, fresh_rng, read_f32};

/// Held by the tests that call `gather_at`, one of which counts its
/// launches (the dispatch counter sees the whole process's).
pub(crate) static GATHERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Many parts into one buffer, copied and then added, against the same on
/// the host bit for bit: lengths 0 to 1,500 and one of 300,007 (one a view
/// of a longer buffer), the ranges in shuffled order with gaps whose poison must
/// survive, in as few launches as the device binds buffers for.
#[test]
fn gather_at_writes_every_part_into_its_range() {
    let _alone = GATHERS.lock().unwrap_or_else(|p| p.into_inner());
    let client = client();
    let (mut rng, seed) = fresh_rng();
    let lens: Vec<usize> = (0..40)
        .map(|k| match k {
            3 => 0,
            7 => 1,
            // Longer than the 1,024 cubes a source gets: they stride.
            11 => 300_007,
            _ => (rng.next_u64() % 1500) as usize,
        })
        .collect();
    // Ranges in a shuffled order, each after a gap of 0 to 9 elements.
    let mut order: Vec<usize> = (0..lens.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut offsets = vec![0; lens.len()];
    let mut end = 0;
    for &k in &order {
        end += (rng.next_u64() % 10) as usize;
        offsets[k] = end;
        end += lens[k];
    }
    let y_len = end + 5;
    let values: Vec<Vec<f32>> = lens
        .iter()
        .map(|&n| (0..n).map(|_| rng.symmetric()).collect())
        .collect();
    let parts: Vec<kernels::GatherPart> = (0..lens.len())
        .map(|k| {
            // Part 5 lives at the start of a longer buffer of 9s.
            let mut stored = values[k].clone();
            if k == 5 {
                stored.resize(lens[k] + 300, 9.0);
            }
            kernels::GatherPart {
                source: client.create_from_slice(f32::as_bytes(&stored)),
                len: lens[k],
                offset: offsets[k],
            }
        })
        .collect();
    let start: Vec<f32> = (0..y_len).map(|i| -1000.0 - i as f32).collect();
    let y = client.create_from_slice(f32::as_bytes(&start));
    let counter = DispatchCounter::start();
    kernels::gather_at(&client, &parts, &y, y_len, false);
    let copied = read_f32(&client, &y);
    kernels::gather_at(&client, &parts, &y, y_len, true);
    let added = read_f32(&client, &y);
    let launches: u64 = counter
        .by_kernel()
        .iter()
        .filter(|(name, _)| name.contains("GatherAtKernel"))
        .map(|(_, n)| n)
        .sum();
    let mut want_copied = start.clone();
    for k in 0..lens.len() {
        want_copied[offsets[k]..offsets[k] + lens[k]].copy_from_slice(&values[k]);
    }
    let mut want_added = want_copied.clone();
    for k in 0..lens.len() {
        for (y, x) in want_added[offsets[k]..].iter_mut().zip(&values[k]) {
            *y += x;
        }
    }
    for (what, got, want) in [
        ("copied", &copied, &want_copied),
        ("added", &added, &want_added),
    ] {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{what}: element {i} (seed {seed})"
            );
        }
    }
    // Two calls of 39 non-empty parts, at most 16 buffers per launch.
    let bindings = client.properties().hardware.max_bindings as u64;
    let per_launch = bindings.saturating_sub(2).clamp(1, 16);
    assert_eq!(
        launches,
        2 * 39u64.div_ceil(per_launch),
        "launches ({bindings} bindings)"
    );
    println!("{launches} launches for 2 × 39 parts ({bindings} bindings)");
}
