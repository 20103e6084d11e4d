//! im2col's columns of an image (`[c_in·kh·kw, out_h·out_w]`, one row
//! per kernel tap and channel) and their adjoint, col2im: the forward's
//! and the strided input gradient's layout.

use super::ConvShape;

/// The valid output range `[lo, hi)` along one axis for kernel offset `i`:
/// where `o·stride + i − pad` falls inside `0..len`.
pub(super) fn valid_range(
    out: usize,
    len: usize,
    i: usize,
    stride: usize,
    pad: usize,
) -> (usize, usize) {
    // o·stride + i ≥ pad  ⇔  o ≥ ceil((pad − i) / stride)
    let lo = if i >= pad {
        0
    } else {
        (pad - i).div_ceil(stride)
    };
    // o·stride + i − pad ≤ len − 1  ⇔  o ≤ (len − 1 + pad − i) / stride
    let hi = if len + pad > i {
        ((len - 1 + pad - i) / stride + 1).min(out)
    } else {
        0
    };
    (lo.min(hi), hi)
}

/// Image `x` (`[c_in, h, w]`) as columns `[c_in·kh·kw, out_h·out_w]`.
/// Writes only the positions that read the image: the padding's positions
/// are the same for every image of a shape, so a buffer zeroed once and
/// used for nothing else keeps them zero.
#[inline(always)]
pub(super) fn im2col(x: &[f32], s: &ConvShape, cols: &mut [f32]) {
    let (oh_n, ow_n) = (s.out_h(), s.out_w());
    let p = oh_n * ow_n;
    for c in 0..s.c_in {
        let plane = &x[c * s.h * s.w..(c + 1) * s.h * s.w];
        for i in 0..s.kh {
            let (oh_lo, oh_hi) = valid_range(oh_n, s.h, i, s.stride, s.pad);
            for j in 0..s.kw {
                let (ow_lo, ow_hi) = valid_range(ow_n, s.w, j, s.stride, s.pad);
                if ow_lo == ow_hi {
                    continue;
                }
                let row = &mut cols[((c * s.kh + i) * s.kw + j) * p..][..p];
                if let Some(run) = Run::new(s, (oh_lo, oh_hi), (ow_lo, ow_hi), i, j) {
                    row[run.start..run.end].copy_from_slice(&plane[run.source()]);
                    run.zero_wrapped(row);
                    continue;
                }
                let first = ow_lo * s.stride + j - s.pad;
                for oh in oh_lo..oh_hi {
                    let src = &plane[(oh * s.stride + i - s.pad) * s.w..][..s.w];
                    let dst = &mut row[oh * ow_n + ow_lo..oh * ow_n + ow_hi];
                    if s.stride == 1 {
                        copy_short(dst, &src[first..first + dst.len()]);
                    } else {
                        let src = src[first..].iter().step_by(s.stride);
                        for (d, v) in dst.iter_mut().zip(src) {
                            *d = *v;
                        }
                    }
                }
            }
        }
    }
}

/// A stride-1 convolution whose output rows are as wide as the input's
/// (3×3 with padding 1, 1×1 without): one kernel offset's part of the
/// columns is then the image shifted by a constant, one contiguous copy
/// instead of a copy per output row. The copy also carries values across
/// row ends into the positions outside `[ow_lo, ow_hi)`; those are the
/// padding's and are zeroed after it.
struct Run {
    /// Columns `[start, end)` of the kernel offset's row of `cols`.
    start: usize,
    end: usize,
    /// Where `start` reads in the input plane.
    source_start: usize,
    width: usize,
    rows: (usize, usize),
    valid: (usize, usize),
}

impl Run {
    fn new(
        s: &ConvShape,
        (oh_lo, oh_hi): (usize, usize),
        (ow_lo, ow_hi): (usize, usize),
        i: usize,
        j: usize,
    ) -> Option<Run> {
        let width = s.out_w();
        if s.stride != 1 || width != s.w || oh_lo == oh_hi || ow_lo == ow_hi {
            return None;
        }
        Some(Run {
            start: oh_lo * width + ow_lo,
            end: (oh_hi - 1) * width + ow_hi,
            // (oh_lo + i − pad)·w + (ow_lo + j − pad): both terms ≥ 0 in the
            // valid ranges.
            source_start: (oh_lo + i - s.pad) * s.w + ow_lo + j - s.pad,
            width,
            rows: (oh_lo, oh_hi),
            valid: (ow_lo, ow_hi),
        })
    }

    fn source(&self) -> std::ops::Range<usize> {
        self.source_start..self.source_start + (self.end - self.start)
    }

    /// Zeroes the positions inside `[start, end)` whose output column lies
    /// outside the valid range (at most `pad` per row end).
    fn zero_wrapped(&self, row: &mut [f32]) {
        let (lo, hi) = self.valid;
        // Inside [start, end) the wrapped positions are the `width − hi`
        // after each row's valid part and the `lo` before the next row's:
        // one gap of `width − hi + lo` between consecutive rows.
        let gap = self.width - hi + lo;
        if gap == 0 {
            return;
        }
        for oh in self.rows.0..self.rows.1 - 1 {
            let at = oh * self.width + hi;
            for v in &mut row[at..at + gap] {
                *v = 0.0;
            }
        }
    }
}

/// `dst.copy_from_slice(src)` for the short rows of an image (8 to 32
/// values in ResNet's CIFAR stages) as inline 16-wide moves: the library
/// call `copy_from_slice` makes cost more than the copy at these lengths.
#[inline(always)]
pub(super) fn copy_short(dst: &mut [f32], src: &[f32]) {
    const W: usize = 16;
    assert_eq!(dst.len(), src.len());
    let mut d = dst.chunks_exact_mut(W);
    let mut s = src.chunks_exact(W);
    for (d, s) in (&mut d).zip(&mut s) {
        let d: &mut [f32; W] = d.try_into().expect("16 wide");
        *d = *<&[f32; W]>::try_from(s).expect("16 wide");
    }
    for (d, s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = *s;
    }
}

/// Adds columns `cols` back into image gradient `dx` (`[c_in, h, w]`): the
/// adjoint of [`im2col`].
/// The padding's positions of `cols` are zeroed on the way (the caller's
/// scratch: a gemm's output).
#[inline(always)]
pub(super) fn col2im(cols: &mut [f32], s: &ConvShape, dx: &mut [f32]) {
    let (oh_n, ow_n) = (s.out_h(), s.out_w());
    let p = oh_n * ow_n;
    for c in 0..s.c_in {
        let plane = &mut dx[c * s.h * s.w..(c + 1) * s.h * s.w];
        for i in 0..s.kh {
            let (oh_lo, oh_hi) = valid_range(oh_n, s.h, i, s.stride, s.pad);
            for j in 0..s.kw {
                let (ow_lo, ow_hi) = valid_range(ow_n, s.w, j, s.stride, s.pad);
                let row = &mut cols[((c * s.kh + i) * s.kw + j) * p..][..p];
                if ow_lo == ow_hi {
                    continue;
                }
                if let Some(run) = Run::new(s, (oh_lo, oh_hi), (ow_lo, ow_hi), i, j) {
                    // Adding the zeroed wrapped positions changes no value.
                    run.zero_wrapped(row);
                    for (d, v) in plane[run.source()].iter_mut().zip(&row[run.start..run.end]) {
                        *d += v;
                    }
                    continue;
                }
                for oh in oh_lo..oh_hi {
                    let dst = &mut plane[(oh * s.stride + i - s.pad) * s.w..][..s.w];
                    let src = &row[oh * ow_n + ow_lo..oh * ow_n + ow_hi];
                    let first = ow_lo * s.stride + j - s.pad;
                    if s.stride == 1 {
                        for (d, v) in dst[first..first + src.len()].iter_mut().zip(src) {
                            *d += v;
                        }
                    } else {
                        for (d, v) in dst[first..].iter_mut().step_by(s.stride).zip(src) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{one_image_shapes, pseudo_random};
    use super::*;

    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        // ⟨im2col(x), c⟩ = ⟨x, col2im(c)⟩ for every shape, padding and stride.
        for s in one_image_shapes() {
            let x = pseudo_random(s.image_len(), 3);
            let c = pseudo_random(s.k() * s.positions(), 4);
            let mut cols = vec![0.0; c.len()];
            im2col(&x, &s, &mut cols);
            let mut back = vec![0.0; x.len()];
            col2im(&mut c.clone(), &s, &mut back);
            let lhs: f64 = cols.iter().zip(&c).map(|(a, b)| f64::from(a * b)).sum();
            let rhs: f64 = x.iter().zip(&back).map(|(a, b)| f64::from(a * b)).sum();
            assert!((lhs - rhs).abs() < 1e-4, "{s:?}: {lhs} against {rhs}");
        }
    }
}
