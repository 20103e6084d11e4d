//! Splitting the replicated part of a step between ranks that share cores.
//!
//! After the gradient's allreduce every rank of a data-parallel world runs
//! the same update on the same values. Across machines that costs nothing
//! extra; `local` ranks are threads of one process, so n ranks pay for it
//! n times on the same cores (BERT-mini on 4 local ranks: each rank's LAMB
//! step took as long as one rank's step on both cores). When the
//! communicator says its ranks share cores, the step is split instead, as
//! ZeRO stage 1 splits it (which needs what data parallelism keeps: the
//! parameters and the optimizer state the same on every rank): the
//! gradient is reduce-scattered, each rank updates its own run of the
//! parallel chunks, and the parameters are shared back (the 1-bit
//! optimizers' compression stage shares m too). The work units are exactly
//! the chunks the whole step iterates over (each segment cut every
//! [`CHUNK`] elements), so every partial sum is the one the whole step
//! computes and the result is the same to the bit. A rank's moments are
//! then current only in its own chunks until
//! [`crate::FlatOptimizer::sync_state`] gathers them. The traffic meter
//! counts the reduce-scatter as the allreduce it stands for and nothing
//! for what is shared, so a split run reports the bytes of the unsplit one.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use terse_comm::Communicator;

use crate::parallel::CHUNK;
use crate::step::CommTime;
use crate::step::StepContext;
use crate::{OptimError, ParamLayout};

/// One parallel chunk of one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unit {
    /// The segment's index in the layout.
    pub(crate) segment: usize,
    /// Its elements in the flat buffer.
    pub(crate) range: Range<usize>,
}

/// Which chunks each rank updates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shard {
    units: Vec<Unit>,
    /// Rank `r` updates units `bounds[r]..bounds[r + 1]`.
    bounds: Vec<usize>,
    rank: usize,
    len: usize,
}

impl Shard {
    /// The split of `layout` over `world` ranks, seen from `rank`: runs of
    /// whole chunks with about `len / world` elements each.
    pub(crate) fn new(layout: &ParamLayout, world: usize, rank: usize) -> Self {
        let mut units = Vec::new();
        for (segment, s) in layout.segments().iter().enumerate() {
            let end = s.offset + s.len;
            let mut start = s.offset;
            while start < end {
                let stop = (start + CHUNK).min(end);
                units.push(Unit {
                    segment,
                    range: start..stop,
                });
                start = stop;
            }
        }
        let len = layout.len();
        let bounds = (0..=world)
            .map(|r| units.partition_point(|u| u.range.start < r * len / world))
            .collect();
        Self {
            units,
            bounds,
            rank,
            len,
        }
    }

    /// The split for this step's world, kept in `cache` (built once, then
    /// shared cheaply): over the ranks where they share cores and the step
    /// is `splittable`, otherwise one part holding every unit, the whole
    /// step on this rank (see [`Shard::is_split`]).
    pub(crate) fn for_step(
        cache: &mut Option<Arc<Shard>>,
        ctx: &StepContext,
        splittable: bool,
    ) -> Arc<Shard> {
        let shared = ctx.comm.world_size() > 1 && ctx.comm.shares_cores();
        let (world, rank) = match splittable && shared {
            true => (ctx.comm.world_size(), ctx.comm.rank()),
            false => (1, 0),
        };
        let stale = cache.as_ref().is_none_or(|s| {
            s.rank != rank || s.bounds.len() != world + 1 || s.len != ctx.layout.len()
        });
        if stale {
            *cache = Some(Arc::new(Shard::new(ctx.layout, world, rank)));
        }
        Arc::clone(cache.as_ref().expect("set above"))
    }

    /// Whether the step is split between ranks (more than one part).
    pub(crate) fn is_split(&self) -> bool {
        self.bounds.len() > 2
    }

    /// Every unit, in buffer order.
    pub(crate) fn units(&self) -> &[Unit] {
        &self.units
    }

    /// Rank `r`'s units.
    pub(crate) fn units_of(&self, r: usize) -> &[Unit] {
        &self.units[self.bounds[r]..self.bounds[r + 1]]
    }

    /// This rank's units.
    pub(crate) fn mine(&self) -> &[Unit] {
        self.units_of(self.rank)
    }

    /// Each rank's elements: contiguous, together the whole buffer.
    pub(crate) fn ranges(&self) -> Vec<Range<usize>> {
        (0..self.bounds.len() - 1)
            .map(|r| self.range_of(r))
            .collect()
    }

    /// This rank's elements (the span of [`Shard::mine`]).
    pub(crate) fn my_range(&self) -> Range<usize> {
        self.range_of(self.rank)
    }

    fn range_of(&self, r: usize) -> Range<usize> {
        let start = |b: usize| self.units.get(b).map_or(self.len, |u| u.range.start);
        start(self.bounds[r])..start(self.bounds[r + 1])
    }

    /// After an update split between ranks, every rank's part of each of
    /// `buffers` copied to the others ([`Communicator::share_ranges_f32`]);
    /// nothing when the step is not split. Returns the time it took.
    pub(crate) fn share_parts(
        &self,
        comm: &dyn Communicator,
        buffers: &mut [&mut [f32]],
    ) -> CommTime {
        if !self.is_split() {
            return Ok(Duration::ZERO);
        }
        let clock = Instant::now();
        let ranges = self.ranges();
        for buf in buffers {
            comm.share_ranges_f32(buf, &ranges)?;
        }
        Ok(clock.elapsed())
    }
}

/// Gathers the ranks' parts of `buffers` after sharded steps left each rank
/// with only its own current (`partial`), and clears the flag.
pub(crate) fn gather_partial_state(
    comm: &dyn Communicator,
    shard: Option<&Shard>,
    partial: &mut bool,
    buffers: &mut [&mut [f32]],
) -> Result<(), OptimError> {
    if !std::mem::take(partial) {
        return Ok(());
    }
    shard
        .expect("a sharded step kept its split")
        .share_parts(comm, buffers)?;
    Ok(())
}

/// Every rank's `words` 32-bit words for each unit of its own, in unit
/// order, through [`Communicator::share_ranges_f32`] (not traffic: the
/// values exist only because the step was split; their bits are copied
/// exactly). `mine` holds this rank's.
pub(crate) fn share_unit_words(
    comm: &dyn Communicator,
    shard: &Shard,
    mine: &[f32],
    words: usize,
) -> Result<Vec<f32>, OptimError> {
    let mut all = vec![0.0f32; shard.units.len() * words];
    let start = shard.bounds[shard.rank] * words;
    all[start..start + mine.len()].copy_from_slice(mine);
    let ranges: Vec<Range<usize>> = shard
        .bounds
        .windows(2)
        .map(|b| b[0] * words..b[1] * words)
        .collect();
    comm.share_ranges_f32(&mut all, &ranges)?;
    Ok(all)
}

/// `buf`'s slices for `units`, which must be consecutive (one rank's).
pub(crate) fn unit_slices_mut<'a>(buf: &'a mut [f32], units: &[Unit]) -> Vec<&'a mut [f32]> {
    let Some(first) = units.first() else {
        return Vec::new();
    };
    let mut rest = &mut buf[first.range.start..];
    units
        .iter()
        .map(|u| {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(u.range.len());
            rest = tail;
            head
        })
        .collect()
}

/// `buf`'s slices for `units`.
pub(crate) fn unit_slices<'a>(buf: &'a [f32], units: &[Unit]) -> Vec<&'a [f32]> {
    units.iter().map(|u| &buf[u.range.clone()]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_whole_chunks_tile_the_buffer_in_rank_order() {
        let layout = ParamLayout::from_shapes([
            ("a".to_string(), vec![3 * CHUNK + 5]),
            ("b".to_string(), vec![0]),
            ("c".to_string(), vec![7]),
            ("d".to_string(), vec![2, CHUNK]),
        ]);
        for world in 1..=9 {
            let shard = Shard::new(&layout, world, 0);
            let ranges = shard.ranges();
            assert_eq!(ranges.len(), world);
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[world - 1].end, layout.len());
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].end, pair[1].start, "world {world}");
            }
            // Units are the step's chunks: segment-relative, CHUNK long
            // but for each segment's last.
            let lens: Vec<usize> = shard.units().iter().map(|u| u.range.len()).collect();
            assert_eq!(lens, [CHUNK, CHUNK, CHUNK, 5, 7, CHUNK, CHUNK]);
            let mut units = 0;
            for (r, range) in ranges.iter().enumerate() {
                let own = shard.units_of(r);
                units += own.len();
                if let (Some(first), Some(last)) = (own.first(), own.last()) {
                    assert_eq!(first.range.start..last.range.end, *range);
                } else {
                    assert!(range.is_empty());
                }
            }
            assert_eq!(units, shard.units().len());
        }
        // Four ranks over ~6.3 chunks: no rank more than one chunk above
        // an even share.
        let shard = Shard::new(&layout, 4, 0);
        for range in shard.ranges() {
            assert!(range.len() <= layout.len() / 4 + CHUNK, "{range:?}");
        }
    }
}
