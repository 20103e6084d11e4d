//! One GPU per NCCL process: NCCL refuses two ranks of a communicator on
//! the same GPU with a bare `ncclInvalidUsage`, which a job meets when it
//! starts more processes on a node than the node has GPUs (`cuda:N` wraps
//! around them). Every rank shares its GPU's UUID first, and all refuse
//! the job naming the two ranks and what to do. Which GPU a process takes
//! is [`gpu_of_process`], for the trainer and the check binaries alike.

use crate::cuda_driver::{cuda_device_count, cuda_driver_present};
use crate::{CommError, Communicator, MpiComm};

/// The GPU this process takes for `cuda:index`: `index` plus its
/// node-local rank under mpirun, wrapping around the node's GPUs
/// (PyTorch's `cuda:LOCAL_RANK % device_count`), so that `mpirun -np 8
/// … --device cuda` on an 8-GPU node puts one process on each GPU,
/// `cuda:4` with 4 processes takes GPUs 4–7, two processes on a one-GPU
/// machine share it (NCCL refuses that, and [`one_gpu_each`] says so before
/// it starts), and a launcher that gives each process one GPU through
/// `CUDA_VISIBLE_DEVICES` leaves every process on its GPU 0.
pub fn gpu_of_process(index: usize) -> usize {
    gpu_for(index, MpiComm::node_local_rank(), visible_gpus())
}

/// The GPUs the driver shows this process; `None` without a driver (cudarc
/// would panic opening it) or when it does not start.
fn visible_gpus() -> Option<usize> {
    if !cuda_driver_present() {
        return None;
    }
    cuda_device_count().ok()
}

/// [`gpu_of_process`] for a node with `devices` GPUs (`None`: unknown): an
/// index the node lacks is kept, offset, for the error that names it.
fn gpu_for(index: usize, local_rank: usize, devices: Option<usize>) -> usize {
    match devices {
        Some(n) if index < n => (index + local_rank) % n,
        _ => index + local_rank,
    }
}

/// Refuses, on every rank, a job in which two processes opened the same
/// GPU (by its UUID): NCCL takes one GPU per process and would fail in
/// `ncclCommInitRank` with an unexplained `ncclInvalidUsage` — e.g. more
/// `mpirun` processes on a node than it has GPUs, which `cuda:N` wraps
/// around.
pub(crate) fn one_gpu_each(
    host: &dyn Communicator,
    uuid: [u8; 16],
    device: usize,
) -> Result<(), CommError> {
    let mut all = vec![0u8; GPU_RECORD * host.world_size()];
    host.all_gather_u8(&gpu_record(uuid, device), &mut all)?;
    match shared_gpu(&all) {
        None => Ok(()),
        Some((first, second, gpu)) => Err(CommError::Backend {
            backend: "nccl",
            message: format!(
                "ranks {first} and {second} are both on GPU {gpu} of their node: NCCL needs \
                 one GPU per process (start at most as many processes per node as it has \
                 GPUs, or use `--comm mpi`)"
            ),
        }),
    }
}

/// Bytes of a process's GPU record: its UUID, then its index (u64 LE).
const GPU_RECORD: usize = 24;

fn gpu_record(uuid: [u8; 16], device: usize) -> [u8; GPU_RECORD] {
    let mut record = [0u8; GPU_RECORD];
    record[..16].copy_from_slice(&uuid);
    record[16..].copy_from_slice(&(device as u64).to_le_bytes());
    record
}

/// The first two ranks whose records (rank order, [`gpu_record`]) name
/// the same GPU, and its index.
fn shared_gpu(records: &[u8]) -> Option<(usize, usize, u64)> {
    let ranks: Vec<&[u8]> = records.chunks(GPU_RECORD).collect();
    ranks.iter().enumerate().find_map(|(second, theirs)| {
        let first = ranks[..second]
            .iter()
            .position(|r| r[..16] == theirs[..16])?;
        let gpu = u64::from_le_bytes(theirs[16..].try_into().expect("8 bytes"));
        Some((first, second, gpu))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_process_of_a_node_takes_the_gpu_of_its_local_rank() {
        for (index, local_rank, devices, gpu) in [
            (0, 0, Some(8), 0),
            (0, 3, Some(8), 3),
            (4, 3, Some(8), 7),
            // Two processes on a one-GPU machine share it.
            (0, 1, Some(1), 0),
            (2, 3, Some(4), 1),
            // A GPU the node lacks stays named for the error.
            (9, 0, Some(8), 9),
            (0, 2, None, 2),
        ] {
            assert_eq!(
                gpu_for(index, local_rank, devices),
                gpu,
                "cuda:{index}, local rank {local_rank}, {devices:?} GPUs"
            );
        }
    }

    #[test]
    fn two_processes_on_one_gpu_are_named() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        let records = |gpus: &[([u8; 16], usize)]| -> Vec<u8> {
            gpus.iter().flat_map(|&(u, d)| gpu_record(u, d)).collect()
        };
        assert_eq!(shared_gpu(&records(&[(a, 0)])), None);
        assert_eq!(shared_gpu(&records(&[(a, 0), (b, 1)])), None);
        // Two nodes, each with its GPU 0: different UUIDs, no clash.
        assert_eq!(shared_gpu(&records(&[(a, 0), (b, 0)])), None);
        // Three processes on a two-GPU node: the third wrapped onto GPU 0.
        assert_eq!(
            shared_gpu(&records(&[(a, 0), (b, 1), (a, 0)])),
            Some((0, 2, 0))
        );
    }
}
