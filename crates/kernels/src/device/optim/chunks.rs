//! The chunk table every optimizer kernel walks: on the host, on the
//! device as the kernels' one [`ChunkTable`] argument, and the
//! [`launch_chunks!`] that passes it. Also the per-step moment
//! coefficients, and Adam's moments, direction and denominator as cube
//! functions the kernels share, so each formula is written once.

use cubecl::prelude::*;
use cubecl::server::Handle;

pub(crate) use crate::device::cube::CUBE;
use crate::device::cube::{launch_dims, reduce_rows};

/// Elements per chunk: a cube's 256 units × 16 elements.
pub const DEVICE_CHUNK: usize = 16 * CUBE;

// Indices into the coefficient buffer of the moment kernels.
pub(crate) const BETA_1: usize = 0;
pub(crate) const BETA_2: usize = 1;
pub(crate) const ONE_MINUS_BETA_1: usize = 2;
pub(crate) const ONE_MINUS_BETA_2: usize = 3;
pub(crate) const INV_BIAS_1: usize = 4;
pub(crate) const INV_BIAS_2: usize = 5;
pub(crate) const EPS: usize = 6;
pub(crate) const GRAD_SCALE: usize = 7;
pub(crate) const LR: usize = 8;
pub(crate) const COEFFICIENTS: usize = 9;

/// Adam's per-step constants, as f32 (terse-optim's `Moments`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentCoefficients {
    /// β1.
    pub beta_1: f32,
    /// β2.
    pub beta_2: f32,
    /// 1 − β1, computed in f64 and rounded once.
    pub one_minus_beta_1: f32,
    /// 1 − β2, the same.
    pub one_minus_beta_2: f32,
    /// 1 / (1 − β1^t), or 1 without bias correction.
    pub inv_bias_1: f32,
    /// 1 / (1 − β2^t) (of the freeze step for a frozen variance), or 1.
    pub inv_bias_2: f32,
    /// ε.
    pub eps: f32,
    /// Multiplies the gradient before it enters the moments.
    pub grad_scale: f32,
}

impl MomentCoefficients {
    pub(crate) fn buffer(&self, lr: f32) -> [f32; COEFFICIENTS] {
        let mut c = [0.0; COEFFICIENTS];
        c[BETA_1] = self.beta_1;
        c[BETA_2] = self.beta_2;
        c[ONE_MINUS_BETA_1] = self.one_minus_beta_1;
        c[ONE_MINUS_BETA_2] = self.one_minus_beta_2;
        c[INV_BIAS_1] = self.inv_bias_1;
        c[INV_BIAS_2] = self.inv_bias_2;
        c[EPS] = self.eps;
        c[GRAD_SCALE] = self.grad_scale;
        c[LR] = lr;
        c
    }
}

/// A flat buffer's segments cut into chunks of at most [`DEVICE_CHUNK`]
/// elements, uploaded once per layout, with each segment's weight decay.
#[derive(Clone)]
pub struct DeviceChunks {
    pub(crate) starts: Handle,
    pub(crate) ends: Handle,
    pub(crate) segment_of: Handle,
    pub(crate) weight_decay: Handle,
    /// Per segment, its first chunk, and the chunk count after the last
    /// (segments + 1 entries): a segment's chunks are consecutive.
    pub(crate) first_chunk: Handle,
    /// Per chunk: (segment, start, end), kept on the host to combine partials.
    pub(crate) table: Vec<(usize, usize, usize)>,
    pub(crate) segments: usize,
    pub(crate) len: usize,
}

impl DeviceChunks {
    /// Chunks for consecutive segments of `lens` elements, segment `s`
    /// decaying its weights by `weight_decay[s]`.
    ///
    /// # Panics
    /// If the lengths and decays differ in number, or the buffer has 2^32
    /// elements or more (indices are u32 on the device).
    pub fn new(client: &Client, lens: &[usize], weight_decay: &[f32]) -> Self {
        assert_eq!(
            lens.len(),
            weight_decay.len(),
            "one weight decay per segment"
        );
        let len: usize = lens.iter().sum();
        assert!(
            u32::try_from(len).is_ok(),
            "{len} elements: indices are u32"
        );
        let mut table = Vec::new();
        let mut offset = 0;
        for (s, &n) in lens.iter().enumerate() {
            let mut start = offset;
            while start < offset + n {
                let end = (start + DEVICE_CHUNK).min(offset + n);
                table.push((s, start, end));
                start = end;
            }
            offset += n;
        }
        let column = |f: fn(&(usize, usize, usize)) -> usize| -> Vec<u32> {
            // Padded to one entry: a zero-sized buffer cannot be bound.
            let mut v: Vec<u32> = table.iter().map(|e| f(e) as u32).collect();
            v.push(0);
            v
        };
        let mut decays = weight_decay.to_vec();
        decays.push(0.0);
        let mut first_chunk = vec![0u32; lens.len() + 1];
        for &(s, _, _) in &table {
            first_chunk[s + 1] += 1;
        }
        for s in 0..lens.len() {
            first_chunk[s + 1] += first_chunk[s];
        }
        Self {
            starts: client.create_from_slice(u32::as_bytes(&column(|e| e.1))),
            ends: client.create_from_slice(u32::as_bytes(&column(|e| e.2))),
            segment_of: client.create_from_slice(u32::as_bytes(&column(|e| e.0))),
            weight_decay: client.create_from_slice(f32::as_bytes(&decays)),
            first_chunk: client.create_from_slice(u32::as_bytes(&first_chunk)),
            table,
            segments: lens.len(),
            len,
        }
    }

    /// Number of chunks.
    pub fn count(&self) -> usize {
        self.table.len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sums per-chunk partials per segment in f64, in chunk order.
    pub fn per_segment(&self, partials: &[f32]) -> Vec<f64> {
        let mut sums = vec![0.0f64; self.segments];
        for (&(s, _, _), &p) in self.table.iter().zip(partials) {
            sums[s] += f64::from(p);
        }
        sums
    }

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.segments
    }

    /// The moment coefficients with rate `lr` as a kernel argument.
    pub(crate) fn coefficients(
        &self,
        client: &Client,
        coefficients: &MomentCoefficients,
        lr: f32,
    ) -> BufferArg {
        f32_arg(client, &coefficients.buffer(lr))
    }

    /// The launch of a kernel with one cube per segment that totals the
    /// chunks' partials there ([`segment_reduce`]), and each segment's
    /// first chunk as its argument.
    pub(crate) fn segment_launch(&self, client: &Client) -> ((CubeCount, CubeDim), BufferArg) {
        let n = self.segments + 1;
        // SAFETY: `first_chunk` was created with one entry per segment plus one.
        let first_chunk = unsafe { BufferArg::from_raw_parts(self.first_chunk.clone(), n) };
        (launch_dims(client, self.segments * CUBE), first_chunk)
    }

    /// A new buffer of `per_chunk` f32 per chunk for a kernel's partials:
    /// the handle to read them back from, and the kernel argument.
    pub(crate) fn partials(&self, client: &Client, per_chunk: usize) -> (Handle, BufferArg) {
        let len = per_chunk * self.count();
        let handle = client.empty(len * size_of::<f32>());
        // SAFETY: the buffer was created with `len` f32.
        let arg = unsafe { BufferArg::from_raw_parts(handle.clone(), len) };
        (handle, arg)
    }

    /// One cube per chunk.
    pub(crate) fn launch(&self, client: &Client) -> (CubeCount, CubeDim) {
        launch_dims(client, self.count() * CUBE)
    }

    /// A flat buffer of [`DeviceChunks::len`] f32 as a kernel argument.
    ///
    /// The caller's contract, as for every launcher here: `handle` holds
    /// `len()` f32 (terse-optim checks its buffers against its layout, of
    /// which this table was made).
    pub(crate) fn flat(&self, handle: &Handle) -> BufferArg {
        // SAFETY: the length is the caller's contract above; the kernels
        // bound every access by the table's chunk ends, all at most `len`.
        unsafe { BufferArg::from_raw_parts(handle.clone(), self.len) }
    }

    /// The table as the kernels' [`ChunkTable`] argument.
    pub(crate) fn table(&self) -> ChunkTableLaunch {
        let n = self.count() + 1;
        // SAFETY (of the launches using them): each table buffer was
        // created with `count() + 1` entries, the decays with one per
        // segment plus one.
        unsafe {
            ChunkTableLaunch::new(
                BufferArg::from_raw_parts(self.starts.clone(), n),
                BufferArg::from_raw_parts(self.ends.clone(), n),
                BufferArg::from_raw_parts(self.segment_of.clone(), n),
                BufferArg::from_raw_parts(self.weight_decay.clone(), self.segments + 1),
            )
        }
    }
}

impl std::fmt::Debug for DeviceChunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceChunks({} elements, {} segments, {} chunks)",
            self.len,
            self.segments,
            self.count()
        )
    }
}

/// `launch_chunks!(client, chunks, kernel([flat, …], args…))` launches the
/// chunk kernel `kernel` over `chunks`, one cube per chunk, with the flat
/// buffers (each [`DeviceChunks::flat`]), then the chunk table, then `args`:
/// the order of every chunk kernel's parameters. It expands to the unsafe
/// launch, so the caller's `unsafe` block says why its buffers fit.
macro_rules! launch_chunks {
    ($client:expr, $chunks:expr, $kernel:ident([$($flat:expr),*] $(, $arg:expr)* $(,)?)) => {{
        let (count, dim) = $chunks.launch($client);
        $kernel::launch_unchecked(
            $client,
            count,
            dim,
            $($chunks.flat($flat),)*
            $chunks.table(),
            $($arg),*
        )
    }};
}
pub(crate) use launch_chunks;

/// [`DeviceChunks`] on the device: the one argument through which every
/// kernel launched over the chunks (one cube per chunk) finds its chunk,
/// its segment and the segment's weight decay. Each column has one padding
/// entry past the last chunk (a zero-sized buffer cannot be bound).
#[derive(CubeLaunch, CubeType)]
pub(crate) struct ChunkTable {
    starts: Box<[u32]>,
    ends: Box<[u32]>,
    segment_of: Box<[u32]>,
    weight_decay: Box<[f32]>,
}

#[cfg(test)]
impl ChunkTable {
    /// What a launch registers for the table (four buffers, none aliased),
    /// for building kernels without a device ([`crate::device::cuda_source`]).
    pub(crate) fn compilation_arg() -> ChunkTableCompilationArg {
        let b = crate::device::cuda_source::buffer;
        ChunkTableCompilationArg {
            starts: b(),
            ends: b(),
            segment_of: b(),
            weight_decay: b(),
        }
    }
}

#[cube]
impl ChunkTable {
    /// This unit's first element of its cube's chunk, and the chunk's end:
    /// the unit walks `first, first + CUBE, …` below `end`. A cube past the
    /// last chunk (the padding entry, or past it where the launch rounds
    /// the cube count up) terminates here.
    pub(crate) fn range(&self) -> (usize, usize) {
        let chunk = CUBE_POS;
        if chunk + 1 >= self.starts.len() {
            terminate!();
        }
        let end = usize::cast_from(self.ends[chunk]);
        (
            usize::cast_from(self.starts[chunk]) + UNIT_POS as usize,
            end,
        )
    }

    /// The segment of this cube's chunk.
    pub(crate) fn segment(&self) -> usize {
        usize::cast_from(self.segment_of[CUBE_POS])
    }

    /// The weight decay of this cube's segment.
    pub(crate) fn weight_decay(&self) -> f32 {
        self.weight_decay[self.segment()]
    }
}

/// Adam's first moment `β1·m + (1-β1)·g`.
#[cube]
pub(crate) fn first_moment(m: f32, g: f32, c: &[f32]) -> f32 {
    c[BETA_1] * m + c[ONE_MINUS_BETA_1] * g
}

/// Adam's second moment `β2·v + (1-β2)·g²`.
#[cube]
pub(crate) fn second_moment(v: f32, g: f32, c: &[f32]) -> f32 {
    c[BETA_2] * v + c[ONE_MINUS_BETA_2] * g * g
}

/// Both moments of element `i` updated in place from the gradient `g`;
/// returns the new `(m, v)`.
#[cube]
pub(crate) fn update_moments(
    m: &mut [f32],
    v: &mut [f32],
    i: usize,
    g: f32,
    c: &[f32],
) -> (f32, f32) {
    let mi = first_moment(m[i], g, c);
    let vi = second_moment(v[i], g, c);
    m[i] = mi;
    v[i] = vi;
    (mi, vi)
}

/// Adam's direction `m̂/(sqrt(v̂)+ε) + wd·x` (or `m̂/sqrt(v̂+ε)` inside).
#[cube]
pub(crate) fn direction(
    m: f32,
    v: f32,
    x: f32,
    wd: f32,
    c: &[f32],
    #[comptime] inside: bool,
) -> f32 {
    let m_hat = m * c[INV_BIAS_1];
    let v_hat = v * c[INV_BIAS_2];
    let mut denom = f32::sqrt(v_hat) + c[EPS];
    if inside {
        denom = f32::sqrt(v_hat + c[EPS]);
    }
    m_hat / denom + wd * x
}

/// Adam's denominator for a variance `v` (bias-corrected here).
#[cube]
pub(crate) fn denominator(v: f32, c: &[f32], #[comptime] inside: bool) -> f32 {
    let v_hat = v * c[INV_BIAS_2];
    let mut d = f32::sqrt(v_hat) + c[EPS];
    if inside {
        d = f32::sqrt(v_hat + c[EPS]);
    }
    d
}

/// One f32 per flag, 1 for true and 0 for false, as a kernel argument.
pub(crate) fn flags_arg(client: &Client, flags: &[bool]) -> BufferArg {
    let values: Vec<f32> = flags.iter().map(|&f| f32::from(u8::from(f))).collect();
    f32_arg(client, &values)
}

/// In a kernel launched by [`DeviceChunks::segment_launch`]: this cube's
/// segment, returned, and the totals (with `max`, the maxima) over its
/// chunks of `rows` partials per chunk (chunk `c`'s `k`-th at
/// `rows·c + k`) left at `shared[k·CUBE]`; each unit folds its strided
/// share in chunk order from 0 (the maxima are of non-negative values),
/// then [`reduce_rows`]' tree, so the bits are the same every run. A cube
/// past the last segment terminates.
#[cube]
pub(crate) fn segment_reduce(
    partials: &[f32],
    first_chunk: &[u32],
    shared: &mut Shared<[f32]>,
    #[comptime] rows: usize,
    #[comptime] max: bool,
) -> usize {
    let segment = CUBE_POS;
    if segment + 1 >= first_chunk.len() {
        terminate!();
    }
    let end = usize::cast_from(first_chunk[segment + 1]);
    let mut chunk = usize::cast_from(first_chunk[segment]) + UNIT_POS as usize;
    let unit = UNIT_POS as usize;
    #[unroll]
    for k in 0..rows {
        shared[k * CUBE + unit] = 0.0;
    }
    while chunk < end {
        #[unroll]
        for k in 0..rows {
            let value = partials[rows * chunk + k];
            if max {
                shared[k * CUBE + unit] = f32::max(shared[k * CUBE + unit], value);
            } else {
                shared[k * CUBE + unit] += value;
            }
        }
        chunk += CUBE;
    }
    reduce_rows(shared, rows, max);
    segment
}

/// `values` in a new device buffer, as a kernel argument.
pub(crate) fn f32_arg(client: &Client, values: &[f32]) -> BufferArg {
    let handle = client.create_from_slice(f32::as_bytes(values));
    // SAFETY: the buffer was created with `values.len()` f32.
    unsafe { BufferArg::from_raw_parts(handle, values.len()) }
}
