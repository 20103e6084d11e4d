//! Every file in configs/ loads and validates (unknown fields are errors, so
//! a typo fails here): the sum-of-squares problem as terse-sum-of-squares
//! reads it, the rest as trainer runs; the MLP runs keep the tuned settings
//! of the optimizer tests; and the paper settings carry the numbers of
//! ALGORITHMS.md's "Paper settings" table.

use std::path::Path;

use terse_models::{MlpConfig, ModelConfig};
use terse_optim::{AdamConfig, LambConfig, SgdConfig, WithMoments};
use terse_optim::{LrSchedule, OptimizerConfig};
use terse_train::{RunConfig, TaskConfig};

fn configs() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

/// Section `key` of config `name`'s `table`, taken out of it and parsed.
fn section<T: serde::de::DeserializeOwned>(table: &mut toml::Table, name: &str, key: &str) -> T {
    table
        .remove(key)
        .unwrap_or_else(|| panic!("{name}: no [{key}]"))
        .try_into()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn load(name: &str) -> RunConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../configs")
        .join(name);
    RunConfig::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_config_loads() {
    let files = configs();
    assert!(files.len() >= 20, "{} configs", files.len());
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.contains("sum-of-squares") {
            // `terse sum-of-squares` reads this one: a start point and the
            // optimizer, no model or data.
            let text = std::fs::read_to_string(&path).unwrap();
            let mut table: toml::Table =
                toml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            let optimizer: OptimizerConfig = section(&mut table, &name, "optimizer");
            optimizer.validate().unwrap();
            let schedule: LrSchedule = section(&mut table, &name, "schedule");
            schedule.validate().unwrap();
            let start = table
                .remove("start")
                .and_then(|v| v.as_array().map(Vec::len));
            assert!(start.is_some_and(|n| n > 0), "{name}: start");
            assert!(
                table.remove("steps").is_some_and(|v| v.is_integer()),
                "{name}"
            );
            assert!(table.is_empty(), "{name}: unknown keys {table:?}");
        } else {
            let config = RunConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
            // Round trip: what a run writes next to its metrics loads again.
            assert_eq!(
                RunConfig::parse(&config.to_toml()).unwrap(),
                config,
                "{name}"
            );
        }
    }
}

fn freeze(config: &RunConfig) -> u64 {
    match &config.optimizer {
        OptimizerConfig::OnebitAdam(c) => c.compression.freeze_step,
        OptimizerConfig::OnebitLamb(c) => c.compression.freeze_step,
        other => panic!("{other:?} has no freeze step"),
    }
}

#[test]
fn paper_settings_match_the_table() {
    // (file, global batch, steps, T_w or None, peak lr)
    let table: [(&str, usize, u64, Option<u64>, f64); 8] = [
        (
            "paper-onebit-adam-bert-large-seq128.toml",
            4096,
            152_000,
            Some(23_000),
            4e-4,
        ),
        (
            "paper-onebit-adam-bert-large-seq512.toml",
            4096,
            10_000,
            Some(1_500),
            4e-4,
        ),
        ("paper-onebit-adam-squad.toml", 96, 1848, Some(400), 3e-5),
        (
            "paper-onebit-lamb-bert-large-seq128.toml",
            65_536,
            5993,
            Some(1000),
            12e-3,
        ),
        (
            "paper-onebit-lamb-bert-large-seq512.toml",
            32_768,
            555,
            Some(107),
            2e-3,
        ),
        (
            "paper-slamb-bert-large-seq128.toml",
            65_536,
            7038,
            None,
            6e-3,
        ),
        (
            "paper-slamb-bert-large-seq512.toml",
            32_768,
            1563,
            None,
            4e-3,
        ),
        ("paper-slamb-resnet110-cifar10.toml", 1024, 9760, None, 0.01),
    ];
    for (name, batch, steps, tw, lr) in table {
        let config = load(name);
        assert_eq!(config.train.global_batch, batch, "{name}");
        assert_eq!(config.train.steps, steps, "{name}");
        if let Some(tw) = tw {
            assert_eq!(freeze(&config), tw, "{name}");
        }
        let peak = (1..=steps)
            .map(|t| config.schedule.lr(t))
            .fold(0.0f64, f64::max);
        assert!(
            (peak - lr).abs() < 1e-12 * lr.max(1.0),
            "{name}: peak {peak}"
        );
    }
    let seq = |name| match load(name).task {
        TaskConfig::Pretrain { max_seq, .. } | TaskConfig::Squad { max_seq, .. } => max_seq,
        other => panic!("{other:?}"),
    };
    assert_eq!(seq("paper-onebit-lamb-bert-large-seq512.toml"), 512);
    assert_eq!(seq("paper-onebit-adam-squad.toml"), 384);
    match load("paper-slamb-resnet110-cifar10.toml").optimizer {
        OptimizerConfig::Slamb(c) => assert_eq!((c.beta_3, c.sync_every), (0.99, 50)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn mlp_runs_keep_the_tuned_settings() {
    // A 784-128-10 MLP, 5 epochs of batch 128 at a constant rate picked
    // from a small sweep (LAMB: 0.01 of {0.01, 0.02, 0.05, 0.1}; SGD: 0.05
    // of {0.05, 0.1}), seed 17.
    for (file, optimizer, lr) in [
        (
            "train-mlp-fashion-mnist.toml",
            OptimizerConfig::Adam(AdamConfig::default()),
            1e-3,
        ),
        (
            "train-mlp-fashion-mnist-lamb.toml",
            OptimizerConfig::Lamb(LambConfig::default().with_weight_decay(0.01)),
            0.01,
        ),
        (
            "train-mlp-fashion-mnist-sgd.toml",
            OptimizerConfig::Sgd(SgdConfig::default()),
            0.05,
        ),
    ] {
        let config = load(file);
        assert_eq!(config.optimizer, optimizer, "{file}");
        assert_eq!(config.schedule, LrSchedule::Constant { lr }, "{file}");
        assert_eq!(
            config.model,
            Some(ModelConfig::Mlp(MlpConfig {
                input: 784,
                hidden: vec![128],
                classes: 10,
            })),
            "{file}"
        );
        let t = &config.train;
        assert_eq!(
            (t.steps, t.global_batch, t.micro_batch, t.seed, t.eval_every),
            (5 * (60_000 / 128), 128, 128, 17, 60_000 / 128),
            "{file}"
        );
    }
}

#[test]
fn a_misspelled_field_is_an_error_naming_it() {
    let text = "[task]\nkind = \"image\"\ndataset = \"mnist\"\n\
                [model]\nkind = \"mlp\"\ninput = 784\nhidden = [8]\nclasses = 10\n\
                [optimizer]\nname = \"sgd\"\n[schedule]\nkind = \"constant\"\nlr = 0.1\n\
                [train]\nsteps = 1\nglobal_batch = 4\nmicro_batch = 4\nseed = 1\n\
                learning_rate = 3\n";
    let error = RunConfig::parse(text).unwrap_err();
    assert!(error.contains("learning_rate"), "{error}");
}
