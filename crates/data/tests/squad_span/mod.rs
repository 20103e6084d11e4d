//! Where a gold answer lies in a SQuAD feature, found from the feature's
//! own offsets alone (independently of the featurizer's labelling code):
//! one module for the dev-set test here and the workspace's round trip
//! through post-processing (`tests/squad_dev_roundtrip.rs`, which includes
//! it by path), so both check against the same rule.

use terse_data::SquadFeature;

/// The first and last positions of `feature` whose characters overlap
/// `start..end`, when the window covers both ends of the answer.
pub fn span_in(feature: &SquadFeature, start: usize, end: usize) -> Option<(usize, usize)> {
    let context: Vec<(usize, (usize, usize))> = feature
        .offsets
        .iter()
        .enumerate()
        .filter_map(|(p, o)| o.map(|o| (p, o)))
        .collect();
    let (_, (window_start, _)) = *context.first()?;
    let (_, (_, window_end)) = *context.last()?;
    if window_start > start || window_end < end {
        return None;
    }
    let overlapping: Vec<usize> = context
        .iter()
        .filter(|(_, (s, e))| *e > start && *s < end)
        .map(|(p, _)| *p)
        .collect();
    Some((*overlapping.first()?, *overlapping.last()?))
}
