//! 2-D convolution (NCHW, one group, no dilation, square stride and
//! padding) forward and backward on slices: the output as im2col + one
//! gemm per image; the input gradient of a stride-1 square kernel as the
//! convolution of the output gradient with the flipped, transposed kernel
//! (the same columns and gemm; ResNet-20's input gradients 48 → 41 ms per
//! step), of others as one gemm per image and col2im; the weight gradient
//! as one gemm per block of images over their rows (the transposed
//! columns).
//!
//! burn 0.22 differentiates flex's convolution through burn's generic
//! backward: the input gradient as a transposed convolution (a scalar loop
//! on flex) and the weight gradient as a convolution of the input with the
//! output gradient as its kernel (an im2col whose columns span the whole
//! batch). Both were most of ResNet-20's training step. Here each image's
//! columns are built once per pass into a buffer the task reuses, and
//! every product is one gemm over the image's output positions.
//!
//! The weight gradient sums over output positions, which im2col's columns
//! store contiguously: gemm then transposed all of them into its packing
//! for every image, and at ResNet's 16 channels that packing cost more than
//! the products (ResNet-20's weight gradients 134 → 58 ms per step with
//! rows, 2 threads). Rows put the summed axis across, as gemm reads it.
//!
//! Images run in parallel; the weight gradient is summed per fixed block of
//! images and the blocks' partials added in block order, so the bits do not
//! depend on the thread count.

use rayon::prelude::*;

mod columns;
mod rows;

use columns::{col2im, im2col};
use rows::{im2row, weight_order};

use super::gemm_linear::{ONE_THREAD, strided_gemm};
use super::rows::add_in_block_order;

/// Images per parallel task of the backward pass (its weight-gradient
/// partials are per task: fixed blocks keep the sum's order fixed).
const IMAGES_PER_TASK: usize = 4;

/// The shapes of one convolution: input `[batch, c_in, h, w]`, weight
/// `[c_out, c_in, kh, kw]`, the same stride and zero padding on both axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    /// Images.
    pub batch: usize,
    /// Input channels.
    pub c_in: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Stride on both axes.
    pub stride: usize,
    /// Zero padding on each side of both axes.
    pub pad: usize,
}

impl ConvShape {
    /// Output height (panics when the kernel does not fit the padded input).
    pub fn out_h(&self) -> usize {
        out_len(self.h, self.kh, self.stride, self.pad)
    }

    /// Output width.
    pub fn out_w(&self) -> usize {
        out_len(self.w, self.kw, self.stride, self.pad)
    }

    /// Rows of an image's columns: `c_in·kh·kw`.
    fn k(&self) -> usize {
        self.c_in * self.kh * self.kw
    }

    /// Output positions per image (columns of the im2col matrix).
    fn positions(&self) -> usize {
        self.out_h() * self.out_w()
    }

    fn image_len(&self) -> usize {
        self.c_in * self.h * self.w
    }

    /// For a stride-1 convolution with a square kernel, the convolution
    /// whose output is this one's input gradient: over the output
    /// gradient (`c_out` channels, `out_h × out_w`) with the kernel
    /// flipped and transposed ([`flipped_transposed`]) and padding
    /// `kh − 1 − pad`, which gives back `h × w`. `None` for other strides,
    /// non-square kernels, padding wider than `kh − 1`, pointwise
    /// convolutions (whose input gradient is already one gemm), and fewer
    /// than 16 input channels: that convolution's gemm has `c_in` columns,
    /// and at VGG's 3-channel first layer gemm + col2im took 0.83 ms
    /// against its 1.78 (ResNet's 16 channels: 3.3 against 2.5 ms).
    fn transposed(&self) -> Option<ConvShape> {
        let fits = self.stride == 1 && self.kh == self.kw && self.pad < self.kh;
        (fits && !self.pointwise() && self.c_in >= 16).then(|| ConvShape {
            batch: self.batch,
            c_in: self.c_out,
            h: self.out_h(),
            w: self.out_w(),
            c_out: self.c_in,
            kh: self.kh,
            kw: self.kw,
            stride: 1,
            pad: self.kh - 1 - self.pad,
        })
    }

    /// A 1×1, stride-1, unpadded convolution: an image is its own columns.
    fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride == 1 && self.pad == 0
    }
}

fn out_len(len: usize, kernel: usize, stride: usize, pad: usize) -> usize {
    assert!(stride > 0, "convolution stride 0");
    assert!(
        len + 2 * pad >= kernel,
        "a {kernel}-wide kernel does not fit {len} + 2·{pad} padding"
    );
    (len + 2 * pad - kernel) / stride + 1
}

fn check_lengths(x: &[f32], weight: &[f32], s: &ConvShape) {
    assert_eq!(
        x.len(),
        s.batch * s.image_len(),
        "conv2d input is not {s:?}"
    );
    assert_eq!(weight.len(), s.c_out * s.k(), "conv2d weight is not {s:?}");
}

/// `dst[m, n] = A[m, k]·B[k, n]` on one thread (the images are the
/// parallel level), all three column-major: each the transpose of the
/// row-major buffer as stored (`dst` `[n, m]`, `A` `[k, m]`, `B` `[n, k]`),
/// which puts the long dimension (positions, or a block's `c_in·kh·kw`) in
/// gemm's `m`.
///
/// # Safety
/// The pointers must cover those buffers, and `dst` must not overlap the
/// other two.
unsafe fn column_major_gemm(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    a: *const f32,
    b: *const f32,
) {
    let (m_stride, k_stride) = (m as isize, k as isize);
    // SAFETY: the caller's contract.
    unsafe {
        strided_gemm(
            (m, n, k),
            (dst, (1, m_stride)),
            false,
            (a, (1, m_stride)),
            (b, (1, k_stride)),
            ONE_THREAD,
        );
    }
}

/// `conv2d(x, weight)`, `[batch, c_out, out_h, out_w]`.
pub fn conv2d_forward(x: &[f32], weight: &[f32], s: &ConvShape) -> Vec<f32> {
    check_lengths(x, weight, s);
    let (k, p) = (s.k(), s.positions());
    let len = s.batch * s.c_out * p;
    if len == 0 || k == 0 {
        return vec![0.0f32; len];
    }
    // gemm writes every output value without reading it: no zeroing pass.
    let mut out = Vec::<f32>::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(s.c_out * p)
        .enumerate()
        .for_each_init(
            || vec![0.0f32; if s.pointwise() { 0 } else { k * p }],
            |cols, (b, out)| {
                let image = &x[b * s.image_len()..][..s.image_len()];
                let cols: &[f32] = if s.pointwise() {
                    image
                } else {
                    crate::with_avx(|| im2col(image, s, cols));
                    cols
                };
                // outᵀ[p, c_out] = colsᵀ[p, k]·Wᵀ[k, c_out]: the output
                // positions are gemm's long dimension.
                // SAFETY: cols is [k, p], weight [c_out, k], out [c_out, p].
                unsafe {
                    column_major_gemm(
                        (p, s.c_out, k),
                        out.as_mut_ptr().cast::<f32>(),
                        cols.as_ptr(),
                        weight.as_ptr(),
                    );
                }
            },
        );
    // SAFETY: the gemm calls above wrote all `len` values.
    unsafe { out.set_len(len) };
    out
}

/// `weight` (`[c_out, c_in, kh, kw]`) as the kernel of
/// [`ConvShape::transposed`]: `[c_in, c_out, kh, kw]`, each tap flipped on
/// both axes.
fn flipped_transposed(weight: &[f32], s: &ConvShape) -> Vec<f32> {
    let taps = s.kh * s.kw;
    let mut out = vec![0.0f32; weight.len()];
    for co in 0..s.c_out {
        for ci in 0..s.c_in {
            let from = &weight[(co * s.c_in + ci) * taps..][..taps];
            let to = &mut out[(ci * s.c_out + co) * taps..][..taps];
            for (t, v) in to.iter_mut().zip(from.iter().rev()) {
                *t = *v;
            }
        }
    }
    out
}

/// A backward task's buffers (see [`conv2d_backward`]).
struct Scratch {
    /// The image transposed to `[h, w, c_in]`.
    hwc: Vec<f32>,
    /// The block's rows, `[images·positions, k]`.
    rows: Vec<f32>,
    /// The block's output gradient, `[c_out, images·positions]`.
    g_block: Vec<f32>,
    /// One image's column gradient, `[k, positions]`.
    dcols: Vec<f32>,
}

impl Scratch {
    /// Sized for `job`'s blocks (empty where the job does not use one).
    fn new(job: &BackwardJob<'_>, want_x: bool) -> Self {
        let s = job.s;
        let (k, p) = (s.k(), s.positions());
        let block_positions = IMAGES_PER_TASK.min(s.batch) * p;
        let by_rows = |len: usize| vec![0.0f32; if job.by_rows { len } else { 0 }];
        Self {
            hwc: by_rows(s.image_len()),
            rows: by_rows(block_positions * k),
            g_block: by_rows(s.c_out * block_positions),
            dcols: vec![0.0f32; if s.pointwise() || !want_x { 0 } else { k * p }],
        }
    }
}

/// What every block task of [`conv2d_backward`] reads.
struct BackwardJob<'a> {
    x: &'a [f32],
    weight: &'a [f32],
    grad: &'a [f32],
    s: &'a ConvShape,
    want_weight: bool,
    /// ∂W from the block's rows at once (any but a pointwise convolution).
    by_rows: bool,
}

impl BackwardJob<'_> {
    /// One block of images: their ∂x into `dx_block` (when asked for) and
    /// the block's ∂W partial, returned (empty when not asked for).
    fn block(
        &self,
        scratch: &mut Scratch,
        block: usize,
        mut dx_block: Option<&mut [f32]>,
    ) -> Vec<f32> {
        let BackwardJob {
            x,
            weight,
            grad,
            s,
            want_weight,
            by_rows,
        } = *self;
        let (k, p, image) = (s.k(), s.positions(), s.image_len());
        let Scratch {
            hwc,
            rows,
            g_block,
            dcols,
        } = scratch;
        let first = block * IMAGES_PER_TASK;
        let images = first..(first + IMAGES_PER_TASK).min(s.batch);
        let n = images.len() * p;
        let (rows, g_block) = if by_rows {
            (&mut rows[..n * k], &mut g_block[..s.c_out * n])
        } else {
            (&mut rows[..0], &mut g_block[..0])
        };
        let mut dw = vec![0.0f32; if want_weight { s.c_out * k } else { 0 }];
        for (local, b) in images.clone().enumerate() {
            let g = &grad[b * s.c_out * p..][..s.c_out * p];
            let x_b = &x[b * image..][..image];
            if by_rows {
                crate::with_avx(|| im2row(x_b, s, hwc, &mut rows[local * p * k..][..p * k]));
                for (from, to) in g.chunks_exact(p).zip(g_block.chunks_exact_mut(n)) {
                    to[local * p..][..p].copy_from_slice(from);
                }
            } else if want_weight && p > 0 {
                // ∂W[c_out, c_in] += g[c_out, p]·xᵀ[p, c_in]
                // SAFETY: g is [c_out, p], x_b [c_in, p], dw [c_out, c_in].
                unsafe {
                    strided_gemm(
                        (s.c_out, k, p),
                        (dw.as_mut_ptr(), (k as isize, 1)),
                        true,
                        (g.as_ptr(), (p as isize, 1)),
                        (x_b.as_ptr(), (1, p as isize)),
                        ONE_THREAD,
                    );
                }
            }
            if let Some(dx_block) = dx_block.as_deref_mut() {
                let dx_b = &mut dx_block[(b - first) * image..][..image];
                if p == 0 || s.c_out == 0 {
                    continue;
                }
                // ∂colsᵀ[p, k] = gᵀ[p, c_out]·W[c_out, k]; a pointwise
                // convolution's columns are the image gradient itself.
                let target: &mut [f32] = if s.pointwise() { dx_b } else { dcols };
                // SAFETY: g is [c_out, p], weight [c_out, k], target [k, p].
                unsafe {
                    strided_gemm(
                        (p, k, s.c_out),
                        (target.as_mut_ptr(), (1, p as isize)),
                        false,
                        (g.as_ptr(), (1, p as isize)),
                        (weight.as_ptr(), (k as isize, 1)),
                        ONE_THREAD,
                    );
                }
                if !s.pointwise() {
                    crate::with_avx(|| col2im(dcols, s, dx_b));
                }
            }
        }
        if by_rows {
            // ∂Wᵀ[k, c_out] = rowsᵀ[k, n]·g_blockᵀ[n, c_out] over the
            // block's positions: the rows are gemm's left operand as
            // stored (k contiguous), where im2col's columns had to be
            // transposed into its packing for every image, which cost
            // more than the products at ResNet's 16 channels.
            // SAFETY: rows is [n, k], g_block [c_out, n], dw [c_out, k].
            unsafe {
                column_major_gemm(
                    (k, s.c_out, n),
                    dw.as_mut_ptr(),
                    rows.as_ptr(),
                    g_block.as_ptr(),
                );
            }
        }
        dw
    }
}

/// The gradients of [`conv2d_forward`] for the output gradient `grad`:
/// `∂x` (when `want_x`) and `∂weight` (when `want_weight`).
pub fn conv2d_backward(
    x: &[f32],
    weight: &[f32],
    grad: &[f32],
    s: &ConvShape,
    (want_x, want_weight): (bool, bool),
) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    check_lengths(x, weight, s);
    let (k, p, image) = (s.k(), s.positions(), s.image_len());
    assert_eq!(grad.len(), s.batch * s.c_out * p, "conv2d gradient");
    if want_x && let Some(transposed) = s.transposed() {
        // ∂x as a convolution of the output gradient: columns built like
        // the forward's and no col2im scatter (the pass below takes ∂W).
        let flipped = flipped_transposed(weight, s);
        let dx = conv2d_forward(grad, &flipped, &transposed);
        let dw = want_weight.then(|| {
            let (_, dw) = conv2d_backward(x, weight, grad, s, (false, true));
            dw.expect("asked for")
        });
        return (Some(dx), dw);
    }
    let mut dx = want_x.then(|| vec![0.0f32; x.len()]);
    // One task per block of images: its images' ∂x and its ∂W partial.
    let mut dx_blocks: Vec<Option<&mut [f32]>> = match dx.as_mut() {
        Some(dx) => dx
            .chunks_mut(IMAGES_PER_TASK * image.max(1))
            .map(Some)
            .collect(),
        None => (0..s.batch.div_ceil(IMAGES_PER_TASK))
            .map(|_| None)
            .collect(),
    };
    dx_blocks.resize_with(s.batch.div_ceil(IMAGES_PER_TASK), || None);
    let job = BackwardJob {
        x,
        weight,
        grad,
        s,
        want_weight,
        // A pointwise convolution's ∂W is one gemm per image on the image
        // itself; any other takes a block's rows at once.
        by_rows: want_weight && !s.pointwise() && p > 0,
    };
    let partials: Vec<Vec<f32>> = dx_blocks
        .into_par_iter()
        .enumerate()
        .map_init(
            // Written whole before every read (the gemm overwrites dcols),
            // so one set per thread serves all its tasks unzeroed.
            || Scratch::new(&job, want_x),
            |scratch, (block, dx_block)| job.block(scratch, block, dx_block),
        )
        .collect();
    let dw = want_weight.then(|| {
        let dw = add_in_block_order(&partials, s.c_out * k);
        // The rows' order of k, once for the sum (a permutation: the same
        // bits as permuting every partial).
        if job.by_rows {
            weight_order(&dw, s)
        } else {
            dw
        }
    });
    (dx, dw)
}

/// One image and one output channel for the column and row tests of this
/// module's files: `(c_in, h, w, kh, kw, stride, pad)` covering strides
/// 1–3, paddings 0–2, 1×1 to 5×5 and non-square kernels.
#[cfg(test)]
fn one_image_shapes() -> impl Iterator<Item = ConvShape> {
    [
        (2, 5, 6, 3, 3, 1, 1),
        (3, 7, 7, 3, 3, 2, 1),
        (1, 4, 5, 2, 3, 3, 2),
        (2, 6, 5, 5, 5, 1, 2),
        (3, 4, 6, 1, 3, 1, 1),
        (4, 3, 3, 1, 1, 1, 0),
    ]
    .into_iter()
    .map(|(c_in, h, w, kh, kw, stride, pad)| ConvShape {
        batch: 1,
        c_in,
        h,
        w,
        c_out: 1,
        kh,
        kw,
        stride,
        pad,
    })
}

/// Deterministic values in [-1, 1) for the tests of this module's files.
#[cfg(test)]
fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct definition of the convolution, in f64.
    fn direct(x: &[f32], w: &[f32], s: &ConvShape) -> Vec<f64> {
        let (oh_n, ow_n) = (s.out_h(), s.out_w());
        let mut out = vec![0.0f64; s.batch * s.c_out * oh_n * ow_n];
        for b in 0..s.batch {
            for co in 0..s.c_out {
                for oh in 0..oh_n {
                    for ow in 0..ow_n {
                        let mut acc = 0.0f64;
                        for c in 0..s.c_in {
                            for i in 0..s.kh {
                                for j in 0..s.kw {
                                    let ih = (oh * s.stride + i) as isize - s.pad as isize;
                                    let iw = (ow * s.stride + j) as isize - s.pad as isize;
                                    if ih < 0 || iw < 0 || ih >= s.h as isize || iw >= s.w as isize
                                    {
                                        continue;
                                    }
                                    let xv = x[((b * s.c_in + c) * s.h + ih as usize) * s.w
                                        + iw as usize];
                                    let wv = w[((co * s.c_in + c) * s.kh + i) * s.kw + j];
                                    acc += f64::from(xv) * f64::from(wv);
                                }
                            }
                        }
                        out[((b * s.c_out + co) * oh_n + oh) * ow_n + ow] = acc;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn forward_matches_the_definition_for_strides_paddings_and_odd_sizes() {
        for (c_in, h, w, c_out, kh, kw, stride, pad) in [
            (3, 7, 5, 4, 3, 3, 1, 1),
            (2, 8, 9, 3, 3, 3, 2, 1),
            (5, 6, 6, 2, 1, 1, 1, 0),
            (4, 7, 7, 3, 1, 1, 2, 0),
            (1, 5, 4, 2, 3, 2, 3, 2),
            (2, 3, 3, 1, 3, 3, 1, 0),
            (2, 6, 7, 3, 5, 5, 1, 2),
            (3, 4, 6, 2, 1, 3, 1, 1),
        ] {
            let s = ConvShape {
                batch: 5,
                c_in,
                h,
                w,
                c_out,
                kh,
                kw,
                stride,
                pad,
            };
            let x = pseudo_random(s.batch * s.image_len(), 1);
            let wt = pseudo_random(c_out * s.k(), 2);
            let got = conv2d_forward(&x, &wt, &s);
            let want = direct(&x, &wt, &s);
            for (g, w) in got.iter().zip(&want) {
                assert!((f64::from(*g) - w).abs() < 1e-5, "{s:?}: {g} against {w}");
            }
        }
    }
}
