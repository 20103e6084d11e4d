//! `--deepspeed ds_config.json`: a DeepSpeed config read as terse `--set`
//! overrides on top of the run's own config (which still says what to train
//! and on which data).
//!
//! The keys terse can honour are mapped: the batch sizes, gradient clipping,
//! the optimizer and its params, the warmup schedulers. Keys that would
//! change the training in a way terse cannot follow are refused, each by
//! name: ZeRO, Apex AMP, log warmups. `fp16` and `bf16` set
//! `train.precision` (and fp16's loss scaling).
//! Keys that change nothing here are accepted and listed in one note, for
//! example the logging cadence or the transport.

use serde_json::{Map, Value};

use crate::overrides::Override;

/// A DeepSpeed config as terse overrides, and what was left out.
#[derive(Debug, Default)]
pub struct DeepSpeedConfig {
    /// Applied before the command line's own `--set`s.
    pub overrides: Vec<Override>,
    /// Keys accepted without effect in terse, with the reason.
    pub ignored: Vec<String>,
}

/// DeepSpeed's optimizer `type`s and terse's names for them.
const OPTIMIZERS: &[(&str, &str)] = &[
    ("adam", "adam"),
    ("adamw", "adam"),
    ("lamb", "lamb"),
    ("onebitadam", "onebit_adam"),
    ("onebitlamb", "onebit_lamb"),
    ("zerooneadam", "zero_one_adam"),
];

/// 0/1 Adam's schedule params, the same names in both.
const ZERO_ONE_SCHEDULE: &[&str] = &[
    "var_freeze_step",
    "var_update_scaler",
    "local_step_scaler",
    "local_step_clipper",
];

/// Optimizer params that only change name: (DeepSpeed's, terse's).
const RENAMED: &[(&str, &str)] = &[
    ("eps", "eps"),
    ("weight_decay", "weight_decay"),
    ("max_coeff", "c_max"),
    ("min_coeff", "c_min"),
    ("coeff_beta", "beta_3"),
    ("factor_max", "r_max"),
    ("factor_min", "r_min"),
    ("factor_threshold", "r_threshold"),
];

/// Top-level keys that change nothing in a terse run.
const HARMLESS: &[(&str, &str)] = &[
    ("steps_per_print", "terse logs every step to metrics.jsonl"),
    ("wall_clock_breakdown", "terse times every step"),
    ("tensorboard", "terse always writes TensorBoard events"),
    ("prescale_gradients", "terse averages after the allreduce"),
    (
        "gradient_predivide_factor",
        "terse averages after the allreduce",
    ),
];

/// Reads `text` (the JSON of `path`, for messages) into overrides.
///
/// # Errors
/// Malformed JSON, a key that would change the training in a way terse
/// cannot follow, or a value of the wrong type, named with the file.
pub fn translate(path: &str, text: &str) -> Result<DeepSpeedConfig, String> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("{path}: {e}"))?;
    let root = root
        .as_object()
        .ok_or_else(|| format!("{path}: not a JSON object"))?;
    let mut out = DeepSpeedConfig::default();
    let at = |key: &str| format!("{path}: `{key}`");
    for (key, value) in root {
        match key.as_str() {
            "train_batch_size" => {
                out.set("train.global_batch", integer(value, &at(key))?);
            }
            "train_micro_batch_size_per_gpu" => {
                out.set("train.micro_batch", integer(value, &at(key))?);
            }
            "gradient_accumulation_steps" => out.ignored.push(format!(
                "{key}: terse derives it from the global batch, the micro-batch and the ranks"
            )),
            "gradient_clipping" => {
                let norm = number(value, &at(key))?;
                if norm > 0.0 {
                    out.set("train.max_grad_norm", norm);
                }
            }
            "optimizer" => out.optimizer(path, value)?,
            // Read after the loop: it replaces the optimizer's `lr`
            // whichever comes first in the file.
            "scheduler" => {}
            "bf16" | "bfloat16" if enabled(value) => out.bf16(path, key, value)?,
            "fp16" if enabled(value) => out.fp16(path, value)?,
            "amp" if enabled(value) => {
                return Err(format!(
                    "{}: NVIDIA Apex AMP: terse has bf16 and fp16 (DeepSpeed's `bf16` and \
                     `fp16` blocks, or --precision)",
                    at(key)
                ));
            }
            "fp16" | "bf16" | "bfloat16" | "amp" => {
                out.ignored.push(format!("{key}: not enabled"));
            }
            "zero_optimization" => {
                let stage = value.get("stage").and_then(Value::as_u64).unwrap_or(0);
                if stage > 0 {
                    return Err(format!(
                        "{}: ZeRO stage {stage}: terse keeps every rank's optimizer state \
                         whole (data parallelism only)",
                        at(key)
                    ));
                }
                out.ignored.push(format!("{key}: stage 0"));
            }
            other => match HARMLESS.iter().find(|(k, _)| *k == other) {
                Some((_, why)) => out.ignored.push(format!("{other}: {why}")),
                None => {
                    return Err(format!(
                        "{}: not a key terse reads; remove it, or set its terse equivalent \
                         with --set",
                        at(key)
                    ));
                }
            },
        }
    }
    if let Some(scheduler) = root.get("scheduler") {
        out.scheduler(path, scheduler)?;
    }
    let half = ["fp16", "bf16", "bfloat16"].map(|k| root.get(k).is_some_and(enabled));
    if half.iter().filter(|&&on| on).count() > 1 {
        return Err(format!(
            "{path}: `fp16` and `bf16` are both enabled (DeepSpeed refuses this too): enable one"
        ));
    }
    Ok(out)
}

impl DeepSpeedConfig {
    pub(crate) fn set(&mut self, key: &str, value: impl Into<toml::Value>) {
        self.overrides.push(Override::new(key, value));
    }

    /// `optimizer: { type, params }`: the optimizer table, and a constant
    /// rate from `params.lr` (a `scheduler` read later replaces it).
    fn optimizer(&mut self, path: &str, value: &Value) -> Result<(), String> {
        let at = |key: &str| format!("{path}: `optimizer.{key}`");
        let kind = type_of(value, &at("type"))?;
        let lower = kind.to_ascii_lowercase();
        let Some((_, name)) = OPTIMIZERS.iter().find(|(ds, _)| *ds == lower) else {
            return Err(format!(
                "{}: `{kind}`: terse has adam (AdamW), lamb, onebit_adam, onebit_lamb and \
                 zero_one_adam (DeepSpeed's Adam, AdamW, Lamb, OneBitAdam, OneBitLamb and \
                 ZeroOneAdam)",
                at("type")
            ));
        };
        let mut table = toml::Table::new();
        table.insert("name".into(), (*name).into());
        // DeepSpeed's 1-bit optimizers: its arithmetic (the compressed
        // allreduce's geometry, no bias correction), except for the
        // coordinates no gradient reaches, which DeepSpeed leaves to an
        // `exp_avg_mask` set in the training script (not in this file).
        let onebit = name.contains("onebit") || *name == "zero_one_adam";
        if onebit {
            table.insert("scale".into(), "deepspeed".into());
            table.insert("bias_correction".into(), false.into());
            if *name == "onebit_lamb" {
                table.insert("decay_blend".into(), true.into());
            }
            self.ignored.push(format!(
                "optimizer: DeepSpeed's exp_avg_mask is set in a training script, not in \
                 {path}: terse's {name} holds every coordinate with a frozen variance of zero \
                 still (hold_zero_variance = true), which covers the position-embedding rows \
                 DeepSpeedExamples masks; for DeepSpeed's exact arithmetic set \
                 hold_zero_variance = false and momentum_mask = [\"<parameter>[<rows>]\", ...]"
            ));
        }
        let empty = Map::new();
        let params = match value.get("params") {
            Some(p) => p
                .as_object()
                .ok_or_else(|| format!("{}: expected an object", at("params")))?,
            None => &empty,
        };
        for (key, v) in params {
            let here = at(&format!("params.{key}"));
            match key.as_str() {
                "lr" => self.set(
                    "schedule",
                    toml::Table::from_iter([
                        ("kind".to_string(), toml::Value::from("constant")),
                        ("lr".to_string(), number(v, &here)?.into()),
                    ]),
                ),
                "betas" => {
                    let pair = v
                        .as_array()
                        .filter(|a| a.len() == 2)
                        .ok_or_else(|| format!("{here}: expected [beta_1, beta_2]"))?;
                    table.insert("beta_1".into(), number(&pair[0], &here)?.into());
                    table.insert("beta_2".into(), number(&pair[1], &here)?.into());
                }
                "bias_correction" if onebit => self.ignored.push(format!(
                    "optimizer.params.{key}: DeepSpeed's {kind} reads it but applies no bias \
                     correction either way; terse's {name} runs with bias_correction = false"
                )),
                key if *name == "zero_one_adam" && ZERO_ONE_SCHEDULE.contains(&key) => {
                    table.insert(key.into(), integer(v, &here)?.into());
                }
                "bias_correction" => {
                    let on = v
                        .as_bool()
                        .ok_or_else(|| format!("{here}: expected true or false"))?;
                    table.insert("bias_correction".into(), on.into());
                }
                "freeze_step" => {
                    table.insert("freeze_step".into(), integer(v, &here)?.into());
                }
                "adam_w_mode" if v.as_bool() == Some(false) => {
                    return Err(format!(
                        "{here}: false (L2 in the gradient): terse's Adam decays weights \
                         decoupled (AdamW) only"
                    ));
                }
                "adam_w_mode" => {}
                "cuda_aware" | "comm_backend_name" => self.ignored.push(format!(
                    "optimizer.params.{key}: terse picks its transport with --comm"
                )),
                "max_grad_norm" | "eps_inside_sqrt" => self.ignored.push(format!(
                    "optimizer.params.{key}: DeepSpeed's 1-bit optimizers never read it"
                )),
                _ => match RENAMED.iter().find(|(ds, _)| ds == key) {
                    Some((_, field)) => {
                        table.insert((*field).into(), number(v, &here)?.into());
                    }
                    None => {
                        return Err(format!("{here}: not a parameter terse's {name} has"));
                    }
                },
            }
        }
        self.set("optimizer", table);
        Ok(())
    }

    /// `scheduler: { type, params }`: WarmupLR and WarmupDecayLR with a
    /// linear warmup from 0 (terse's warmups start there).
    fn scheduler(&mut self, path: &str, value: &Value) -> Result<(), String> {
        let at = |key: &str| format!("{path}: `scheduler.{key}`");
        let kind = type_of(value, &at("type"))?;
        if !matches!(kind, "WarmupLR" | "WarmupDecayLR") {
            return Err(format!(
                "{}: `{kind}`: terse maps WarmupLR and WarmupDecayLR (other shapes: set \
                 [schedule] in the terse config)",
                at("type")
            ));
        }
        let params = value.get("params").cloned().unwrap_or(Value::Null);
        let get = |key: &str, default: f64| -> Result<f64, String> {
            params
                .get(key)
                .map_or(Ok(default), |v| number(v, &at(&format!("params.{key}"))))
        };
        let warmup_type = params
            .get("warmup_type")
            .and_then(Value::as_str)
            .unwrap_or("log");
        if warmup_type != "linear" {
            return Err(format!(
                "{}: `{warmup_type}` (DeepSpeed's default is log): terse warms up linearly \
                 only; set \"warmup_type\": \"linear\"",
                at("params.warmup_type")
            ));
        }
        if get("warmup_min_lr", 0.0)? != 0.0 {
            return Err(format!(
                "{}: terse's linear warmups start from 0",
                at("params.warmup_min_lr")
            ));
        }
        let peak = get("warmup_max_lr", 1e-3)?;
        let warmup = get("warmup_num_steps", 1000.0)? as i64;
        let mut table = toml::Table::new();
        table.insert("peak".into(), peak.into());
        table.insert("warmup_steps".into(), warmup.into());
        match kind {
            // Constant after the warmup: a step decay by 1.
            "WarmupLR" => {
                table.insert("kind".into(), "linear_warmup_step_decay".into());
                table.insert("gamma".into(), 1.0.into());
                table.insert("decay_every".into(), 1.into());
            }
            // WarmupDecayLR: linear decay to 0 at `total_num_steps`.
            _ => {
                let total = params
                    .get("total_num_steps")
                    .ok_or_else(|| format!("{}: required", at("params.total_num_steps")))
                    .and_then(|v| integer(v, &at("params.total_num_steps")))?;
                table.insert("kind".into(), "linear_warmup_linear_decay".into());
                table.insert("total_steps".into(), total.into());
            }
        }
        self.set("schedule", table);
        Ok(())
    }
}

/// A section's `type` string.
fn type_of<'a>(value: &'a Value, at: &str) -> Result<&'a str, String> {
    value
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{at}: expected a string"))
}

fn enabled(value: &Value) -> bool {
    value
        .get("enabled")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

pub(crate) fn number(value: &Value, at: &str) -> Result<f64, String> {
    value
        .as_f64()
        .ok_or_else(|| format!("{at}: expected a number, got {value}"))
}

pub(crate) fn integer(value: &Value, at: &str) -> Result<i64, String> {
    value
        .as_u64()
        .and_then(|n| i64::try_from(n).ok())
        .ok_or_else(|| format!("{at}: expected a non-negative integer, got {value}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// DeepSpeedExamples' BERT 1-bit LAMB config (bing_bert, seq 128, NCCL),
    /// with fp16 turned off.
    const ONEBIT_LAMB: &str = r#"{
      "train_batch_size": 65536,
      "train_micro_batch_size_per_gpu": 64,
      "steps_per_print": 1000,
      "prescale_gradients": false,
      "optimizer": {
        "type": "OneBitLamb",
        "params": {
          "lr": 11e-3, "weight_decay": 0.01, "bias_correction": false,
          "max_coeff": 0.3, "min_coeff": 0.01, "freeze_step": 1000,
          "cuda_aware": false, "comm_backend_name": "nccl", "coeff_beta": 0.9,
          "factor_max": 4.0, "factor_min": 0.5, "factor_threshold": 0.1
        }
      },
      "gradient_clipping": 1.0,
      "wall_clock_breakdown": false,
      "fp16": { "enabled": false, "loss_scale": 0, "initial_scale_power": 16 }
    }"#;

    pub(crate) fn applied(text: &str) -> toml::Table {
        let mut doc = toml::Table::new();
        for o in translate("ds.json", text).unwrap().overrides {
            o.apply(&mut doc).unwrap();
        }
        doc
    }

    #[test]
    fn deepspeed_examples_onebit_lamb_maps_every_value() {
        let doc = applied(ONEBIT_LAMB);
        let expected: toml::Table = toml::from_str(
            r#"
            [train]
            global_batch = 65536
            micro_batch = 64
            max_grad_norm = 1.0
            [optimizer]
            name = "onebit_lamb"
            scale = "deepspeed"
            decay_blend = true
            weight_decay = 0.01
            bias_correction = false
            c_max = 0.3
            c_min = 0.01
            freeze_step = 1000
            beta_3 = 0.9
            r_max = 4.0
            r_min = 0.5
            r_threshold = 0.1
            [schedule]
            kind = "constant"
            lr = 0.011
            "#,
        )
        .unwrap();
        assert_eq!(doc, expected);
        let ignored = translate("ds.json", ONEBIT_LAMB).unwrap().ignored;
        for key in [
            "steps_per_print",
            "prescale_gradients",
            "wall_clock_breakdown",
            "fp16",
            "optimizer.params.cuda_aware",
            "optimizer.params.comm_backend_name",
        ] {
            assert!(
                ignored.iter().any(|i| i.starts_with(key)),
                "{key}: {ignored:?}"
            );
        }
    }

    /// A 0/1 Adam config in the shape of DeepSpeed's 0/1 Adam tutorial
    /// (its BERT pre-training settings).
    #[test]
    fn zero_one_adam_maps_its_schedule_params() {
        let json = r#"{"optimizer": {"type": "ZeroOneAdam", "params": {
            "lr": 4e-4, "weight_decay": 0.01, "bias_correction": false,
            "var_freeze_step": 12500, "var_update_scaler": 16,
            "local_step_scaler": 32678, "local_step_clipper": 16,
            "cuda_aware": false, "comm_backend_name": "nccl"}}}"#;
        let expected: toml::Table = toml::from_str(
            r#"
            [optimizer]
            name = "zero_one_adam"
            scale = "deepspeed"
            bias_correction = false
            weight_decay = 0.01
            var_freeze_step = 12500
            var_update_scaler = 16
            local_step_scaler = 32678
            local_step_clipper = 16
            [schedule]
            kind = "constant"
            lr = 0.0004
            "#,
        )
        .unwrap();
        let doc = applied(json);
        assert_eq!(doc, expected);
        let ignored = translate("ds.json", json).unwrap().ignored;
        assert!(
            ignored.iter().any(|i| i
                .starts_with("optimizer.params.bias_correction: DeepSpeed's ZeroOneAdam")
                && i.contains("bias_correction = false")),
            "{ignored:?}"
        );
        // The mapped table is a valid terse optimizer config.
        let table = doc["optimizer"].clone();
        let config: terse_optim::OptimizerConfig = table.try_into().unwrap();
        config.validate().unwrap();
    }

    #[test]
    fn what_terse_cannot_follow_is_refused_by_name() {
        for (json, says) in [
            (
                r#"{"amp": {"enabled": true}}"#,
                "ds.json: `amp`: NVIDIA Apex AMP",
            ),
            (
                r#"{"fp16": {"enabled": true}, "bf16": {"enabled": true}}"#,
                "`fp16` and `bf16` are both enabled",
            ),
            (
                r#"{"fp16": {"enabled": true, "fp16_master_weights_and_grads": true}}"#,
                "`fp16.fp16_master_weights_and_grads`: terse keeps the master weights",
            ),
            (
                r#"{"zero_optimization": {"stage": 2}}"#,
                "ds.json: `zero_optimization`: ZeRO stage 2",
            ),
            (
                r#"{"optimizer": {"type": "ZeroOneBitAdam", "params": {}}}"#,
                "`ZeroOneBitAdam`: terse has adam (AdamW), lamb, onebit_adam",
            ),
            (
                r#"{"optimizer": {"type": "OneBitAdam", "params": {"var_freeze_step": 5}}}"#,
                "`optimizer.params.var_freeze_step`: not a parameter terse's onebit_adam has",
            ),
            (
                r#"{"optimizer": {"type": "Adam", "params": {"amsgrad": true}}}"#,
                "`optimizer.params.amsgrad`: not a parameter terse's adam has",
            ),
            (
                r#"{"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3}}}"#,
                "`log` (DeepSpeed's default is log)",
            ),
            (
                r#"{"sparse_attention": {}}"#,
                "`sparse_attention`: not a key terse reads",
            ),
            (
                r#"{"train_batch_size": "big"}"#,
                "expected a non-negative integer",
            ),
            ("{", "ds.json: EOF"),
        ] {
            let error = translate("ds.json", json).unwrap_err();
            assert!(error.contains(says), "{json}: {error}");
        }
    }

    #[test]
    fn warmup_schedulers_become_terse_schedules() {
        let doc = applied(
            r#"{"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.98]}},
                "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_type": "linear",
                  "warmup_max_lr": 2e-4, "warmup_num_steps": 10, "total_num_steps": 100}}}"#,
        );
        let expected: toml::Table = toml::from_str(
            r#"
            [optimizer]
            name = "adam"
            beta_1 = 0.9
            beta_2 = 0.98
            [schedule]
            kind = "linear_warmup_linear_decay"
            peak = 2e-4
            warmup_steps = 10
            total_steps = 100
            "#,
        )
        .unwrap();
        assert_eq!(doc, expected);
        let doc = applied(
            r#"{"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear",
                 "warmup_max_lr": 3e-4, "warmup_num_steps": 5}}}"#,
        );
        assert_eq!(
            doc["schedule"]["kind"].as_str(),
            Some("linear_warmup_step_decay")
        );
        assert_eq!(doc["schedule"]["gamma"].as_float(), Some(1.0));
    }
}
