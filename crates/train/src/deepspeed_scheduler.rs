//! `--deepspeed`'s `scheduler` block: DeepSpeed 0.19's `WarmupLR` and
//! `WarmupDecayLR` with a linear warmup from 0, as terse schedules, their
//! params checked as DeepSpeed's constructors check them.

use serde_json::{Map, Value};

use crate::deepspeed_config::{DeepSpeedConfig, integer, number, params_of, type_of};

/// The params each scheduler's constructor takes (`lr_schedules.py`): any
/// other is a `TypeError` in DeepSpeed.
const WARMUP_LR: &[&str] = &[
    "warmup_min_lr",
    "warmup_max_lr",
    "warmup_num_steps",
    "warmup_type",
    "last_batch_iteration",
];

impl DeepSpeedConfig {
    /// `scheduler: { type, params }` of the file whose top level is `root`
    /// (WarmupLR's peak defaults to the optimizer's `lr`).
    pub(crate) fn scheduler(
        &mut self,
        path: &str,
        value: &Value,
        root: &Map<String, Value>,
    ) -> Result<(), String> {
        let at = |key: &str| format!("{path}: `scheduler.{key}`");
        let kind = type_of(value, &at("type"))?;
        if !matches!(kind, "WarmupLR" | "WarmupDecayLR") {
            return Err(format!(
                "{}: `{kind}`: terse maps WarmupLR and WarmupDecayLR (other shapes: set \
                 [schedule] in the terse config)",
                at("type")
            ));
        }
        let params = &params_of(value, &at("params"))?;
        for key in params.keys() {
            let known = WARMUP_LR.contains(&key.as_str())
                || (kind == "WarmupDecayLR" && key == "total_num_steps");
            if !known {
                return Err(format!(
                    "{}: not a parameter of DeepSpeed's {kind} (it would refuse it too)",
                    at(&format!("params.{key}"))
                ));
            }
        }
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
        if params.contains_key("last_batch_iteration") {
            return Err(format!(
                "{}: terse resumes a schedule from its checkpoint (--resume)",
                at("params.last_batch_iteration")
            ));
        }
        // WarmupLR without a peak rises to the optimizer's `lr`;
        // WarmupDecayLR's default is 0.001.
        // (An optimizer block without `lr` runs at its constructor's
        // 1e-3; without an optimizer block the lr is the training
        // script's, which a ds_config alone does not say.)
        let optimizer = root.get("optimizer");
        let optimizer_lr = optimizer
            .and_then(|o| o.get("params"))
            .and_then(|p| p.get("lr"))
            .and_then(Value::as_f64);
        let default_peak = match (kind, optimizer, optimizer_lr) {
            ("WarmupLR", _, Some(lr)) => lr,
            ("WarmupLR", None, None) if !params.contains_key("warmup_max_lr") => {
                return Err(format!(
                    "{}: WarmupLR without it rises to the optimizer's lr, and {path} has no \
                     optimizer block to say it: set warmup_max_lr",
                    at("params.warmup_max_lr")
                ));
            }
            _ => 1e-3,
        };
        let peak = get("warmup_max_lr", default_peak)?;
        let warmup = match params.get("warmup_num_steps") {
            Some(v) => integer(v, &at("params.warmup_num_steps")).and_then(|n| {
                if n == 0 {
                    Err(format!(
                        "{}: must be a positive integer (DeepSpeed's check)",
                        at("params.warmup_num_steps")
                    ))
                } else {
                    Ok(n)
                }
            })?,
            None => 1000,
        };
        // DeepSpeed warms up over at least 2 steps.
        let warmup = warmup.max(2);
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
        self.ignored.push(format!(
            "scheduler: DeepSpeed's {kind} runs its first two steps at warmup_min_lr (it starts \
             stepping after the first) and reaches the peak at step {}; terse's step t runs at \
             peak·t/{warmup}, the peak at step {warmup}",
            warmup + 2
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::deepspeed_config::tests::{applied, refused};

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
            [train]
            max_grad_norm = 1.0
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

    /// WarmupLR's `warmup_max_lr` defaults to the optimizer's `lr`
    /// (`lr_schedules.py`: `None` → each group's lr), WarmupDecayLR's to
    /// 0.001; DeepSpeed warms up over at least 2 steps.
    #[test]
    fn warmup_lr_rises_to_the_optimizer_s_lr_by_default() {
        let doc = applied(
            r#"{"optimizer": {"type": "AdamW", "params": {"lr": 5e-5}},
                "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear",
                  "warmup_num_steps": 1}}}"#,
        );
        assert_eq!(doc["schedule"]["peak"].as_float(), Some(5e-5));
        assert_eq!(doc["schedule"]["warmup_steps"].as_integer(), Some(2));
        let decay = applied(
            r#"{"optimizer": {"type": "AdamW", "params": {"lr": 5e-5}},
                "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_type": "linear",
                  "total_num_steps": 4000}}}"#,
        );
        assert_eq!(decay["schedule"]["peak"].as_float(), Some(1e-3));
        // An optimizer without lr runs at its constructor's 1e-3, and so
        // does WarmupLR's peak; without an optimizer block the training
        // script's lr, which the file does not say, would be the peak.
        let constant = applied(r#"{"optimizer": {"type": "AdamW"}}"#);
        assert_eq!(constant["schedule"]["lr"].as_float(), Some(1e-3));
        let warmup = applied(
            r#"{"optimizer": {"type": "AdamW"},
                "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear"}}}"#,
        );
        assert_eq!(warmup["schedule"]["peak"].as_float(), Some(1e-3));
        refused(&[(
            r#"{"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear"}}}"#,
            "has no optimizer block to say it: set warmup_max_lr",
        )]);
    }

    #[test]
    fn scheduler_params_deepspeed_refuses_are_refused() {
        refused(&[
            (
                r#"{"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear",
                    "total_num_steps": 1000}}}"#,
                "`scheduler.params.total_num_steps`: not a parameter of DeepSpeed's WarmupLR",
            ),
            (
                r#"{"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear",
                    "warmup_num_step": 10}}}"#,
                "`scheduler.params.warmup_num_step`: not a parameter",
            ),
            (
                r#"{"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear",
                    "warmup_max_lr": 1e-3, "warmup_num_steps": 0}}}"#,
                "must be a positive integer",
            ),
            (
                r#"{"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear",
                    "warmup_max_lr": 1e-3, "warmup_num_steps": 2.5}}}"#,
                "expected a non-negative integer",
            ),
        ]);
    }
}
