//! `--deepspeed`'s `bf16` and `fp16` blocks: `train.precision`, and fp16's
//! loss scaling as DeepSpeed's `FP16_Optimizer` reads the block.

use serde_json::Value;

use crate::deepspeed_config::{DeepSpeedConfig, integer, number};

impl DeepSpeedConfig {
    /// `bf16: { enabled: true }`: `train.precision = "bf16"` (fp32 master
    /// weights and optimizer states, as DeepSpeed's bf16 optimizer keeps).
    pub(crate) fn bf16(&mut self, path: &str, key: &str, value: &Value) -> Result<(), String> {
        self.set("train.precision", "bf16");
        for (field, _) in value.as_object().into_iter().flatten() {
            match field.as_str() {
                "enabled" => {}
                "immediate_grad_update" | "check_grad_overflow" => self.ignored.push(format!(
                    "{key}.{field}: terse's bf16 gradients are fp32 and checked as fp32 runs' are"
                )),
                _ => return Err(format!("{path}: `{key}.{field}`: not a key terse reads")),
            }
        }
        Ok(())
    }

    /// `fp16: { enabled: true, … }`: `train.precision = "fp16"` and its
    /// dynamic loss scaling (`train.loss_scaling`), as DeepSpeed's
    /// `FP16_Optimizer` reads the block.
    pub(crate) fn fp16(&mut self, path: &str, value: &Value) -> Result<(), String> {
        let at = |field: &str| format!("{path}: `fp16.{field}`");
        self.set("train.precision", "fp16");
        let mut scaling = toml::Table::new();
        for (field, v) in value.as_object().into_iter().flatten() {
            match field.as_str() {
                "enabled" => {}
                "loss_scale" => {
                    let scale = number(v, &at(field))?;
                    if scale < 0.0 {
                        return Err(format!(
                            "{}: {scale}: 0 is dynamic loss scaling, a positive number a \
                             static scale (DeepSpeed refuses a negative one too)",
                            at(field)
                        ));
                    }
                    if scale > 0.0 {
                        scaling.insert("static_scale".into(), scale.into());
                    }
                }
                "initial_scale_power" => {
                    scaling.insert("initial_scale_power".into(), integer(v, &at(field))?.into());
                }
                "loss_scale_window" => {
                    scaling.insert("scale_window".into(), integer(v, &at(field))?.into());
                }
                "min_loss_scale" => {
                    scaling.insert("min_scale".into(), number(v, &at(field))?.into());
                }
                "hysteresis" | "consecutive_hysteresis" => self.ignored.push(format!(
                    "fp16.{field}: DeepSpeed's FP16_Optimizer, which its 1-bit optimizers \
                     train under, ignores it too (only ZeRO's scaler reads it)"
                )),
                "auto_cast" => self.ignored.push(
                    "fp16.auto_cast: terse casts the model's inputs and matmuls itself, as \
                     autocast does"
                        .into(),
                ),
                "fp16_master_weights_and_grads" if v.as_bool() == Some(true) => {
                    return Err(format!(
                        "{}: terse keeps the master weights and gradients in fp32",
                        at(field)
                    ));
                }
                "fp16_master_weights_and_grads" => {}
                _ => return Err(format!("{}: not a key terse reads", at(field))),
            }
        }
        if !scaling.is_empty() {
            self.set("train.loss_scaling", scaling);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::deepspeed_config::{tests::applied, translate};

    #[test]
    fn fp16_and_bf16_blocks_set_the_precision_and_the_loss_scaling() {
        let doc = applied(
            r#"{"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
                 "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 0.5}}"#,
        );
        let expected: toml::Table = toml::from_str(
            r#"
            [train]
            precision = "fp16"
            loss_scaling = { initial_scale_power = 12, scale_window = 500, min_scale = 0.5 }
            max_grad_norm = 1.0
            "#,
        )
        .unwrap();
        assert_eq!(doc, expected);
        let ignored = translate(
            "ds.json",
            r#"{"fp16": {"enabled": true, "hysteresis": 2}}"#,
            1,
        )
        .unwrap()
        .ignored;
        assert!(
            ignored.iter().any(|i| i.starts_with("fp16.hysteresis")),
            "{ignored:?}"
        );
        let doc = applied(r#"{"fp16": {"enabled": true, "loss_scale": 128}}"#);
        assert_eq!(doc["train"]["loss_scaling"]["static_scale"], 128.0.into());
        let doc = applied(r#"{"bf16": {"enabled": true}}"#);
        assert_eq!(doc["train"]["precision"], "bf16".into());
        assert!(doc["train"].get("loss_scaling").is_none());
        // The mapped settings are a valid terse train section's.
        let doc = applied(r#"{"fp16": {"enabled": true, "initial_scale_power": 12}}"#);
        let scaling: crate::LossScaling = doc["train"]["loss_scaling"].clone().try_into().unwrap();
        scaling.validate().unwrap();
    }
}
