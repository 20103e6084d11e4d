//! The harness's guard against unfair comparisons: the variants of one
//! experiment must have identical resolved configs except for the
//! optimizer's own fields and the keys a variant declares it varies.
//!
//! "The optimizer's own fields" are the `[optimizer]` keys only one of the
//! two optimizers has (1-bit Adam's `freeze_step`, SLAMB's `k`) and its
//! `name`. A key both have — `bias_correction`, `eps`, `weight_decay`,
//! `beta_1` — is shared and must be equal: otherwise a difference in the
//! result could come from it rather than from the algorithm (the slamb-ratio
//! issue: LAMB without bias correction against SLAMB with it).

use std::collections::BTreeMap;

use anyhow::{Result, bail};

/// One variant's resolved config, flattened to dotted keys.
pub struct Resolved {
    /// The variant's label.
    pub label: String,
    /// `task.max_seq` → `128`, …
    pub keys: BTreeMap<String, toml::Value>,
    /// Keys this variant may differ in (its experiment's subject, e.g.
    /// `train.seed` across seeds or `optimizer.eps_mode` in eps-fix).
    pub varies: Vec<String>,
}

impl Resolved {
    /// Parses `config` (TOML as `terse … --print-config` prints it).
    pub fn parse(label: &str, config: &str, varies: &[String]) -> Result<Self> {
        let table: toml::Table = toml::from_str(config)
            .map_err(|e| anyhow::anyhow!("{label}: the resolved config is not TOML: {e}"))?;
        let mut keys = BTreeMap::new();
        flatten("", &toml::Value::Table(table), &mut keys);
        Ok(Self {
            label: label.to_string(),
            keys,
            varies: varies.to_vec(),
        })
    }
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, toml::Value>) {
    match value {
        toml::Value::Table(table) => {
            for (key, value) in table {
                let key = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                flatten(&key, value, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// Refuses a comparison in which two variants differ in a key that is
/// neither an optimizer's own nor declared as varied by either of them,
/// naming the key, both variants and both values. Every pair is checked:
/// two variants may each match the first one (say Adam) in everything but
/// their optimizer's own fields and still differ from each other in a
/// field those two optimizers share (two 1-bit Adam runs freezing at
/// different steps).
pub fn check(variants: &[Resolved]) -> Result<()> {
    for (i, first) in variants.iter().enumerate() {
        for other in &variants[i + 1..] {
            check_pair(first, other)?;
        }
    }
    Ok(())
}

fn check_pair(first: &Resolved, other: &Resolved) -> Result<()> {
    let keys = first.keys.keys().chain(other.keys.keys());
    for key in keys {
        let (a, b) = (first.keys.get(key), other.keys.get(key));
        if a == b || key == "optimizer.name" {
            continue;
        }
        let optimizers_own = key.starts_with("optimizer.") && (a.is_none() || b.is_none());
        let declared = first.varies.iter().chain(&other.varies).any(|v| v == key);
        if optimizers_own || declared {
            continue;
        }
        let show = |v: Option<&toml::Value>| v.map_or("(absent)".to_string(), |v| v.to_string());
        bail!(
            "reproduce: variants `{}` and `{}` differ in `{key}` ({} vs {}), which is not \
             the subject of the comparison: set it identically in both (a shared optimizer \
             field such as bias_correction included), or declare it varied",
            first.label,
            other.label,
            show(a),
            show(b)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(label: &str, optimizer: &str, varies: &[&str]) -> Resolved {
        let config = format!("[train]\nsteps = 10\nseed = 1\n\n[optimizer]\n{optimizer}\n");
        let varies: Vec<String> = varies.iter().map(|s| s.to_string()).collect();
        Resolved::parse(label, &config, &varies).unwrap()
    }

    /// What `check` refuses `variants` with.
    fn refusal(variants: &[Resolved]) -> String {
        check(variants).unwrap_err().to_string()
    }

    #[test]
    fn the_optimizers_own_fields_may_differ() {
        let lamb = resolved(
            "lamb",
            "name = \"lamb\"\nbias_correction = false\nc_max = 0.3",
            &[],
        );
        let slamb = resolved(
            "slamb",
            "name = \"slamb\"\nbias_correction = false\nk = 0.1",
            &[],
        );
        check(&[lamb, slamb]).unwrap();
    }

    #[test]
    fn a_shared_field_that_differs_is_named() {
        let lamb = resolved("lamb", "name = \"lamb\"\nbias_correction = false", &[]);
        let slamb = resolved(
            "slamb_k0.1",
            "name = \"slamb\"\nbias_correction = true",
            &[],
        );
        let message = refusal(&[lamb, slamb]);
        assert!(message.contains("`optimizer.bias_correction`"), "{message}");
        assert!(
            message.contains("`lamb`") && message.contains("`slamb_k0.1`"),
            "{message}"
        );
        assert!(message.contains("false vs true"), "{message}");
    }

    #[test]
    fn a_run_setting_that_differs_is_named_unless_declared() {
        let a = resolved("adam", "name = \"adam\"", &[]);
        let mut b = resolved("onebit_adam", "name = \"onebit_adam\"", &[]);
        b.keys.insert("train.seed".into(), toml::Value::Integer(2));
        let message = refusal(&[a, b]);
        assert!(message.contains("`train.seed`"), "{message}");
        let a = resolved("adam", "name = \"adam\"", &[]);
        let mut b = resolved("onebit_adam", "name = \"onebit_adam\"", &["train.seed"]);
        b.keys.insert("train.seed".into(), toml::Value::Integer(2));
        check(&[a, b]).unwrap();
    }

    #[test]
    fn variants_are_checked_in_pairs_not_only_against_the_first() {
        // Each 1-bit Adam run matches Adam (freeze_step is its own field
        // there), but the two differ from each other in it unless the late
        // one declares it varied.
        let runs = |late_varies: &[&str]| {
            [
                resolved("adam", "name = \"adam\"", &[]),
                resolved(
                    "onebit_adam",
                    "name = \"onebit_adam\"\nfreeze_step = 200",
                    &[],
                ),
                resolved(
                    "late",
                    "name = \"onebit_adam\"\nfreeze_step = 400",
                    late_varies,
                ),
            ]
        };
        let message = refusal(&runs(&[]));
        assert!(message.contains("`optimizer.freeze_step`"), "{message}");
        assert!(message.contains("`onebit_adam` and `late`"), "{message}");
        check(&runs(&["optimizer.freeze_step"])).unwrap();
    }
}
