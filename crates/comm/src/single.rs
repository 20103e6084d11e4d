//! The one-rank communicator: every collective is the identity (or a copy),
//! and argument checks are the same as a multi-rank backend's so a bug shows up
//! on one rank first.

use crate::{CommError, Communicator, ReduceOp};

/// A world of one rank.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleRank;

impl Communicator for SingleRank {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn allreduce_f32(&self, _buf: &mut [f32], _op: ReduceOp) -> Result<(), CommError> {
        // Sum and mean over a single rank are both the rank's own values.
        Ok(())
    }

    fn broadcast_f32(&self, _buf: &mut [f32], root: usize) -> Result<(), CommError> {
        check_root("broadcast", root)
    }

    fn all_gather_u32(&self, send: &[u32], recv: &mut [u32]) -> Result<(), CommError> {
        check_len("all_gather", send.len(), recv.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }

    fn all_to_all_u32(&self, send: &[u32], recv: &mut [u32]) -> Result<(), CommError> {
        check_len("all_to_all", send.len(), recv.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        Ok(())
    }
}

fn check_root(op: &'static str, root: usize) -> Result<(), CommError> {
    if root == 0 {
        Ok(())
    } else {
        Err(CommError::BadRank {
            op,
            rank: root,
            world_size: 1,
        })
    }
}

fn check_len(op: &'static str, expected: usize, actual: usize) -> Result<(), CommError> {
    if expected == actual {
        Ok(())
    } else {
        Err(CommError::LengthMismatch {
            op,
            expected,
            actual,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_on_one_rank_are_identities_and_check_arguments() {
        let comm = SingleRank;
        let mut buf = vec![1.5f32, -2.0, 3.25];
        comm.allreduce_f32(&mut buf, ReduceOp::Mean).unwrap();
        comm.allreduce_f32(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(buf, [1.5, -2.0, 3.25]);

        let mut recv = [0u32; 3];
        comm.all_gather_u32(&[7, 8, 9], &mut recv).unwrap();
        assert_eq!(recv, [7, 8, 9]);
        let mut recv = [0u32; 2];
        comm.all_to_all_u32(&[4, 5], &mut recv).unwrap();
        assert_eq!(recv, [4, 5]);

        assert!(matches!(
            comm.all_gather_u32(&[1, 2], &mut [0u32; 3]),
            Err(CommError::LengthMismatch {
                expected: 2,
                actual: 3,
                ..
            })
        ));
        assert!(matches!(
            comm.broadcast_f32(&mut buf, 1),
            Err(CommError::BadRank { rank: 1, .. })
        ));
    }
}
