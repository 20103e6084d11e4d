//! SLAMB's fp16 mean over ranks on the device (`crate::half_mean`'s
//! slices): the values rounded to fp16, each owner's slice averaged, the
//! gathered halves widened, with the host path's roundings bit for bit.
//!
//! The conversions are integer arithmetic on the bits, not the device's
//! f16 type: lavapipe (where the tests run) has no f16 arithmetic, and the
//! host path rounds with the `half` crate, whose software conversion these
//! follow (round to nearest even, overflow to infinity, fp16 subnormals,
//! NaN kept quiet). Halves are packed two to a u32 word, the lower index in
//! the low 16 bits: the byte layout of the host's `[u16]` on a
//! little-endian device, which is what the exchanges move.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{buffer, launch_units, unit_item};
use super::optim::f32_arg;
use crate::half_mean::{HalfExchange, HalfSlices};

/// Whether the bits of `m` below `round_bit` (inclusive) round the kept
/// bits above it up, to nearest even: the round bit is set, and so is a
/// bit below it or the kept bits' last one.
#[cube]
fn rounds_up(m: u32, round_bit: u32) -> bool {
    (m & round_bit) != 0u32 && (m & (3u32 * round_bit - 1u32)) != 0u32
}

/// The fp16 bits (in the low 16 bits) nearest `value`, as `half`'s
/// `f16::from_f32`.
#[cube]
fn f16_bits(value: f32) -> u32 {
    let x = u32::reinterpret(value);
    let sign = (x >> 16u32) & 0x8000u32;
    let e = (x >> 23u32) & 0xFFu32;
    let man = x & 0x007F_FFFFu32;
    let mut out = sign;
    if e == 0xFFu32 {
        // Infinity, or a NaN kept quiet with its payload's top bits.
        let mut quiet = 0u32;
        if man != 0u32 {
            quiet = 0x0200u32;
        }
        out = sign | 0x7C00u32 | quiet | (man >> 13u32);
    } else if e >= 143u32 {
        // Past fp16's largest exponent: infinity.
        out = sign | 0x7C00u32;
    } else if e <= 112u32 {
        // An fp16 subnormal, or below half of its least one: signed zero.
        if e >= 102u32 {
            let shift = 126u32 - e;
            let m = man | 0x0080_0000u32;
            let round_bit = 1u32 << (shift - 1u32);
            let mut half_man = m >> shift;
            if rounds_up(m, round_bit) {
                half_man += 1u32;
            }
            out = sign | half_man;
        }
    } else {
        let h = sign | ((e - 112u32) << 10u32) | (man >> 13u32);
        // A carry into the exponent is the right answer.
        if rounds_up(man, 0x1000u32) {
            out = h + 1u32;
        } else {
            out = h;
        }
    }
    out
}

/// The f32 value of the fp16 bits `h`, as `half`'s `f16::to_f32` (exact).
#[cube]
fn f16_value(h: u32) -> f32 {
    let sign = (h & 0x8000u32) << 16u32;
    let e = (h >> 10u32) & 0x1Fu32;
    let man = h & 0x03FFu32;
    // A normal number, unless the exponent says otherwise below.
    let mut bits = sign | ((e + 112u32) << 23u32) | (man << 13u32);
    if e == 0x1Fu32 {
        let mut quiet = 0u32;
        if man != 0u32 {
            quiet = 0x0040_0000u32;
        }
        bits = sign | 0x7F80_0000u32 | quiet | (man << 13u32);
    } else if e == 0u32 {
        // Zero or subnormal: man · 2^-24, exact in f32 (2^-24's bits).
        let magnitude = f32::cast_from(man) * f32::reinterpret(0x3380_0000u32);
        bits = sign | u32::reinterpret(magnitude);
    }
    f32::reinterpret(bits)
}

/// Half `j` of the packed `words`.
#[cube]
fn half_at(words: &[u32], j: usize) -> u32 {
    (words[j / 2] >> (16u32 * u32::cast_from(j % 2))) & 0xFFFFu32
}

/// `packed` word `w`: halves `2w` and `2w + 1`, each `values[j]` rounded
/// for `j < count`, zero past it. One unit per word.
#[cube(launch_unchecked)]
fn round_kernel(values: &[f32], packed: &mut [u32], count: usize) {
    let w = unit_item(packed.len());
    let mut word = 0u32;
    #[unroll]
    for k in 0..2usize {
        let j = 2 * w + k;
        if j < count {
            word |= f16_bits(values[j]) << (16u32 * u32::cast_from(k));
        }
    }
    packed[w] = word;
}

/// `own` word `w`: halves `2w` and `2w + 1` of this rank's slice of the
/// mean, each the fp32 sum in rank order of the `world` received slices'
/// halves, times `scale[0]`, rounded to fp16. One unit per word.
#[cube(launch_unchecked)]
fn own_mean_kernel(received: &[u32], scale: &[f32], own: &mut [u32], part: usize, world: usize) {
    let w = unit_item(own.len());
    let mut word = 0u32;
    #[unroll]
    for k in 0..2usize {
        let j = 2 * w + k;
        if j < part {
            // The host's `Iterator::sum` starts from -0.0, which adds
            // nothing: the first rank's value is where it starts.
            let mut sum = f16_value(half_at(received, j));
            for r in 1..world {
                sum += f16_value(half_at(received, r * part + j));
            }
            word |= f16_bits(sum * scale[0]) << (16u32 * u32::cast_from(k));
        }
    }
    own[w] = word;
}

/// `values[j]` = the f32 value of half `j` of `packed`. One unit per value.
#[cube(launch_unchecked)]
fn widen_kernel(packed: &[u32], values: &mut [f32]) {
    let j = unit_item(values.len());
    values[j] = f16_value(half_at(packed, j));
}

/// u32 words holding `halves` halves (at least one, so a buffer exists).
fn words(halves: usize) -> usize {
    halves.div_ceil(2).max(1)
}

/// The first `count` f32 of `values` rounded to fp16 in a new buffer of
/// `halves` halves (the rest zero), packed two to a word.
pub fn round_to_f16(client: &Client, values: &Handle, count: usize, halves: usize) -> Handle {
    let packed = client.empty(words(halves) * 4);
    // SAFETY: `values` holds `count` f32 (at least one, the caller's
    // buffer), `packed` `words(halves)` words; the kernel reads `values`
    // only below `count`.
    unsafe {
        launch_units!(
            client,
            words(halves),
            round_kernel(
                buffer(values, count.max(1)),
                buffer(&packed, words(halves)),
                count
            )
        );
    }
    packed
}

/// The first `count` halves of `packed` widened to f32, in a new buffer.
pub fn widen_f16(client: &Client, packed: &Handle, count: usize) -> Handle {
    let values = client.empty(count.max(1) * 4);
    if count > 0 {
        // SAFETY: `packed` holds at least `count` halves (the caller's
        // contract), `values` `count` f32.
        unsafe {
            launch_units!(
                client,
                count,
                widen_kernel(buffer(packed, words(count)), buffer(&values, count))
            );
        }
    }
    values
}

/// This rank's slice of the mean from the `slices.all_halves()` halves
/// `received` in the all-to-all, in a new buffer of `slices.part()` halves.
fn own_mean(client: &Client, received: &Handle, slices: HalfSlices, scale: f32) -> Handle {
    let part = slices.part();
    let own = client.empty(words(part) * 4);
    // SAFETY: `received` holds `words(all_halves)` words and every index
    // read is below `world · part`; `own` holds `words(part)`.
    unsafe {
        launch_units!(
            client,
            words(part),
            own_mean_kernel(
                buffer(received, words(slices.all_halves())),
                f32_arg(client, &[scale]),
                buffer(&own, words(part)),
                part,
                slices.world
            )
        );
    }
    own
}

/// The mean over ranks of the first `slices.count` f32 of `values`,
/// travelling as fp16 (the host's `allreduce_mean_f16`, bit for bit): the
/// values rounded, `exchange(HalfExchange::AllToAll, send, received)`, the
/// owned slice averaged (times `scale`), `exchange(HalfExchange::AllGather,
/// own, gathered)`, the gathered halves widened into a new buffer. The
/// exchange fills its second buffer from its first on every rank and
/// answers `None` when it cannot take these buffers (then nothing more
/// runs) or its error. The same `None` or error is returned.
pub fn mean_f16<E>(
    client: &Client,
    values: &Handle,
    slices: HalfSlices,
    scale: f32,
    mut exchange: impl FnMut(HalfExchange, &Handle, &Handle) -> Option<Result<(), E>>,
) -> Option<Result<Handle, E>> {
    let all = slices.all_halves();
    let send = round_to_f16(client, values, slices.count, all);
    let received = client.empty(words(all) * 4);
    if let Err(e) = exchange(HalfExchange::AllToAll, &send, &received)? {
        return Some(Err(e));
    }
    let own = own_mean(client, &received, slices, scale);
    let gathered = client.empty(words(all) * 4);
    if let Err(e) = exchange(HalfExchange::AllGather, &own, &gathered)? {
        return Some(Err(e));
    }
    Some(Ok(widen_f16(client, &gathered, slices.count)))
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    round_kernel::RoundKernel(b(), b(), ()),
    own_mean_kernel::OwnMeanKernel(b(), b(), b(), (), ()),
    widen_kernel::WidenKernel(b(), b()),
];
