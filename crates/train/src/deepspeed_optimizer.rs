//! `--deepspeed`'s `optimizer` block: DeepSpeed 0.19's optimizer `type` as
//! terse's optimizer, its `params` as that optimizer's fields, and
//! DeepSpeed's defaults for the params a file leaves out where terse's
//! own differ (a file means what DeepSpeed would run, not what terse's
//! defaults would).

use serde_json::{Map, Value};

use crate::deepspeed_config::{DeepSpeedConfig, integer, number, params_of, type_of};

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

/// DeepSpeed's `freeze_step` default of `OnebitAdam` and `OnebitLamb`
/// (`deepspeed/runtime/fp16/onebit/adam.py`, `lamb.py`).
const DEEPSPEED_FREEZE_STEP: i64 = 100_000;

/// The trust ratio's upper clip of `FusedLamb` and `OnebitLamb`
/// (`max_coeff`; terse's LAMB default is the 1-bit LAMB paper's 0.3).
const DEEPSPEED_MAX_COEFF: f64 = 10.0;

/// Whether terse's optimizer `name` is one of DeepSpeed's compressed ones
/// (1-bit Adam, 1-bit LAMB, 0/1 Adam).
fn compresses(name: &str) -> bool {
    name.contains("onebit") || name == "zero_one_adam"
}

impl DeepSpeedConfig {
    /// `optimizer: { type, params }`: the optimizer table, and a constant
    /// rate from `params.lr` (a `scheduler` read later replaces it).
    pub(crate) fn optimizer(&mut self, path: &str, value: &Value) -> Result<(), String> {
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
        let onebit = compresses(name);
        if onebit {
            self.onebit_settings(path, name, &mut table);
        }
        let params = &params_of(value, &at("params"))?;
        for (key, v) in params {
            let here = at(&format!("params.{key}"));
            self.param(name, kind, key, v, &here, &mut table)?;
        }
        self.deepspeed_defaults(name, kind, params, &mut table);
        self.set("optimizer", table);
        Ok(())
    }

    /// What DeepSpeed's 1-bit optimizers fix: its arithmetic (the
    /// compressed allreduce's geometry, no bias correction), except for the
    /// coordinates no gradient reaches, which DeepSpeed leaves to an
    /// `exp_avg_mask` set in the training script (not in the file).
    fn onebit_settings(&mut self, path: &str, name: &str, table: &mut toml::Table) {
        table.insert("scale".into(), "deepspeed".into());
        table.insert("bias_correction".into(), false.into());
        if name == "onebit_lamb" {
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

    /// One of `params`: `key` = `v` of DeepSpeed's `kind` (terse's `name`).
    fn param(
        &mut self,
        name: &str,
        kind: &str,
        key: &str,
        v: &Value,
        here: &str,
        table: &mut toml::Table,
    ) -> Result<(), String> {
        let onebit = compresses(name);
        match key {
            "lr" => self.set(
                "schedule",
                toml::Table::from_iter([
                    ("kind".to_string(), toml::Value::from("constant")),
                    ("lr".to_string(), number(v, here)?.into()),
                ]),
            ),
            "betas" => {
                let pair = v
                    .as_array()
                    .filter(|a| a.len() == 2)
                    .ok_or_else(|| format!("{here}: expected [beta_1, beta_2]"))?;
                table.insert("beta_1".into(), number(&pair[0], here)?.into());
                table.insert("beta_2".into(), number(&pair[1], here)?.into());
            }
            // DeepSpeed's engine refuses it for every optimizer type.
            "max_grad_norm" => {
                return Err(format!(
                    "{here}: DeepSpeed refuses it as an optimizer parameter too: use the \
                     top-level `gradient_clipping`"
                ));
            }
            "bias_correction" if onebit => self.ignored.push(format!(
                "optimizer.params.{key}: DeepSpeed's {kind} reads it but applies no bias \
                 correction either way; terse's {name} runs with bias_correction = false"
            )),
            key if name == "zero_one_adam" && ZERO_ONE_SCHEDULE.contains(&key) => {
                table.insert(key.into(), integer(v, here)?.into());
            }
            "bias_correction" => {
                let on = v
                    .as_bool()
                    .ok_or_else(|| format!("{here}: expected true or false"))?;
                table.insert("bias_correction".into(), on.into());
            }
            "freeze_step" if matches!(name, "onebit_adam" | "onebit_lamb") => {
                let freeze = self.freeze_step(kind, integer(v, here)?);
                table.insert("freeze_step".into(), freeze.into());
            }
            // DeepSpeed's AdamW is AdamW whatever adam_w_mode says
            // (`name == adamw or adam_w_mode`); its Adam follows it.
            "adam_w_mode" if kind.eq_ignore_ascii_case("adam") && v.as_bool() == Some(false) => {
                return Err(format!(
                    "{here}: false (L2 in the gradient): terse's Adam decays weights \
                     decoupled (AdamW) only"
                ));
            }
            "adam_w_mode" if name == "adam" => {}
            "torch_adam" if name == "adam" => self.ignored.push(format!(
                "optimizer.params.{key}: torch's AdamW and DeepSpeed's FusedAdam are the same \
                 arithmetic; terse runs its own"
            )),
            "cuda_aware" | "comm_backend_name" if onebit => self.ignored.push(format!(
                "optimizer.params.{key}: terse picks its transport with --comm"
            )),
            // FusedLamb's ε placement; the 1-bit optimizers take the
            // argument and never read it.
            "eps_inside_sqrt" if name == "lamb" => {
                if v.as_bool()
                    .ok_or_else(|| format!("{here}: expected true or false"))?
                {
                    table.insert("eps_mode".into(), "inside".into());
                }
            }
            "eps_inside_sqrt" if onebit => self.ignored.push(format!(
                "optimizer.params.{key}: DeepSpeed's {kind} never reads it"
            )),
            _ => match RENAMED.iter().find(|(ds, _)| *ds == key) {
                Some((_, field)) => {
                    table.insert((*field).into(), number(v, here)?.into());
                }
                None => {
                    return Err(format!(
                        "{here}: not a parameter of DeepSpeed's {kind} that terse's {name} has"
                    ));
                }
            },
        }
        Ok(())
    }

    /// DeepSpeed's `freeze_step` as terse's: DeepSpeed's first `step()` of
    /// OnebitAdam and OnebitLamb only sets up its buffers (that batch's
    /// gradient is not used) but counts, so its `freeze_step = N` is N − 1
    /// steps of warmup, terse's `freeze_step = N − 1`
    /// (`crates/optim/tests/deepspeed_replay.rs`); terse needs one.
    fn freeze_step(&mut self, kind: &str, deepspeed: i64) -> i64 {
        let terse = (deepspeed - 1).max(1);
        self.ignored.push(format!(
            "optimizer.params.freeze_step: DeepSpeed's {kind} spends its first step setting up \
             (that batch unused), so its freeze_step {deepspeed} is {} warmup steps: terse's \
             freeze_step = {terse}",
            deepspeed - 1
        ));
        terse
    }

    /// DeepSpeed's defaults where terse's differ, for the params `params`
    /// leaves out.
    fn deepspeed_defaults(
        &mut self,
        name: &str,
        kind: &str,
        params: &Map<String, Value>,
        table: &mut toml::Table,
    ) {
        // Every DeepSpeed optimizer's constructor defaults lr to 1e-3 (a
        // `scheduler`, read later, replaces the constant rate).
        if !params.contains_key("lr") {
            self.set(
                "schedule",
                toml::Table::from_iter([
                    ("kind".to_string(), toml::Value::from("constant")),
                    ("lr".to_string(), toml::Value::from(1e-3)),
                ]),
            );
        }
        if matches!(name, "onebit_adam" | "onebit_lamb") && !params.contains_key("freeze_step") {
            let freeze = self.freeze_step(kind, DEEPSPEED_FREEZE_STEP);
            table.insert("freeze_step".into(), freeze.into());
        }
        if matches!(name, "lamb" | "onebit_lamb") && !params.contains_key("max_coeff") {
            table.insert("c_max".into(), DEEPSPEED_MAX_COEFF.into());
        }
        // FusedLamb corrects the moments' bias unless told not to.
        if name == "lamb" && !params.contains_key("bias_correction") {
            table.insert("bias_correction".into(), true.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::deepspeed_config::tests::{applied, refused};
    use crate::deepspeed_config::translate;

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
            [train]
            max_grad_norm = 1.0
            "#,
        )
        .unwrap();
        let doc = applied(json);
        assert_eq!(doc, expected);
        let ignored = translate("ds.json", json, 1).unwrap().ignored;
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

    /// DeepSpeed's defaults (its constructors' signatures in 0.19.6) for
    /// what a file leaves out, where terse's differ: `OnebitAdam`'s and
    /// `OnebitLamb`'s `freeze_step=100000`, `FusedLamb`'s
    /// `bias_correction=True` and `max_coeff=10.0`.
    #[test]
    fn params_left_out_take_deepspeed_s_defaults() {
        let lamb = applied(r#"{"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}"#);
        assert_eq!(lamb["optimizer"]["bias_correction"].as_bool(), Some(true));
        assert_eq!(lamb["optimizer"]["c_max"].as_float(), Some(10.0));
        for kind in ["OneBitAdam", "OneBitLamb"] {
            let doc = applied(&format!(r#"{{"optimizer": {{"type": "{kind}"}}}}"#));
            assert_eq!(doc["optimizer"]["freeze_step"].as_integer(), Some(99_999));
        }
        let onebit_lamb = applied(r#"{"optimizer": {"type": "OneBitLamb"}}"#);
        assert_eq!(onebit_lamb["optimizer"]["c_max"].as_float(), Some(10.0));
        // Given values are kept; DeepSpeed's freeze_step N is N − 1 here.
        let given = applied(
            r#"{"optimizer": {"type": "Lamb", "params": {"bias_correction": false,
                "max_coeff": 0.3, "eps_inside_sqrt": true}}}"#,
        );
        assert_eq!(given["optimizer"]["bias_correction"].as_bool(), Some(false));
        assert_eq!(given["optimizer"]["c_max"].as_float(), Some(0.3));
        assert_eq!(given["optimizer"]["eps_mode"].as_str(), Some("inside"));
        // DeepSpeed's AdamW is AdamW whatever adam_w_mode says.
        let adamw = applied(
            r#"{"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false,
                "torch_adam": true}}}"#,
        );
        assert_eq!(adamw["optimizer"]["name"].as_str(), Some("adam"));
        let freeze =
            applied(r#"{"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 16}}}"#);
        assert_eq!(freeze["optimizer"]["freeze_step"].as_integer(), Some(15));
    }

    /// Params DeepSpeed refuses for a type (a `TypeError` from the class's
    /// constructor, or the engine's `max_grad_norm` check) are refused.
    #[test]
    fn params_deepspeed_refuses_for_the_type_are_refused() {
        refused(&[
            (
                r#"{"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}}"#,
                "use the top-level `gradient_clipping`",
            ),
            (
                r#"{"optimizer": {"type": "OneBitAdam", "params": {"max_grad_norm": 1.0}}}"#,
                "use the top-level `gradient_clipping`",
            ),
            (
                r#"{"optimizer": {"type": "Adam", "params": {"cuda_aware": false}}}"#,
                "`optimizer.params.cuda_aware`: not a parameter of DeepSpeed's Adam",
            ),
            (
                r#"{"optimizer": {"type": "Adam", "params": {"eps_inside_sqrt": true}}}"#,
                "`optimizer.params.eps_inside_sqrt`: not a parameter",
            ),
            (
                r#"{"optimizer": {"type": "OneBitLamb", "params": {"adam_w_mode": true}}}"#,
                "`optimizer.params.adam_w_mode`: not a parameter",
            ),
            (
                r#"{"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}}"#,
                "false (L2 in the gradient)",
            ),
        ]);
    }
}
