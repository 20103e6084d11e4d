//! `--set key=value`: change any field of a run config from the command line.
//!
//! Experiments that differ from a committed config in one or two fields (the
//! optimizer, a seed, the freeze step) are run as that config plus overrides
//! rather than as near-copies of it, so the difference is visible in the
//! command and the committed file stays the single source of the rest. The
//! override is applied to the TOML document before it is deserialised, so a
//! misspelled key is refused exactly as it would be in the file.

/// One `key=value` override: a dotted path into the TOML document and a TOML
/// value (`3`, `1e-3`, `"text"`, `[1, 2]`, `{ name = "adam" }`); a value that
/// does not parse as TOML is taken as a string, so `task.corpus=sotu` needs
/// no quotes.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    path: Vec<String>,
    /// `None`: the key is removed (its default, or none where optional).
    value: Option<toml::Value>,
}

impl Override {
    /// Parses `key.path=value`; `Err` says what is malformed.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (key, value) = text
            .split_once('=')
            .ok_or_else(|| format!("`{text}`: expected key=value (e.g. train.seed=3)"))?;
        let path: Vec<String> = key.trim().split('.').map(str::to_string).collect();
        if path.iter().any(|part| part.is_empty()) {
            return Err(format!("`{text}`: empty part in key `{key}`"));
        }
        let value = value.trim();
        let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut table| table.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        Ok(Self {
            path,
            value: Some(value),
        })
    }

    /// Sets the value in `document`, creating tables on the way; replacing a
    /// whole table (e.g. `optimizer={…}`) drops its old fields.
    pub fn apply(&self, document: &mut toml::Table) -> Result<(), String> {
        let (last, parents) = self.path.split_last().expect("parse keeps one part");
        let mut table = document;
        for (depth, part) in parents.iter().enumerate() {
            let entry = table
                .entry(part.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            table = entry.as_table_mut().ok_or_else(|| {
                format!(
                    "`{}`: `{}` is a value, not a table",
                    self.key(),
                    self.path[..=depth].join(".")
                )
            })?;
        }
        match &self.value {
            Some(value) => {
                table.insert(last.clone(), value.clone());
            }
            None => {
                table.remove(last);
            }
        }
        Ok(())
    }

    /// The override `key = value` (`key` dotted), built rather than parsed.
    pub fn new(key: &str, value: impl Into<toml::Value>) -> Self {
        Self {
            path: key.split('.').map(str::to_string).collect(),
            value: Some(value.into()),
        }
    }

    /// The override that removes `key` (dotted): the field's default, or
    /// none where it is optional (`train.max_grad_norm`: no clipping).
    pub fn unset(key: &str) -> Self {
        Self {
            path: key.split('.').map(str::to_string).collect(),
            value: None,
        }
    }

    /// The dotted key.
    pub fn key(&self) -> String {
        self.path.join(".")
    }
}

/// `key = value`, the value as TOML writes it inline (`optimizer = { name
/// = "onebit_lamb", … }`): what `--deepspeed` reports it set.
impl std::fmt::Display for Override {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Some(value) => write!(f, "{} = {value}", self.key()),
            None => write!(f, "{} unset", self.key()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document() -> toml::Table {
        toml::from_str(
            "[optimizer]\nname = \"onebit_adam\"\nfreeze_step = 10\n[train]\nsteps = 5\n",
        )
        .unwrap()
    }

    #[test]
    fn sets_scalars_strings_and_whole_tables() {
        let mut doc = document();
        for text in [
            "train.steps=40",
            "train.seed = 3",
            "task.corpus=[\"sotu\"]",
            "task.kind=pretrain",
            "optimizer={ name = \"adam\", lr = 1e-3 }",
        ] {
            Override::parse(text).unwrap().apply(&mut doc).unwrap();
        }
        assert_eq!(doc["train"]["steps"].as_integer(), Some(40));
        assert_eq!(doc["train"]["seed"].as_integer(), Some(3));
        assert_eq!(doc["task"]["corpus"][0].as_str(), Some("sotu"));
        assert_eq!(doc["task"]["kind"].as_str(), Some("pretrain"));
        let optimizer = doc["optimizer"].as_table().unwrap();
        assert_eq!(optimizer["name"].as_str(), Some("adam"));
        assert_eq!(optimizer["lr"].as_float(), Some(1e-3));
        assert!(!optimizer.contains_key("freeze_step"), "old fields dropped");
    }

    #[test]
    fn shows_itself_as_toml() {
        let set = Override::new("train.max_grad_norm", 1.0);
        assert_eq!(set.to_string(), "train.max_grad_norm = 1.0");
        let table = Override::parse("optimizer={ name = \"lamb\", c_max = 0.3 }").unwrap();
        // Keys in sorted order (the toml crate's map).
        assert_eq!(
            table.to_string(),
            "optimizer = { c_max = 0.3, name = \"lamb\" }"
        );
    }

    #[test]
    fn refuses_malformed_overrides() {
        assert!(
            Override::parse("train.steps")
                .unwrap_err()
                .contains("key=value")
        );
        assert!(
            Override::parse("train..steps=3")
                .unwrap_err()
                .contains("empty part")
        );
        let err = Override::parse("train.steps.x=1")
            .unwrap()
            .apply(&mut document())
            .unwrap_err();
        assert!(err.contains("`train.steps` is a value"), "{err}");
    }
}
