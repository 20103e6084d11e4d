//! The held-out evaluation shared between a run's ranks: rank `r` of `n`
//! evaluates the task's batches `r, r + n, …` ([`Task::eval_batch`]), the
//! outputs are gathered, and the lead rank scores them in batch order
//! ([`Task::eval_metrics`]): the numbers one rank evaluating alone gets, in
//! about `1/n` of its time. Until stop 95 the lead rank evaluated alone
//! while the others waited for it, on its share of the cores (4 local ranks
//! on CI's 2 cores: one core for ~4 s per evaluation of `reproduce`'s 512
//! held-out sequences) or on one process of many under `mpirun`.

use burn::tensor::Device;
use terse_comm::Communicator;

use crate::TrainError;
use crate::eval_progress::EvalProgress;
use crate::rank_exchange::{all_gather_bytes, all_succeeded};
use crate::task::Task;

/// Metrics as [`Task::eval_metrics`] names them, on the lead rank.
type LeadMetrics = Option<Vec<(String, f64)>>;

/// The task's metrics on the lead rank (`None` on the others), every rank
/// evaluating its share of the batches where `models_agree` (every rank
/// holds the same parameters), the lead rank all of them otherwise (SLAMB's
/// and 0/1 Adam's ranks step their own parameters between averagings, and
/// the lead rank's model is the one evaluated, as `terse eval` evaluates
/// rank 0's checkpoint). A collective where shared: every rank calls it
/// with the same `models_agree`. A rank whose share fails returns its
/// error and the others [`terse_comm::CommError::PeerFailed`] naming it, instead of
/// waiting for it.
pub(crate) fn evaluate_shared<T: Task>(
    task: &T,
    model: &T::Model,
    device: &Device,
    comm: &dyn Communicator,
    models_agree: bool,
    show_progress: bool,
) -> Result<LeadMetrics, TrainError> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let batches = task.eval_batches();
    if world == 1 || !models_agree || batches == 0 {
        // Nothing to share, or nothing that may be (every rank knows the
        // batches from the data, and `models_agree` from the run).
        return if rank == 0 {
            let progress = EvalProgress::new(batches, show_progress);
            task.evaluate(model, device, &progress).map(Some)
        } else {
            Ok(None)
        };
    }
    // Rank 0's share: the others keep pace with it.
    let share = (rank..batches).step_by(world);
    let progress = EvalProgress::new(share.len(), show_progress && rank == 0);
    let mine: Result<Vec<Vec<f32>>, TrainError> = share
        .map(|batch| {
            let outputs = task.eval_batch(model, batch, device);
            progress.batch_done();
            outputs
        })
        .collect();
    drop(progress);
    // A failed share ends the evaluation on every rank at once.
    let message = all_succeeded(comm, mine.map(|outputs| encode(&outputs)), || {
        "its share of the held-out evaluation failed".into()
    })?;
    let shares = all_gather_bytes(comm, &message)?;
    if rank != 0 {
        return Ok(None);
    }
    let mut shares: Vec<_> = shares
        .iter()
        .map(|bytes| decode(bytes).into_iter())
        .collect();
    let in_order: Vec<Vec<f32>> = (0..task.eval_batches())
        .map(|batch| shares[batch % world].next().expect("every batch evaluated"))
        .collect();
    task.eval_metrics(&in_order).map(Some)
}

/// Each batch's outputs as its length (u32) and its f32, little-endian.
fn encode(outputs: &[Vec<f32>]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for batch in outputs {
        let len = u32::try_from(batch.len()).expect("a batch of under 2^32 outputs");
        bytes.extend(len.to_le_bytes());
        bytes.extend(batch.iter().flat_map(|x| x.to_le_bytes()));
    }
    bytes
}

/// [`encode`]'s batches back.
fn decode(mut bytes: &[u8]) -> Vec<Vec<f32>> {
    let mut outputs = Vec::new();
    while let Some((len, rest)) = bytes.split_first_chunk::<4>() {
        let len = u32::from_le_bytes(*len) as usize;
        let (values, rest) = rest.split_at(4 * len);
        outputs.push(
            values
                .chunks_exact(4)
                .map(|x| f32::from_le_bytes(x.try_into().expect("4 bytes")))
                .collect(),
        );
        bytes = rest;
    }
    outputs
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::Tensor;
    use terse_comm::LocalComm;

    use super::*;

    /// A task whose held-out batch `b` is `b + 1` outputs all equal to `b`
    /// (batch `failing` fails), recording every batch evaluated.
    struct Batches {
        count: usize,
        failing: Option<usize>,
        evaluated: Mutex<Vec<usize>>,
    }

    impl Batches {
        fn new(count: usize, failing: Option<usize>) -> Self {
            Batches {
                count,
                failing,
                evaluated: Mutex::new(Vec::new()),
            }
        }
    }

    impl Task for Batches {
        type Model = Linear;

        fn examples(&self) -> usize {
            0
        }

        fn init(&self, device: &Device) -> Result<Linear, TrainError> {
            Ok(LinearConfig::new(1, 1).init(device))
        }

        fn loss(
            &self,
            _: &Linear,
            _: &[usize],
            _: u64,
            device: &Device,
        ) -> Result<Tensor<1>, TrainError> {
            Ok(Tensor::zeros([1], device))
        }

        fn eval_batches(&self) -> usize {
            self.count
        }

        fn eval_batch(&self, _: &Linear, batch: usize, _: &Device) -> Result<Vec<f32>, TrainError> {
            self.evaluated.lock().unwrap().push(batch);
            if Some(batch) == self.failing {
                return Err(TrainError::Batch(format!("batch {batch}")));
            }
            Ok(vec![batch as f32; batch + 1])
        }

        /// The batches in the order they arrive, as metrics `batch i` = b.
        fn eval_metrics(&self, outputs: &[Vec<f32>]) -> Result<Vec<(String, f64)>, TrainError> {
            let mut metrics = Vec::new();
            for (i, batch) in outputs.iter().enumerate() {
                assert_eq!(batch.len(), batch[0] as usize + 1, "batch {i} cut");
                metrics.push((format!("batch {i}"), f64::from(batch[0])));
            }
            Ok(metrics)
        }
    }

    fn shared(
        task: &Batches,
        ranks: usize,
        models_agree: bool,
    ) -> Vec<Result<LeadMetrics, TrainError>> {
        let device = Device::flex();
        let model = task.init(&device).unwrap();
        LocalComm::run(ranks, Duration::from_secs(20), |comm| {
            evaluate_shared(task, &model, &device, comm, models_agree, false)
        })
        .into_iter()
        .map(|rank| rank.expect("no rank panics"))
        .collect()
    }

    #[test]
    fn an_evaluation_counts_each_batch_on_its_progress() {
        let task = Batches::new(7, None);
        let device = Device::flex();
        let model = task.init(&device).unwrap();
        let progress = EvalProgress::hidden();
        task.evaluate(&model, &device, &progress).unwrap();
        assert_eq!(progress.done(), 7);
    }

    #[test]
    fn each_batch_is_evaluated_once_and_the_lead_scores_them_in_order() {
        for ranks in [1, 3] {
            let task = Batches::new(7, None);
            let results = shared(&task, ranks, true);
            let mut evaluated = task.evaluated.into_inner().unwrap();
            evaluated.sort();
            assert_eq!(evaluated, (0..7).collect::<Vec<_>>(), "{ranks} ranks");
            let metrics = results[0].as_ref().unwrap().as_ref().expect("the lead's");
            let order: Vec<f64> = metrics.iter().map(|(_, b)| *b).collect();
            assert_eq!(order, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "{ranks} ranks");
            for other in &results[1..] {
                assert!(matches!(other, Ok(None)), "{other:?}");
            }
        }
    }

    #[test]
    fn a_rank_whose_share_fails_is_named_on_the_others() {
        // Batch 4 of 5 is rank 1's of 3.
        let task = Batches::new(5, Some(4));
        let results = shared(&task, 3, true);
        let text = |r: &Result<_, TrainError>| r.as_ref().err().map(ToString::to_string);
        assert_eq!(text(&results[1]).as_deref(), Some("cannot batch: batch 4"));
        for rank in [0, 2] {
            assert_eq!(
                text(&results[rank]).as_deref(),
                Some("rank 1 failed: its share of the held-out evaluation failed"),
                "rank {rank}"
            );
        }
    }

    #[test]
    fn batches_come_back_as_they_went_bit_for_bit() {
        let outputs = vec![
            vec![1.5, f32::from_bits(1), -0.0, f32::NAN],
            Vec::new(),
            vec![16_777_216.0],
        ];
        let back = decode(&encode(&outputs));
        let bits = |o: &[Vec<f32>]| -> Vec<Vec<u32>> {
            o.iter()
                .map(|b| b.iter().map(|x| x.to_bits()).collect())
                .collect()
        };
        assert_eq!(bits(&back), bits(&outputs));
    }

    #[test]
    fn ranks_whose_models_differ_leave_the_evaluation_to_the_lead() {
        let task = Batches::new(5, None);
        let results = shared(&task, 3, false);
        // Rank 0 alone evaluated, in order, every batch.
        assert_eq!(task.evaluated.into_inner().unwrap(), [0, 1, 2, 3, 4]);
        assert_eq!(results[0].as_ref().unwrap().as_ref().unwrap().len(), 5);
        assert!(results[1..].iter().all(|r| matches!(r, Ok(None))));
    }
}
