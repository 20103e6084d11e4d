//! What the kernels share at the level of one cube: its number of units,
//! the launch and first step of the one-unit-per-item kernels, the bits of
//! a packed word, and the shared-memory tree reduction that turns one
//! value per unit into a cube's sum or maximum.

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Units per cube, in every kernel here.
pub(crate) const CUBE: usize = 256;

/// Levels of [`reduce_rows`]'s tree: `CUBE` is `2^LEVELS`.
const LEVELS: usize = 8;
const _: () = assert!(CUBE == 1 << LEVELS);

/// Cubes of [`CUBE`] units for `units` units (at least one, so an empty
/// launch still has a valid count).
pub(crate) fn launch_dims(client: &Client, units: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_1d(CUBE as u32);
    (
        cubecl::calculate_cube_count_elemwise(client, units.max(1), dim),
        dim,
    )
}

/// `launch_units!(client, units, kernel(args…))` launches `kernel` with one
/// unit per item for `units` items ([`launch_dims`]). It expands to the
/// unsafe launch, so the caller's `unsafe` block says why its buffers fit.
macro_rules! launch_units {
    ($client:expr, $units:expr, $kernel:ident($($arg:expr),* $(,)?)) => {{
        let (count, dim) = $crate::device::cube::launch_dims($client, $units);
        $kernel::launch_unchecked($client, count, dim, $($arg),*)
    }};
}
pub(crate) use launch_units;

/// The first `len` elements of `handle` as a kernel argument.
///
/// In the kernel, the slice's `len()` is the whole handle's size (cubecl
/// registers a buffer's length from its handle, not from `len`): a kernel
/// that covers only part of a buffer takes its count as an argument.
///
/// # Safety
/// `handle` holds at least `len` elements of the kernel parameter's type.
pub(crate) unsafe fn buffer(handle: &Handle, len: usize) -> BufferArg {
    // SAFETY: the caller's contract above.
    unsafe { BufferArg::from_raw_parts(handle.clone(), len) }
}

/// Panics naming the first of `buffers` (name, handle, count) that holds
/// fewer f32 than its count: the check before an unchecked launch.
pub(crate) fn check_lengths(buffers: &[(&str, &Handle, usize)]) {
    for &(what, handle, len) in buffers {
        assert!(
            handle.size_in_used() >= (len * size_of::<f32>()) as u64,
            "{what}: fewer than {len} f32"
        );
    }
}

/// This unit's item in a launch of one unit per item ([`launch_dims`]):
/// the units past the last of `len` items terminate here.
#[cube]
pub(crate) fn unit_item(len: usize) -> usize {
    let i = ABSOLUTE_POS;
    if i >= len {
        terminate!();
    }
    i
}

/// Whether bit `b` of the packed `word` is set.
#[cube]
pub(crate) fn bit(word: u32, b: usize) -> bool {
    (word >> u32::cast_from(b)) & 1u32 == 1u32
}

/// Reduces `rows` rows of [`CUBE`] values in `shared` (row `k` at
/// `k·CUBE`, each unit's value at its own index within the row) to their
/// sums, or with `max` their maxima, left at `shared[k·CUBE]`. Every unit
/// of the cube must call it, after writing its values.
///
/// The order is fixed, and every kernel's partials depend on it: at each
/// level the first `stride` units (128, 64, …, 1) fold `shared[u + stride]`
/// into `shared[u]`, with a barrier between levels. Rows reduced together
/// are folded exactly as each would be alone.
#[cube]
pub(crate) fn reduce_rows(
    shared: &mut Shared<[f32]>,
    #[comptime] rows: usize,
    #[comptime] max: bool,
) {
    let unit = UNIT_POS as usize;
    sync_cube();
    #[unroll]
    for level in 1..comptime!(LEVELS + 1) {
        let stride = comptime!(CUBE >> level);
        if unit < stride {
            #[unroll]
            for k in 0..rows {
                let (a, b) = (shared[k * CUBE + unit], shared[k * CUBE + unit + stride]);
                if max {
                    shared[k * CUBE + unit] = f32::max(a, b);
                } else {
                    shared[k * CUBE + unit] = a + b;
                }
            }
        }
        sync_cube();
    }
}

/// The sum (or with `max`, maximum) of `value` over each segment of
/// `width` consecutive units (a power of two up to [`CUBE`]), every unit
/// getting its segment's; every unit of the cube must call. The order is
/// [`reduce_rows`]'s within the segment: strides `width/2`, …, 1. A row of
/// at most `width` values reduced here gives the bits [`cube_reduce`] gives
/// it with the other units holding the identity (0, or the lowest float),
/// whose folds leave each value as it is (0 + x = x up to the sign of a
/// zero; max(x, lowest) = x).
#[cube]
pub(crate) fn segment_reduce(value: f32, #[comptime] width: usize, #[comptime] max: bool) -> f32 {
    let mut shared = Shared::<[f32]>::new_slice(CUBE);
    let unit = UNIT_POS as usize;
    let lane = unit % width;
    shared[unit] = value;
    sync_cube();
    let levels = comptime!(width.trailing_zeros() as usize);
    #[unroll]
    for level in 1..comptime!(levels + 1) {
        let stride = comptime!(width >> level);
        if lane < stride {
            let (a, b) = (shared[unit], shared[unit + stride]);
            if max {
                shared[unit] = f32::max(a, b);
            } else {
                shared[unit] = a + b;
            }
        }
        sync_cube();
    }
    shared[unit - lane]
}

/// The cube's sum (or with `max`, maximum) of each unit's `value`, in
/// [`reduce_rows`]'s order; every unit gets it, and every unit must call.
#[cube]
pub(crate) fn cube_reduce(value: f32, #[comptime] max: bool) -> f32 {
    let mut shared = Shared::<[f32]>::new_slice(CUBE);
    shared[UNIT_POS as usize] = value;
    reduce_rows(&mut shared, 1usize, max);
    shared[0]
}
