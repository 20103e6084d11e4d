//! `--optimizer NAME`: another algorithm, the same hyper-parameters. A
//! DeepSpeed user who switches Adam for 1-bit Adam expects the weight decay,
//! betas, eps, bias correction and freeze step of the config to stay; only
//! the fields the new optimizer does not have are left behind (and named).

use crate::{OptimError, OptimizerConfig};

/// The result of swapping an optimizer config's algorithm.
#[derive(Debug, Clone, PartialEq)]
pub struct Swapped {
    /// `name`'s config: every field the old config shares with it kept,
    /// `name`'s defaults for the rest.
    pub config: OptimizerConfig,
    /// The old config's fields `name` has no use for.
    pub dropped: Vec<String>,
}

impl OptimizerConfig {
    /// This config with its algorithm replaced by `name` (a registry name),
    /// keeping every field the two share.
    pub fn with_name(&self, name: &str) -> Result<Swapped, OptimError> {
        let invalid = |reason| OptimError::InvalidConfig {
            field: "name".into(),
            value: format!("\"{name}\""),
            reason,
        };
        let defaults = toml::from_str::<OptimizerConfig>(&format!("name = \"{name}\""))
            .map_err(|_| invalid("not an optimizer terse has (see optimizer-names.txt)"))?;
        let table = |config: &OptimizerConfig| match toml::Value::try_from(config) {
            Ok(toml::Value::Table(table)) => table,
            _ => unreachable!("an optimizer config serialises to a table"),
        };
        let mut swapped = table(&defaults);
        let mut dropped = Vec::new();
        for (key, value) in table(self) {
            if key == "name" {
                continue;
            }
            // A field the defaults leave out (an empty list, an unset
            // option) may still be one of `name`'s: keep it if `name`
            // accepts it with this value.
            let mut trial = swapped.clone();
            trial.insert(key.clone(), value);
            if toml::Value::Table(trial.clone())
                .try_into::<OptimizerConfig>()
                .is_ok()
            {
                swapped = trial;
            } else {
                dropped.push(key);
            }
        }
        let config = toml::Value::Table(swapped)
            .try_into::<OptimizerConfig>()
            .map_err(|_| invalid("the config's shared fields do not fit this optimizer"))?;
        Ok(Swapped { config, dropped })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> OptimizerConfig {
        toml::from_str(text).unwrap()
    }

    /// The config of `text` swapped to `name`, after checking that its
    /// TOML has every line of `kept`.
    fn swapped_keeping(text: &str, name: &str, kept: &[&str]) -> Swapped {
        let swapped = config(text).with_name(name).unwrap();
        let text = toml::to_string(&swapped.config).unwrap();
        for kept in kept {
            assert!(text.contains(kept), "{kept} not in\n{text}");
        }
        swapped
    }

    #[test]
    fn adam_to_onebit_adam_keeps_every_shared_hyper_parameter() {
        let swapped = swapped_keeping(
            "name = \"adam\"\nweight_decay = 0.01\nbeta_1 = 0.8\nbeta_2 = 0.98\neps = 1e-6\nbias_correction = false\n",
            "onebit_adam",
            &[
                "name = \"onebit_adam\"",
                "weight_decay = 0.01",
                "beta_1 = 0.8",
                "beta_2 = 0.98",
                "eps = 0.000001",
                "bias_correction = false",
            ],
        );
        assert!(swapped.dropped.is_empty(), "{:?}", swapped.dropped);
    }

    #[test]
    fn onebit_lamb_to_onebit_adam_keeps_the_freeze_and_names_what_it_drops() {
        let swapped = swapped_keeping(
            "name = \"onebit_lamb\"\nweight_decay = 0.01\nfreeze_step = 12\nc_max = 0.5\nuncompressed = [\"bert.embeddings.*\"]\n",
            "onebit_adam",
            &[
                "freeze_step = 12",
                "weight_decay = 0.01",
                "bert.embeddings.*",
            ],
        );
        assert!(
            swapped.dropped.contains(&"c_max".to_string()),
            "{:?}",
            swapped.dropped
        );
        // And back: LAMB's own fields take LAMB's defaults.
        let back = swapped.config.with_name("onebit_lamb").unwrap();
        assert!(
            toml::to_string(&back.config)
                .unwrap()
                .contains("freeze_step = 12")
        );
    }

    #[test]
    fn an_unknown_name_is_refused() {
        let adam = config("name = \"adam\"\n");
        let error = adam.with_name("nope").unwrap_err().to_string();
        assert!(error.contains("nope"), "{error}");
    }
}
