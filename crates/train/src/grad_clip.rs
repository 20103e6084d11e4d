//! `train.max_grad_norm`: global-norm gradient clipping before the
//! optimizer, as DeepSpeed's `gradient_clipping` and the HF Trainer's
//! `max_grad_norm`. The norm is the root mean square of the ranks' norms
//! (the squared norms averaged in one scalar allreduce): exact on one rank, an upper bound on several,
//! where the exact norm of the mean gradient would need the fp32 allreduce
//! the compressed stages avoid. This is the host's clipping; a gradient on
//! a cubecl device is clipped there (`FlatModel::clip_grad_on_device`).

use terse_comm::{Communicator, ReduceOp};

use crate::TrainError;

/// The global norm from the ranks' mean squared norm.
pub(crate) fn global_norm(mean_squares: f32) -> f64 {
    f64::from(mean_squares).sqrt()
}

/// Clipping: the global norm needs its own scalar allreduce here, before
/// the optimizer (without clipping the trainer carries the squares in the
/// step's shared allreduce instead). Every rank scales its gradient by the
/// same `max_norm / norm` when the norm exceeds `max_norm`; returns the
/// norm before clipping. `squares` is this rank's squared gradient norm;
/// `scale_gradient` multiplies the gradient (wherever it lives) by a factor.
pub(crate) fn clip_gradient(
    scale_gradient: impl FnOnce(f32),
    squares: f32,
    max_norm: f64,
    comm: &dyn Communicator,
) -> Result<f64, TrainError> {
    let mut squares = [squares];
    if comm.world_size() > 1 {
        comm.allreduce_f32(&mut squares, ReduceOp::Mean)?;
    }
    let norm = global_norm(squares[0]);
    if norm > max_norm {
        let factor = (max_norm / norm) as f32;
        scale_gradient(factor);
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use terse_comm::{LocalComm, SingleRank};

    fn squared_norm(grad: &[f32]) -> f32 {
        terse_optim::sum_of_squares(grad) as f32
    }

    fn scaling(grad: &mut [f32]) -> impl FnOnce(f32) + '_ {
        |factor| grad.iter_mut().for_each(|g| *g *= factor)
    }

    #[test]
    fn clipping_scales_to_the_max_norm_and_logs_the_norm_before() {
        let mut grad = vec![3.0, 4.0];
        let squares = squared_norm(&grad);
        let norm = clip_gradient(scaling(&mut grad), squares, 1.0, &SingleRank::new()).unwrap();
        assert_eq!(norm, 5.0);
        assert!(
            (grad[0] - 0.6).abs() < 1e-7 && (grad[1] - 0.8).abs() < 1e-7,
            "{grad:?}"
        );
        // Below the limit, or without one, the gradient is untouched.
        let mut grad = vec![3.0, 4.0];
        assert_eq!(
            clip_gradient(scaling(&mut grad), 25.0, 6.0, &SingleRank::new()).unwrap(),
            5.0
        );
        assert_eq!(global_norm(squared_norm(&grad)), 5.0);
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
            let squares = squared_norm(&grad);
            let norm = clip_gradient(scaling(&mut grad), squares, 1.0, comm).unwrap();
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
