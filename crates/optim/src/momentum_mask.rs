//! DeepSpeed's `exp_avg_mask` as a list in the config (`momentum_mask` of
//! 1-bit Adam and 0/1 Adam): coordinates whose synchronised momentum is
//! set to zero after every compressed allreduce of the compression stage,
//! because 1-bit compression cannot send an exact zero. DeepSpeedExamples
//! masks the rows of BERT's position embeddings past the sequence length.
//!
//! An entry is a parameter path (or a prefix ending in `*`, as
//! `uncompressed` takes), optionally followed by a range of rows of its
//! first dimension: `bert.embeddings.position_embeddings.weight[128:]`. As in DeepSpeed, a
//! masked coordinate still decays; terse's own `hold_zero_variance` (on by
//! default) holds every coordinate with a frozen v of zero still instead.

use std::ops::Range;

use burn::tensor::Tensor;
use cubecl::server::Handle;

use crate::device_flat::into_handle;
use crate::param_patterns::matching_segments;
use crate::{DeviceFlat, Flat, FlatMut, OptimError, ParamLayout};

/// The masked ranges of the flat buffer, sorted and disjoint.
#[derive(Debug, Clone, Default)]
pub(crate) struct MomentumMask {
    ranges: Vec<Range<usize>>,
}

impl MomentumMask {
    /// The ranges `entries` name in `layout`; `field` names the config
    /// field in errors.
    ///
    /// # Errors
    /// An entry that names no parameter (with the model's paths), a row range that is not
    /// `[start:end]` with either bound optional, or one past the
    /// parameter's rows.
    pub(crate) fn new(
        entries: &[String],
        field: &str,
        layout: &ParamLayout,
    ) -> Result<MomentumMask, OptimError> {
        let bad = |entry: &str, reason: &'static str| OptimError::InvalidConfig {
            field: field.to_string(),
            value: format!("\"{entry}\""),
            reason,
        };
        let mut ranges = Vec::new();
        for entry in entries {
            let (pattern, rows) = match entry.split_once('[') {
                None => (entry.as_str(), None),
                Some((pattern, rest)) => {
                    let rows = rest
                        .strip_suffix(']')
                        .and_then(|r| r.split_once(':'))
                        .ok_or_else(|| bad(entry, "rows are written `[start:end]`"))?;
                    (pattern, Some(rows))
                }
            };
            for segment in matching_segments(&[pattern], field, layout)? {
                let n_rows = segment.shape.first().copied().unwrap_or(1).max(1);
                let row_len = segment.len / n_rows;
                let (start, end) = match rows {
                    None => (0, n_rows),
                    Some((a, b)) => {
                        let bound = |s: &str, default: usize| match s.trim() {
                            "" => Ok(default),
                            s => s
                                .parse::<usize>()
                                .map_err(|_| bad(entry, "a row bound is a whole number")),
                        };
                        (bound(a, 0)?, bound(b, n_rows)?)
                    }
                };
                if start > end || end > n_rows {
                    return Err(bad(
                        entry,
                        "the rows are past the parameter's first dimension",
                    ));
                }
                let offset = segment.offset;
                ranges.push(offset + start * row_len..offset + end * row_len);
            }
        }
        ranges.retain(|r| !r.is_empty());
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::new();
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        Ok(MomentumMask { ranges: merged })
    }

    /// The masked ranges.
    #[cfg(test)]
    pub(crate) fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// Whether nothing is masked.
    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Sets the masked coordinates of `buf` (a step's buffer) to zero,
    /// wherever it is.
    pub(crate) fn apply(&self, buf: &mut FlatMut) {
        if self.is_empty() {
            return;
        }
        match buf {
            FlatMut::Host(b) => self.zero_host(b),
            FlatMut::Device(b) => {
                let len = b.len();
                let handle = b.swap_handle(b.client().empty(size_of::<f32>()));
                // Says where the buffer lives; taken after the swap, so it
                // shares no storage with `handle`.
                let like = b.clone();
                b.swap_handle(self.zero_device(&like, handle, len));
            }
        }
    }

    /// [`MomentumMask::apply`] to a state buffer, on `like`'s device when
    /// one is given.
    pub(crate) fn apply_to_state(&self, m: &mut Flat, like: Option<&DeviceFlat>) {
        if self.is_empty() {
            return;
        }
        match like {
            None => self.zero_host(m.host_mut()),
            Some(like) => {
                let len = m.len();
                let handle = m.take_handle();
                m.put_handle(self.zero_device(like, handle, len));
            }
        }
    }

    fn zero_host(&self, b: &mut [f32]) {
        for r in &self.ranges {
            b[r.clone()].fill(0.0);
        }
    }

    fn zero_device(&self, like: &DeviceFlat, handle: Handle, len: usize) -> Handle {
        let mut t: Tensor<1> = like.wrap(handle, len);
        for r in &self.ranges {
            t = t.slice_fill(r.clone(), 0.0);
        }
        into_handle(t)
    }
}

#[cfg(test)]
mod tests {
    use super::MomentumMask;
    use crate::ParamLayout;

    fn layout() -> ParamLayout {
        ParamLayout::from_shapes([
            ("embeddings.position.weight".to_string(), vec![8, 4]),
            ("embeddings.norm.bias".to_string(), vec![4]),
            ("encoder.weight".to_string(), vec![3, 2]),
        ])
    }

    fn ranges(entries: &[&str]) -> Result<Vec<std::ops::Range<usize>>, String> {
        let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        MomentumMask::new(&entries, "onebit_adam.momentum_mask", &layout())
            .map(|m| m.ranges().to_vec())
            .map_err(|e| e.to_string())
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // lists of one range
    fn entries_name_parameters_and_their_rows() {
        assert_eq!(
            ranges(&["embeddings.position.weight[5:]"]),
            Ok(vec![20..32])
        );
        assert_eq!(ranges(&["embeddings.position.weight[:1]"]), Ok(vec![0..4]));
        assert_eq!(ranges(&["encoder.weight"]), Ok(vec![36..42]));
        // A 1-D parameter's rows are its elements; overlaps merge.
        assert_eq!(
            ranges(&["embeddings.norm.bias[1:3]", "embeddings.*[3:4]"]),
            Ok(vec![12..16, 33..36])
        );
    }

    #[test]
    fn bad_entries_name_the_field_and_the_entry() {
        for (entry, reason) in [
            ("embeddings.positions.weight", "names no parameter"),
            (
                "encoder.weight[1:4]",
                "past the parameter's first dimension",
            ),
            ("encoder.weight[1]", "`[start:end]`"),
            ("encoder.weight[a:]", "whole number"),
        ] {
            let e = ranges(&[entry]).unwrap_err();
            assert!(
                e.contains("momentum_mask") && e.contains(entry) && e.contains(reason),
                "{entry}: {e}"
            );
        }
    }
}
