//! Every model, dataset and task `terse` accepts goes through `cargo xtask`
//! to `terse` unchanged: xtask keeps no list of its own that could fall
//! behind terse's registries (terse-models' depths, terse-train's datasets
//! and stand-in tasks, terse-data's GLUE tasks, BERT's presets).
//!
//! Each case runs the real xtask binary with `--print-config`, which builds
//! and runs the real `terse` (one process) on the forwarded arguments: terse
//! resolves the config, checks that the command line's model, dataset or
//! task agrees with it, prints it and exits without loading data. The
//! printed config must name what the command line named.

use std::path::{Path, PathBuf};
use std::process::Command;

use terse_models::bert::BertPreset;
use terse_models::{ResnetDepth, VggDepth};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `cargo xtask ARGS --print-config`; its stdout (the resolved config)
/// on success, a panic with its stderr otherwise.
fn resolved(args: &[&str]) -> toml::Table {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .arg("--print-config")
        .current_dir(workspace())
        .env("NO_COLOR", "1")
        .output()
        .expect("the xtask binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo xtask {}: {}\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let start = stdout
        .find("[task]")
        .unwrap_or_else(|| panic!("no config printed: {stdout}"));
    stdout[start..]
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn field<'a>(config: &'a toml::Table, table: &str, key: &str) -> &'a toml::Value {
    config[table]
        .get(key)
        .unwrap_or_else(|| panic!("no {table}.{key} in {config}"))
}

/// A variant's config name (`resnet56`, `vgg16`, `bert-tiny`).
fn name(value: impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

/// `configs/train-resnet20-fashion-mnist.toml` with `[model]` replaced by
/// `model` and the dataset set to `dataset`, written into `dir`.
fn image_config(dir: &Path, model: toml::Table, dataset: &str) -> PathBuf {
    let base = workspace().join("configs/train-resnet20-fashion-mnist.toml");
    let mut config: toml::Table = std::fs::read_to_string(base).unwrap().parse().unwrap();
    config.insert("model".into(), model.into());
    config["task"]
        .as_table_mut()
        .unwrap()
        .insert("dataset".into(), dataset.into());
    let path = dir.join(format!("{}-{dataset}.toml", config["model"]["kind"]));
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    path
}

#[test]
fn train_takes_every_image_model_and_every_dataset() {
    let scratch = tempfile::Builder::new()
        .prefix("terse-forwarding-")
        .tempdir()
        .unwrap();
    let mut models: Vec<(String, toml::Table)> = Vec::new();
    for depth in ResnetDepth::ALL {
        let table = toml::toml! { kind = "resnet" in_channels = 3 classes = 10 };
        models.push((name(depth), table));
    }
    for depth in VggDepth::ALL {
        let table = toml::toml! { kind = "vgg" in_channels = 3 classes = 10 };
        models.push((name(depth), table));
    }
    let mlp = toml::toml! { kind = "mlp" input = 784 hidden = [16] classes = 10 };
    models.push(("mlp".into(), mlp));
    let datasets = terse_train::tasks::IMAGE_DATASETS;
    assert!(models.len() >= datasets.len(), "cover every dataset");
    // Every model once and every dataset at least once (in turn).
    for (i, (model, mut table)) in models.into_iter().enumerate() {
        if model != "mlp" {
            table.insert("depth".into(), model.clone().into());
        }
        let dataset = datasets[i % datasets.len()];
        let config = image_config(scratch.path(), table, dataset);
        let config = config.to_str().unwrap();
        let resolved = resolved(&["train", &model, "--dataset", dataset, "--config", config]);
        assert_eq!(field(&resolved, "task", "dataset").as_str(), Some(dataset));
        if model != "mlp" {
            assert_eq!(
                field(&resolved, "model", "depth").as_str(),
                Some(model.as_str())
            );
        }
    }
}

#[test]
fn pretrain_takes_every_bert_preset() {
    // The shipped presets by name, and every preset terse has through a
    // config (as `--set` writes it).
    for preset in ["bert-large", "bert-base", "minilm-l6", "bert-tiny"] {
        let resolved = resolved(&["pretrain", preset]);
        assert_eq!(field(&resolved, "task", "kind").as_str(), Some("pretrain"));
    }
    for preset in BertPreset::ALL {
        let preset = preset.name();
        let set = format!("model.preset=\"{preset}\"");
        let resolved = resolved(&["pretrain", "bert-tiny", "--set", &set]);
        let want = BertPreset::ALL
            .into_iter()
            .find(|p| p.name() == preset)
            .unwrap()
            .config();
        assert_eq!(
            field(&resolved, "model", "hidden_size").as_integer(),
            Some(want.hidden_size as i64),
            "{preset}"
        );
    }
}

/// `reproduce onebit-adam --model P --print-commands`: every preset terse
/// has reaches each variant's command line (after terse resolved each
/// variant's config), and one it lacks is refused by terse, with its list.
#[test]
fn reproduce_takes_every_bert_preset() {
    let print = |preset: &str| {
        Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(["reproduce", "onebit-adam", "--model", preset])
            .arg("--print-commands")
            .current_dir(workspace())
            .env("NO_COLOR", "1")
            .output()
            .expect("the xtask binary runs")
    };
    for preset in BertPreset::ALL {
        let output = print(preset.name());
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{}: {}",
            preset.name(),
            String::from_utf8_lossy(&output.stderr)
        );
        let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("terse ")).collect();
        assert_eq!(lines.len(), 5, "{stdout}");
        let set = format!("--set model.preset={} ", preset.name());
        assert!(lines.iter().all(|l| l.contains(&set)), "{stdout}");
    }
    let output = print("huge");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unknown variant `huge`") && stderr.contains("`xlarge`"),
        "{stderr}"
    );
}

#[test]
fn finetune_takes_every_sentence_task_and_squad() {
    let mut tasks: Vec<String> = terse_train::tasks::STAND_IN_TASKS
        .iter()
        .map(|t| t.to_string())
        .collect();
    tasks.extend(
        terse_data::GlueTask::ALL
            .iter()
            .map(|t| t.dir_name().to_lowercase().replace('-', "")),
    );
    for task in &tasks {
        let set = format!("task.task=\"{task}\"");
        let resolved = resolved(&[
            "finetune",
            "glue",
            "--task",
            task,
            "--config",
            "configs/finetune-rt-polarity.toml",
            "--set",
            &set,
        ]);
        assert_eq!(
            field(&resolved, "task", "task").as_str(),
            Some(task.as_str())
        );
    }
    let resolved = resolved(&["finetune", "squad"]);
    assert_eq!(field(&resolved, "task", "kind").as_str(), Some("squad"));
}

#[test]
fn the_device_goes_through_to_the_config() {
    for device in ["lavapipe", "wgpu", "wgpu:1", "cpu"] {
        let resolved = resolved(&["pretrain", "bert-tiny", "--device", device]);
        let got = resolved["train"].get("device").and_then(|d| d.as_str());
        // `cpu`, the default, is left out of the written config.
        let want = (device != "cpu").then_some(device);
        assert_eq!(got, want, "--device {device}");
    }
}
