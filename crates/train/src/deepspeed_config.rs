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

/// Reads `text` (the JSON of `path`, for messages) into overrides for a
/// job of `world` ranks (DeepSpeed resolves its batch sizes with it).
///
/// # Errors
/// Malformed JSON, a key that would change the training in a way terse
/// cannot follow, or a value of the wrong type, named with the file.
pub fn translate(path: &str, text: &str, world: usize) -> Result<DeepSpeedConfig, String> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("{path}: {e}"))?;
    let root = root
        .as_object()
        .ok_or_else(|| format!("{path}: not a JSON object"))?;
    refuse_auto(path, root)?;
    let mut out = DeepSpeedConfig::default();
    let at = |key: &str| format!("{path}: `{key}`");
    for (key, value) in root {
        match key.as_str() {
            // Resolved together after the loop (`deepspeed_batch.rs`).
            "train_batch_size"
            | "train_micro_batch_size_per_gpu"
            | "gradient_accumulation_steps" => {}
            // Absent: DeepSpeed 0.19's default, 1.0 (below).
            "gradient_clipping" => {
                let norm = number(value, &at(key))?;
                if norm > 0.0 {
                    out.set("train.max_grad_norm", norm);
                } else {
                    out.overrides.push(Override::unset("train.max_grad_norm"));
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
                // DeepSpeed reads `true` as stage 1 and a numeric string as
                // its number (pydantic's lax parsing).
                let stage = match value {
                    Value::Bool(on) => u64::from(*on),
                    _ => match value.get("stage") {
                        Some(Value::String(text)) => text.trim().parse().map_err(|_| {
                            format!("{}: `stage` {text:?} is not a ZeRO stage", at(key))
                        })?,
                        Some(stage) => stage.as_u64().ok_or_else(|| {
                            format!("{}: `stage` {stage} is not a ZeRO stage", at(key))
                        })?,
                        None => 0,
                    },
                };
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
    out.batch(path, root, world)?;
    if !root.contains_key("gradient_clipping") {
        // DeepSpeed clips at 1.0 unless told otherwise (its
        // GRADIENT_CLIPPING_DEFAULT since 0.19.3; 0 turns it off).
        out.set("train.max_grad_norm", 1.0);
        out.ignored.push(
            "gradient_clipping: absent, so DeepSpeed's default 1.0 (train.max_grad_norm = 1.0; \
             \"gradient_clipping\": 0 turns clipping off)"
                .into(),
        );
    }
    if let Some(scheduler) = root.get("scheduler") {
        out.scheduler(path, scheduler, root)?;
    }
    // DeepSpeed asserts that its LAMB optimizers train under dynamic loss
    // scaling (engine.py: "... requires dynamic loss scaling").
    let static_scale = root
        .get("fp16")
        .filter(|fp16| enabled(fp16))
        .and_then(|fp16| fp16.get("loss_scale"))
        .and_then(Value::as_f64)
        .is_some_and(|scale| scale > 0.0);
    let lamb = root
        .get("optimizer")
        .and_then(|o| o.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|kind| kind.to_ascii_lowercase().contains("lamb"));
    if static_scale && lamb {
        return Err(format!(
            "{path}: `fp16.loss_scale`: a static scale, and DeepSpeed's Lamb and OneBitLamb \
             need fp16's dynamic loss scaling (it refuses this too): set \"loss_scale\": 0"
        ));
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
}

/// A section's `params` object (none: empty), `at` naming it for errors.
pub(crate) fn params_of(value: &Value, at: &str) -> Result<Map<String, Value>, String> {
    match value.get("params") {
        Some(p) => p
            .as_object()
            .cloned()
            .ok_or_else(|| format!("{at}: expected an object")),
        None => Ok(Map::new()),
    }
}

/// A section's `type` string.
pub(crate) fn type_of<'a>(value: &'a Value, at: &str) -> Result<&'a str, String> {
    value
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{at}: expected a string"))
}

/// Refuses HuggingFace's `"auto"` placeholders, naming the first one.
fn refuse_auto(path: &str, root: &serde_json::Map<String, Value>) -> Result<(), String> {
    match first_auto(root, "") {
        Some(key) => Err(format!(
            "{path}: `{key}` is \"auto\", a placeholder HuggingFace's Trainer fills in from \
             its own arguments; terse reads the ds_config alone: write the value"
        )),
        None => Ok(()),
    }
}

/// The dotted key of the first `"auto"` value under `object` (HF's
/// Trainer-integration configs hold them, e.g. `bf16.enabled`: read as
/// "not enabled" it would train silently in another precision).
fn first_auto(object: &serde_json::Map<String, Value>, prefix: &str) -> Option<String> {
    object.iter().find_map(|(key, value)| {
        let key = format!("{prefix}{key}");
        match value {
            Value::String(text) if text == "auto" => Some(key),
            Value::Object(inner) => first_auto(inner, &format!("{key}.")),
            _ => None,
        }
    })
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
        applied_on(text, 1).unwrap()
    }

    /// `text`'s overrides on `world` ranks applied to an empty document, or
    /// the refusal.
    pub(crate) fn applied_on(text: &str, world: usize) -> Result<toml::Table, String> {
        let mut doc = toml::Table::new();
        for o in translate("ds.json", text, world)?.overrides {
            o.apply(&mut doc).unwrap();
        }
        Ok(doc)
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
            freeze_step = 999
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
        let ignored = translate("ds.json", ONEBIT_LAMB, 1).unwrap().ignored;
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

    #[test]
    fn what_terse_cannot_follow_is_refused_by_name() {
        refused(&[
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
                r#"{"zero_optimization": {"stage": "3"}}"#,
                "ds.json: `zero_optimization`: ZeRO stage 3",
            ),
            (
                r#"{"zero_optimization": true}"#,
                "ds.json: `zero_optimization`: ZeRO stage 1",
            ),
            (
                r#"{"fp16": {"enabled": true, "loss_scale": -1}}"#,
                "`fp16.loss_scale`: -1",
            ),
            (
                r#"{"optimizer": {"type": "Lamb"}, "fp16": {"enabled": true, "loss_scale": 128}}"#,
                "need fp16's dynamic loss scaling",
            ),
            (
                r#"{"optimizer": {"type": "ZeroOneBitAdam", "params": {}}}"#,
                "`ZeroOneBitAdam`: terse has adam (AdamW), lamb, onebit_adam",
            ),
            (
                r#"{"optimizer": {"type": "OneBitAdam", "params": {"var_freeze_step": 5}}}"#,
                "`optimizer.params.var_freeze_step`: not a parameter of DeepSpeed's OneBitAdam",
            ),
            (
                r#"{"optimizer": {"type": "Adam", "params": {"amsgrad": true}}}"#,
                "`optimizer.params.amsgrad`: not a parameter of DeepSpeed's Adam that terse's adam has",
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
            (
                r#"{"bf16": {"enabled": "auto"}}"#,
                "`bf16.enabled` is \"auto\", a placeholder HuggingFace's Trainer fills in",
            ),
            (
                r#"{"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}"#,
                "`optimizer.params.lr` is \"auto\"",
            ),
            (
                r#"{"train_batch_size": "auto"}"#,
                "`train_batch_size` is \"auto\"",
            ),
        ]);
    }

    /// Each `(json, says)`: translated on one rank, refused with an error
    /// containing `says`.
    pub(crate) fn refused(cases: &[(&str, &str)]) {
        for (json, says) in cases {
            let error = translate("ds.json", json, 1).unwrap_err();
            assert!(error.contains(says), "{json}: {error}");
        }
    }
}
