//! `train.max_grad_norm`: global-norm gradient clipping before the
//! optimizer, as DeepSpeed's `gradient_clipping` and the HF Trainer's
//! `max_grad_norm`. The norm is the root mean square of the ranks' norms
//! (one scalar allreduce): exact on one rank, an upper bound on several,
//! where the exact norm of the mean gradient would need the fp32 allreduce
//! the compressed stages avoid.

use terse_comm::{Communicator, ReduceOp};
use terse_optim::sum_of_squares;

use crate::TrainError;

/// The gradient's global norm (the root mean square of the ranks' norms,
/// one scalar allreduce), before clipping; with `max_norm`, every rank
/// scales its gradient by the same `max_norm / norm` when the norm exceeds
/// it.
pub(crate) fn clip_gradient(
    grad: &mut [f32],
    max_norm: Option<f64>,
    comm: &dyn Communicator,
) -> Result<f64, TrainError> {
    let mut squares = [sum_of_squares(grad) as f32];
    if comm.world_size() > 1 {
        comm.allreduce_f32(&mut squares, ReduceOp::Mean)?;
    }
    let norm = f64::from(squares[0]).sqrt();
    if let Some(max_norm) = max_norm
        && norm > max_norm
    {
        let factor = (max_norm / norm) as f32;
        grad.iter_mut().for_each(|g| *g *= factor);
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use terse_comm::{LocalComm, SingleRank};

    #[test]
    fn clipping_scales_to_the_max_norm_and_logs_the_norm_before() {
        let mut grad = vec![3.0, 4.0];
        let norm = clip_gradient(&mut grad, Some(1.0), &SingleRank::new()).unwrap();
        assert_eq!(norm, 5.0);
        assert!(
            (grad[0] - 0.6).abs() < 1e-7 && (grad[1] - 0.8).abs() < 1e-7,
            "{grad:?}"
        );
        // Below the limit, or without one, the gradient is untouched.
        let mut grad = vec![3.0, 4.0];
        assert_eq!(
            clip_gradient(&mut grad, Some(6.0), &SingleRank::new()).unwrap(),
            5.0
        );
        assert_eq!(
            clip_gradient(&mut grad, None, &SingleRank::new()).unwrap(),
            5.0
        );
        assert_eq!(grad, [3.0, 4.0]);
    }

    #[test]
    fn every_rank_clips_by_the_same_factor() {
        // Norms 5 and 0: the root mean square is √12.5; limit 1.
        let results = LocalComm::run(2, Duration::from_secs(10), |comm| {
            let mut grad = if comm.rank() == 0 {
                vec![3.0f32, 4.0]
            } else {
                vec![0.0, 0.0]
            };
            let norm = clip_gradient(&mut grad, Some(1.0), comm).unwrap();
            (norm, grad)
        });
        let expected_norm = 12.5f64.sqrt();
        let factor = (1.0 / expected_norm) as f32;
        for (rank, result) in results.into_iter().enumerate() {
            let (norm, grad) = result.unwrap();
            assert!((norm - expected_norm).abs() < 1e-6, "rank {rank}: {norm}");
            let want = if rank == 0 {
                [3.0 * factor, 4.0 * factor]
            } else {
                [0.0, 0.0]
            };
            for (g, w) in grad.iter().zip(want) {
                assert!((g - w).abs() < 1e-6, "rank {rank}: {grad:?} vs {want:?}");
            }
        }
    }
}
