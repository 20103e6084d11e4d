//! Reductions and copies of whole buffers the rules decide on: ‖v‖₁ for
//! an automatic freeze, each segment's ‖m‖² for 1-bit LAMB's momentum
//! scales, ‖g‖² for LAMB's gradient pre-normalisation, v copied into
//! v_fresh. Host sums are f64 in chunk order; the device's are its
//! chunk table's, so host and device agree to rounding, not to the bit.

use rayon::prelude::*;

use crate::parallel::{CHUNK, sum_of_squares};
use crate::span::{On, Span};
use crate::storage::Buffer;
use terse_kernels::device::optim;

/// `Σ|b|` over the whole buffer.
pub(crate) fn sum_of_abs(span: &Span<'_>, b: &dyn Buffer) -> f64 {
    match &span.on {
        On::Host(_) => {
            let partials: Vec<f64> = b
                .host()
                .par_chunks(CHUNK)
                .map(|c| c.iter().map(|&x| f64::from(x.abs())).sum::<f64>())
                .collect();
            partials.into_iter().sum()
        }
        On::Device { client, chunks } => optim::sum_of_abs(client, chunks, b.handle()).iter().sum(),
    }
}

/// `Σb²` over the whole buffer.
pub(crate) fn squared_norm(span: &Span<'_>, b: &dyn Buffer) -> f64 {
    match &span.on {
        On::Host(_) => sum_of_squares(b.host()),
        On::Device { client, chunks } => optim::sum_of_squares(client, chunks, b.handle())
            .iter()
            .sum(),
    }
}

/// `Σb²` of each segment.
pub(crate) fn segment_squared_norms(span: &Span<'_>, b: &dyn Buffer) -> Vec<f64> {
    match &span.on {
        On::Host(_) => span
            .layout
            .segments()
            .iter()
            .map(|seg| sum_of_squares(&b.host()[seg.range()]))
            .collect(),
        On::Device { client, chunks } => optim::sum_of_squares(client, chunks, b.handle()),
    }
}

/// `to = from` (buffers of one length).
pub(crate) fn copy(span: &Span<'_>, from: &dyn Buffer, to: &mut dyn Buffer) {
    match &span.on {
        On::Host(_) => to.host_mut().copy_from_slice(from.host()),
        On::Device { client, .. } => {
            optim::copy(client, from.handle(), to.handle(), span.layout.len())
        }
    }
}
