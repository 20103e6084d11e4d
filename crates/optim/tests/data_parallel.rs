//! Data parallelism through a real communicator: 4 ranks as threads, each
//! with its own gradient, step every optimizer; parameters are bit-identical
//! on all ranks and bit-identical to one rank stepping on the mean gradient
//! (summed in rank order, then scaled by 1/4, as the allreduce does); each
//! step reports exactly one fp32 ring allreduce's bytes. Adam's and LAMB's
//! steps are split between the ranks (local ranks share cores), which this
//! checks bit for bit too, with their state gathered back before it is
//! compared.

mod common;

use common::{SplitMix, gradient, initial_params, layout};
use terse_comm::{Collective, Communicator, LocalComm, SingleRank};
use terse_optim::WithMoments;
use terse_optim::{AdamConfig, LambConfig, LrSchedule, Optimizer, OptimizerConfig, SgdConfig};

const RANKS: usize = 4;
const STEPS: usize = 10;

#[test]
fn ranks_agree_and_match_the_mean_gradient_run() {
    let configs = [
        OptimizerConfig::Adam(AdamConfig::default().with_weight_decay(0.01)),
        OptimizerConfig::Lamb(LambConfig::default().with_weight_decay(0.01)),
        OptimizerConfig::Sgd(SgdConfig::default()),
    ];
    for config in configs {
        let schedule = LrSchedule::Constant { lr: 1e-3 };
        let mut rng = SplitMix::new(2024);
        let x0 = initial_params(&mut rng);
        // grads[step][rank]
        let grads: Vec<Vec<Vec<f32>>> = (0..STEPS)
            .map(|_| (0..RANKS).map(|_| gradient(&mut rng)).collect())
            .collect();

        let dir = tempfile::tempdir().unwrap();
        let world = LocalComm::world(RANKS);
        let per_rank: Vec<(Vec<f32>, Vec<Vec<f32>>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = world
                .iter()
                .map(|comm| {
                    let (config, schedule, x0, grads) = (&config, &schedule, &x0, &grads);
                    let dir = dir.path();
                    scope.spawn(move || {
                        let mut opt =
                            Optimizer::new(config.clone(), schedule.clone(), layout(), comm)
                                .unwrap();
                        let mut x = x0.clone();
                        for step in grads {
                            let mut g = step[comm.rank()].clone();
                            let report = opt.step_flat(&mut x, &mut g, comm).unwrap();
                            // One ring allreduce of the fp32 gradient per step,
                            // also where the update is split between local
                            // ranks (what they then share is not traffic).
                            let allreduce = report.traffic.of(Collective::Allreduce);
                            let bytes = 2 * (RANKS - 1) * 4 * g.len() / RANKS;
                            assert_eq!((allreduce.calls, allreduce.sent), (1, bytes as u64));
                            assert_eq!(report.traffic.sent(), bytes as u64);
                        }
                        let path = dir.join(format!("rank-{}.safetensors", comm.rank()));
                        if !matches!(config, OptimizerConfig::Sgd(_)) {
                            assert!(opt.save(&path).is_err(), "a partial state is refused");
                        }
                        opt.sync_state(comm).unwrap();
                        opt.save(&path).unwrap();
                        (x, moments(&path))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });

        let mut single = Optimizer::new(
            config.clone(),
            schedule.clone(),
            layout(),
            &SingleRank::new(),
        )
        .unwrap();
        let mut x = x0.clone();
        for step in &grads {
            let mut mean = vec![0.0f32; x.len()];
            for g in step {
                mean.iter_mut().zip(g).for_each(|(m, g)| *m += g);
            }
            mean.iter_mut().for_each(|m| *m *= 1.0 / RANKS as f32);
            single
                .step_flat(&mut x, &mut mean, &SingleRank::new())
                .unwrap();
        }

        let path = dir.path().join("single.safetensors");
        single.save(&path).unwrap();
        let state = moments(&path);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (rank, (xr, state_r)) in per_rank.iter().enumerate() {
            assert_eq!(bits(xr), bits(&x), "{}: rank {rank} differs", config.name());
            assert_eq!(state_r.len(), state.len());
            for (a, b) in state_r.iter().zip(&state) {
                let differ = bits(a).iter().zip(bits(b)).filter(|(p, q)| *p != q).count();
                assert_eq!(differ, 0, "{}: rank {rank}'s state differs", config.name());
            }
        }
    }
}

/// The f32 state tensors of a saved optimizer (m, v, …), in name order.
fn moments(path: &std::path::Path) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = tensors
        .names()
        .into_iter()
        .filter(|n| !n.starts_with("scalar."))
        .map(str::to_string)
        .collect();
    names.sort();
    names
        .iter()
        .map(|n| bytemuck::pod_collect_to_vec(tensors.tensor(n).unwrap().data()))
        .collect()
}
