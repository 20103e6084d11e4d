//! Data parallelism through a real communicator: 4 ranks as threads, each
//! with its own gradient, step every optimizer; parameters are bit-identical
//! on all ranks and bit-identical to one rank stepping on the mean gradient
//! (summed in rank order, then scaled by 1/4, as the allreduce does); each
//! step reports exactly one fp32 ring allreduce's bytes.

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

        let world = LocalComm::world(RANKS);
        let per_rank: Vec<Vec<f32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = world
                .iter()
                .map(|comm| {
                    let (config, schedule, x0, grads) = (&config, &schedule, &x0, &grads);
                    scope.spawn(move || {
                        let mut opt =
                            Optimizer::new(config.clone(), schedule.clone(), layout(), comm)
                                .unwrap();
                        let mut x = x0.clone();
                        for step in grads {
                            let mut g = step[comm.rank()].clone();
                            let report = opt.step_flat(&mut x, &mut g, comm).unwrap();
                            // One ring allreduce of the fp32 gradient per step.
                            let allreduce = report.traffic.of(Collective::Allreduce);
                            let bytes = 2 * (RANKS - 1) * 4 * g.len() / RANKS;
                            assert_eq!((allreduce.calls, allreduce.sent), (1, bytes as u64));
                            assert_eq!(report.traffic.sent(), bytes as u64);
                        }
                        x
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

        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (rank, xr) in per_rank.iter().enumerate() {
            assert_eq!(bits(xr), bits(&x), "{}: rank {rank} differs", config.name());
        }
    }
}
