//! Optimizer state on disk: one safetensors file whose tensors are the flat
//! state buffers named by role (`m`, `v`, ...) and whose metadata holds the
//! step (the schedule position), the optimizer's config, the schedule, the
//! parameter layout and, for a state that is each rank's own, the rank, so
//! a resume can refuse anything that would not continue the same run.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::{OptimError, Optimizer};

const FORMAT: &str = "terse-optimizer";
const FORMAT_VERSION: &str = "2";
/// Prefix of the f64 tensors holding [`crate::FlatOptimizer::scalars`].
const SCALAR: &str = "scalar.";

impl Optimizer {
    /// Writes the state to `path` atomically (a temporary file in the same
    /// directory, synced, then renamed over `path`): [`Optimizer::to_bytes`].
    pub fn save(&mut self, path: &Path) -> Result<(), OptimError> {
        let bytes = self.to_bytes().map_err(|reason| bad(path, reason))?;
        let tmp = temp_path(path);
        let io = |source| OptimError::Io {
            path: tmp.clone(),
            source,
        };
        let mut file = fs::File::create(&tmp).map_err(io)?;
        file.write_all(&bytes).map_err(io)?;
        file.sync_all().map_err(io)?;
        fs::rename(&tmp, path).map_err(|source| OptimError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The state as the safetensors file [`Optimizer::load`] reads: the
    /// flat state buffers by role, the scalars, and the metadata. Errors
    /// are the reason only (the caller names the file).
    ///
    /// After steps split between ranks that share cores, every rank must
    /// first call [`Optimizer::sync_state`]; a partial state is refused.
    pub fn to_bytes(&mut self) -> Result<Vec<u8>, String> {
        if self.rule.state_is_partial() {
            return Err(
                "the state is current only in this rank's part (call sync_state on every rank first)"
                    .into(),
            );
        }
        let metadata = self.metadata().map_err(|e| e.to_string())?;
        let scalars: Vec<(String, Vec<f64>)> = self
            .rule
            .scalars()
            .into_iter()
            .map(|(role, values)| (format!("{SCALAR}{role}"), values))
            .collect();
        // State kept on a device is copied to the host (it stays there too).
        let state: Vec<(&'static str, Cow<'_, [f32]>)> = self
            .rule
            .state()
            .into_iter()
            .map(|(role, buffer)| (role, buffer.read()))
            .collect();
        let mut views = state
            .iter()
            .map(|(role, values)| {
                let view =
                    TensorView::new(Dtype::F32, vec![values.len()], bytemuck::cast_slice(values))
                        .map_err(|e| format!("tensor `{role}`: {e}"))?;
                Ok((role.to_string(), view))
            })
            .collect::<Result<Vec<_>, String>>()?;
        for (name, values) in &scalars {
            let view =
                TensorView::new(Dtype::F64, vec![values.len()], bytemuck::cast_slice(values))
                    .map_err(|e| format!("tensor `{name}`: {e}"))?;
            views.push((name.clone(), view));
        }
        safetensors::serialize(views, Some(metadata)).map_err(|e| e.to_string())
    }

    /// The bytes of the tensors [`Optimizer::save`] writes (the file adds
    /// its header): what a checkpoint's optimizer file holds, known before
    /// the first one is written.
    pub fn state_bytes(&mut self) -> u64 {
        let floats: usize = self.rule.state().iter().map(|(_, b)| b.len()).sum();
        let scalars: usize = self.rule.scalars().iter().map(|(_, v)| v.len()).sum();
        4 * floats as u64 + 8 * scalars as u64
    }

    /// Replaces this optimizer's state and step with those saved in `path`.
    ///
    /// Refused, with the difference named, when the file was written by
    /// another optimizer, config, schedule or parameter layout.
    pub fn load(&mut self, path: &Path) -> Result<(), OptimError> {
        let bytes = fs::read(path).map_err(|source| OptimError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let (_, header) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(path, format!("not safetensors: {e}")))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let field = |key: &str| {
            meta.get(key)
                .map(String::as_str)
                .ok_or_else(|| bad(path, format!("metadata has no `{key}`")))
        };
        if field("format")? != FORMAT || field("format_version")? != FORMAT_VERSION {
            return Err(bad(
                path,
                format!(
                    "not a {FORMAT} v{FORMAT_VERSION} file (format `{}`, version `{}`)",
                    meta.get("format").map_or("", String::as_str),
                    meta.get("format_version").map_or("", String::as_str)
                ),
            ));
        }
        let saved_name = field("optimizer")?;
        if saved_name != self.config.name() {
            return Err(bad(
                path,
                format!(
                    "saved by optimizer `{saved_name}`, cannot resume `{}`",
                    self.config.name()
                ),
            ));
        }
        for (key, ours) in self.metadata()? {
            if matches!(key.as_str(), "step") {
                continue;
            }
            let theirs = field(&key)?;
            if !same_metadata(theirs, &ours) {
                return Err(bad(path, describe_difference(&key, theirs, &ours)));
            }
        }
        let step: u64 = field("step")?
            .parse()
            .map_err(|e| bad(path, format!("metadata `step`: {e}")))?;

        let tensors = SafeTensors::deserialize(&bytes).map_err(|e| bad(path, e.to_string()))?;
        for (role, target) in self.rule.state() {
            let view = tensors
                .tensor(role)
                .map_err(|_| bad(path, format!("missing state tensor `{role}`")))?;
            let len = target.len();
            if view.dtype() != Dtype::F32 || view.shape() != [len] {
                return Err(bad(
                    path,
                    format!(
                        "state tensor `{role}` is {:?} {:?}, expected F32 [{len}]",
                        view.dtype(),
                        view.shape()
                    ),
                ));
            }
            let values: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|raw| f32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]))
                .collect();
            target.write(&values);
        }
        self.rule.state_loaded();
        for (role, _) in self.rule.scalars() {
            let name = format!("{SCALAR}{role}");
            let view = tensors
                .tensor(&name)
                .map_err(|_| bad(path, format!("missing state tensor `{name}`")))?;
            if view.dtype() != Dtype::F64 || view.shape().len() != 1 {
                return Err(bad(
                    path,
                    format!(
                        "state tensor `{name}` is {:?} {:?}, expected F64 [n]",
                        view.dtype(),
                        view.shape()
                    ),
                ));
            }
            let values = view
                .data()
                .chunks_exact(8)
                .map(|raw| f64::from_le_bytes(raw.try_into().expect("8 bytes")))
                .collect();
            self.rule
                .set_scalars(role, values)
                .map_err(|detail| bad(path, format!("state tensor `{name}`: {detail}")))?;
        }
        self.t = step;
        Ok(())
    }

    fn metadata(&self) -> Result<HashMap<String, String>, OptimError> {
        let shapes: Vec<(&str, &[usize])> = self
            .layout
            .segments()
            .iter()
            .map(|s| (s.path.as_str(), s.shape.as_slice()))
            .collect();
        let mut metadata = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("format_version".to_string(), FORMAT_VERSION.to_string()),
            ("optimizer".to_string(), self.config.name().to_string()),
            ("step".to_string(), self.t.to_string()),
            ("config".to_string(), to_json(&self.config)?),
            ("schedule".to_string(), to_json(&self.schedule)?),
            ("layout".to_string(), to_json(&shapes)?),
            ("world_size".to_string(), self.world_size.to_string()),
        ]);
        // A state that is each rank's own loads into that rank only; one
        // alike on every rank into any (and then ranks' files are the same
        // bytes, which ranks on one filesystem store once).
        if !self.rule.state_replicated() {
            metadata.insert("rank".to_string(), self.rank.to_string());
        }
        Ok(metadata)
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, OptimError> {
    serde_json::to_string(value).map_err(|e| OptimError::BadState {
        path: PathBuf::new(),
        detail: format!("cannot describe the optimizer as JSON: {e}"),
    })
}

/// Whether a saved metadata value equals ours: JSON values compare as
/// values (key order is not meaning: the config's fields may be reordered
/// between versions), anything else as text.
fn same_metadata(saved: &str, ours: &str) -> bool {
    let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).ok();
    match (parse(saved), parse(ours)) {
        (Some(a), Some(b)) => a == b,
        _ => saved == ours,
    }
}

/// Names the top-level keys that differ between two JSON metadata values.
fn describe_difference(key: &str, saved: &str, ours: &str) -> String {
    let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).ok();
    if let (Some(serde_json::Value::Object(a)), Some(serde_json::Value::Object(b))) =
        (parse(saved), parse(ours))
    {
        let mut fields: Vec<String> = a
            .iter()
            .filter(|(k, v)| b.get(*k) != Some(v))
            .map(|(k, v)| {
                format!(
                    "{key}.{k}: saved {v}, now {}",
                    b.get(k).unwrap_or(&serde_json::Value::Null)
                )
            })
            .collect();
        fields.extend(
            b.iter()
                .filter(|(k, _)| !a.contains_key(*k))
                .map(|(k, v)| format!("{key}.{k}: saved nothing, now {v}")),
        );
        if !fields.is_empty() {
            return format!(
                "the {key} changed since it was saved ({})",
                fields.join("; ")
            );
        }
    }
    format!("the {key} changed since it was saved (saved {saved}, now {ours})")
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

fn bad(path: &Path, detail: String) -> OptimError {
    OptimError::BadState {
        path: path.to_path_buf(),
        detail,
    }
}
