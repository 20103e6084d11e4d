//! A run stopped, saved, loaded into a fresh optimizer and continued is
//! bit-identical to a run never stopped, for every optimizer; a state file
//! from another optimizer, config or layout is refused with the difference named.

mod common;

use terse_optim::WithMoments;

use common::{SplitMix, gradient, initial_params, layout};
use terse_comm::SingleRank;
use terse_optim::{
    AdamConfig, LambConfig, LrSchedule, OptimError, Optimizer, OptimizerConfig, ParamLayout,
    SgdConfig,
};

const STEPS: usize = 16;
const STOP_AT: usize = 7;

fn schedule() -> LrSchedule {
    LrSchedule::LinearWarmupPolyDecay {
        peak: 1e-2,
        warmup_steps: 4,
        total_steps: 30,
        power: 0.5,
        end_lr: 0.0,
    }
}

fn configs() -> [OptimizerConfig; 3] {
    [
        OptimizerConfig::Adam(AdamConfig::default().with_weight_decay(0.01)),
        OptimizerConfig::Lamb(LambConfig {
            grad_prenorm: true,
            ..LambConfig::default().with_weight_decay(0.01)
        }),
        OptimizerConfig::Sgd(SgdConfig {
            nesterov: true,
            ..Default::default()
        }),
    ]
}

/// A scratch directory for the state files, removed when dropped.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("terse-resume-")
        .tempdir()
        .unwrap()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn resumed_runs_are_bit_identical() {
    let scratch = scratch();
    for config in configs() {
        let name = config.name();
        let mut rng = SplitMix::new(99);
        let x0 = initial_params(&mut rng);
        let grads: Vec<Vec<f32>> = (0..STEPS).map(|_| gradient(&mut rng)).collect();

        let mut straight =
            Optimizer::new(config.clone(), schedule(), layout(), &SingleRank::new()).unwrap();
        let mut x_straight = x0.clone();
        for g in &grads {
            straight
                .step_flat(&mut x_straight, &mut g.clone(), &SingleRank::new())
                .unwrap();
        }

        let path = scratch.path().join(format!("{name}.safetensors"));
        let mut first =
            Optimizer::new(config.clone(), schedule(), layout(), &SingleRank::new()).unwrap();
        let mut x = x0.clone();
        for g in &grads[..STOP_AT] {
            first
                .step_flat(&mut x, &mut g.clone(), &SingleRank::new())
                .unwrap();
        }
        first.save(&path).unwrap();
        drop(first);

        let mut resumed =
            Optimizer::new(config.clone(), schedule(), layout(), &SingleRank::new()).unwrap();
        resumed.load(&path).unwrap();
        assert_eq!(resumed.step_count(), STOP_AT as u64);
        for g in &grads[STOP_AT..] {
            resumed
                .step_flat(&mut x, &mut g.clone(), &SingleRank::new())
                .unwrap();
        }
        assert_eq!(resumed.step_count(), STEPS as u64);
        assert_eq!(
            bits(&x),
            bits(&x_straight),
            "{name}: parameters differ after resume"
        );
        assert_ne!(bits(&x), bits(&x0), "{name}: the run moved the parameters");

        // The saved state itself round-trips: saving the resumed optimizer and
        // the straight one gives the same bytes.
        let a = scratch.path().join(format!("{name}-a.safetensors"));
        let b = scratch.path().join(format!("{name}-b.safetensors"));
        resumed.save(&a).unwrap();
        straight.save(&b).unwrap();
        let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        let header = |bytes: &[u8]| {
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let json: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            (json, bytes[8 + n..].to_vec())
        };
        assert_eq!(header(&a), header(&b), "{name}: saved states differ");
    }
}

#[test]
fn mismatched_state_files_are_refused() {
    let scratch = scratch();
    let path = scratch.path().join("adam-mismatch.safetensors");
    let adam = OptimizerConfig::Adam(AdamConfig::default());
    Optimizer::new(adam.clone(), schedule(), layout(), &SingleRank::new())
        .unwrap()
        .save(&path)
        .unwrap();

    let error = |mut optimizer: Optimizer| match optimizer.load(&path) {
        Err(OptimError::BadState { detail, .. }) => detail,
        other => panic!("expected a refusal, got {other:?}"),
    };

    let lamb = Optimizer::new(
        OptimizerConfig::Lamb(LambConfig::default()),
        schedule(),
        layout(),
        &SingleRank::new(),
    );
    assert!(error(lamb.unwrap()).contains("saved by optimizer `adam`"));

    let other_beta = OptimizerConfig::Adam(AdamConfig::default().with_beta_2(0.98));
    let detail =
        error(Optimizer::new(other_beta, schedule(), layout(), &SingleRank::new()).unwrap());
    assert!(detail.contains("config.beta_2"), "{detail}");

    let detail = error(
        Optimizer::new(
            adam.clone(),
            LrSchedule::Constant { lr: 1e-3 },
            layout(),
            &SingleRank::new(),
        )
        .unwrap(),
    );
    assert!(detail.contains("schedule"), "{detail}");

    let other_layout = ParamLayout::from_shapes([("w".to_string(), vec![3])]);
    let detail = error(Optimizer::new(adam, schedule(), other_layout, &SingleRank::new()).unwrap());
    assert!(detail.contains("layout"), "{detail}");

    std::fs::write(&path, b"not a state file").unwrap();
    let detail = error(
        Optimizer::new(
            OptimizerConfig::Adam(AdamConfig::default()),
            schedule(),
            layout(),
            &SingleRank::new(),
        )
        .unwrap(),
    );
    assert!(detail.contains("not safetensors"), "{detail}");
}
