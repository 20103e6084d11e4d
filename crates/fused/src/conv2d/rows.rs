//! The rows of an image (`[out_h·out_w, kh·kw·c_in]`, one per output
//! position): the weight gradient's layout, where the summed axis (the
//! positions) runs across the operand as gemm reads it.

use super::ConvShape;
use super::columns::copy_short;

/// Image `x` (`[c_in, h, w]`) as rows `[out_h·out_w, kh·kw·c_in]`: one
/// row per output position, kernel offset major and channel minor (the
/// transpose of [`im2col`]'s columns, in another order of `k`), written
/// whole (padding zeros included). `hwc` is scratch for the image
/// transposed to `[h, w, c_in]`, so that each kernel row's `kw·c_in` values
/// of a position are one contiguous run.
#[inline(always)]
pub(super) fn im2row(x: &[f32], s: &ConvShape, hwc: &mut [f32], rows: &mut [f32]) {
    let c_in = s.c_in;
    transpose::transpose(x, hwc, s.h * s.w, c_in);
    let (ow_n, k, run) = (s.out_w(), s.k(), s.kw * c_in);
    for (position, row) in rows.chunks_exact_mut(k).enumerate() {
        let (oh, ow) = (position / ow_n, position % ow_n);
        for (i, dst) in row.chunks_exact_mut(run).enumerate() {
            let ih = (oh * s.stride + i).wrapping_sub(s.pad);
            let first = (ow * s.stride).wrapping_sub(s.pad);
            if ih >= s.h {
                dst.fill(0.0);
            } else if first < s.w && first + s.kw <= s.w {
                copy_short(dst, &hwc[(ih * s.w + first) * c_in..][..run]);
            } else {
                // A kernel row over the left or right padding.
                for (j, dst) in dst.chunks_exact_mut(c_in).enumerate() {
                    let iw = first.wrapping_add(j);
                    if iw < s.w {
                        copy_short(dst, &hwc[(ih * s.w + iw) * c_in..][..c_in]);
                    } else {
                        dst.fill(0.0);
                    }
                }
            }
        }
    }
}

/// `dw` (`[c_out, kh·kw·c_in]`, [`im2row`]'s order of `k`) into the
/// weight's order (`[c_out, c_in, kh, kw]`).
pub(super) fn weight_order(dw: &[f32], s: &ConvShape) -> Vec<f32> {
    let (k, taps) = (s.k(), s.kh * s.kw);
    let mut out = vec![0.0f32; dw.len()];
    for (from, to) in dw.chunks_exact(k).zip(out.chunks_exact_mut(k)) {
        for (tap, channels) in from.chunks_exact(s.c_in).enumerate() {
            for (c, &v) in channels.iter().enumerate() {
                to[c * taps + tap] = v;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::columns::im2col;
    use super::super::{one_image_shapes, pseudo_random};
    use super::*;

    #[test]
    fn rows_are_the_columns_transposed_in_tap_major_order() {
        for s in one_image_shapes() {
            let (c_in, taps) = (s.c_in, s.kh * s.kw);
            let x = pseudo_random(s.image_len(), 5);
            let (k, p) = (s.k(), s.positions());
            let mut cols = vec![0.0; k * p];
            im2col(&x, &s, &mut cols);
            let mut hwc = vec![f32::NAN; x.len()];
            let mut rows = vec![f32::NAN; k * p];
            im2row(&x, &s, &mut hwc, &mut rows);
            for position in 0..p {
                for c in 0..c_in {
                    for tap in 0..taps {
                        let row = rows[position * k + tap * c_in + c];
                        let col = cols[(c * taps + tap) * p + position];
                        assert_eq!(row.to_bits(), col.to_bits(), "{s:?} at {position}");
                    }
                }
            }
            // weight_order undoes the tap-major order.
            let tap_major: Vec<f32> = (0..k).map(|i| i as f32).collect();
            let ordered = weight_order(&tap_major, &s);
            for c in 0..c_in {
                for tap in 0..taps {
                    assert_eq!(ordered[c * taps + tap], (tap * c_in + c) as f32);
                }
            }
        }
    }
}
