//! Optimizer state on disk: safetensors files whose tensors are the flat
//! state buffers named by role (`m`, `v`, ...) and whose metadata holds the
//! step (the schedule position), the optimizer's config, the schedule, the
//! parameter layout and, in a file of state that is one rank's own, the
//! rank, so a resume can refuse anything that would not continue the same
//! run. [`Optimizer::save`] writes one file; a checkpoint keeps what is
//! alike on every rank apart from what is each rank's own
//! ([`Optimizer::to_checkpoint_bytes`]), so that ranks on one filesystem
//! can store the first once.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::{OptimError, Optimizer, OwnState};

const FORMAT: &str = "terse-optimizer";
const FORMAT_VERSION: &str = "2";
/// Prefix of the f64 tensors holding [`crate::FlatOptimizer::scalars`].
const SCALAR: &str = "scalar.";

/// Which part of the state a file holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    /// All of it: [`Optimizer::save`]'s one file.
    Whole,
    /// The roles alike on every rank, and the scalars.
    Alike,
    /// The roles that are each rank's own.
    Own,
}

impl Optimizer {
    /// Writes the whole state to `path` atomically (a temporary file in the
    /// same directory, synced, then renamed over `path`).
    ///
    /// After steps split between ranks that share cores, every rank must
    /// first call [`Optimizer::sync_state`]; a partial state is refused.
    pub fn save(&mut self, path: &Path) -> Result<(), OptimError> {
        let bytes = self
            .serialise(Part::Whole)
            .map_err(|reason| bad(path, reason))?;
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

    /// The state as a checkpoint keeps it, as the bytes of safetensors
    /// files [`Optimizer::load_parts`] reads: where part of it is each
    /// rank's own ([`OwnState::Roles`]: the compressed rules' error
    /// buffers), the rest (the moments, the scalars) in the first file,
    /// which then names no rank, and that part in the second; otherwise
    /// the whole state in one. The first file is then the same bytes on
    /// every rank whose state is alike, which ranks sharing a filesystem
    /// store once. Errors are the reason only (the caller names the file).
    pub fn to_checkpoint_bytes(&mut self) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
        match self.rule.own_state() {
            OwnState::Roles(_) => Ok((
                self.serialise(Part::Alike)?,
                Some(self.serialise(Part::Own)?),
            )),
            OwnState::Nothing | OwnState::All => Ok((self.serialise(Part::Whole)?, None)),
        }
    }

    /// The bytes of the tensors a checkpoint's optimizer files hold (the
    /// files add their headers), as `(alike on every rank, each rank's
    /// own)`: known before the first checkpoint is written.
    pub fn state_bytes(&mut self) -> (u64, u64) {
        let own = self.rule.own_state();
        let scalars: usize = self.rule.scalars().iter().map(|(_, v)| v.len()).sum();
        let (mut alike, mut own_bytes) = (8 * scalars as u64, 0);
        for (role, buffer) in self.rule.state() {
            if own.is_own(role) {
                own_bytes += 4 * buffer.len() as u64;
            } else {
                alike += 4 * buffer.len() as u64;
            }
        }
        match own {
            OwnState::All => (0, alike + own_bytes),
            _ => (alike, own_bytes),
        }
    }

    /// A file of `part` of the state: its roles' flat buffers, the scalars
    /// with the alike part, and the metadata (the rank where the file is
    /// one rank's).
    fn serialise(&mut self, part: Part) -> Result<Vec<u8>, String> {
        if self.rule.state_is_partial() {
            return Err(
                "the state is current only in this rank's part (call sync_state on every rank first)"
                    .into(),
            );
        }
        let own = self.rule.own_state();
        let names_rank = match part {
            Part::Whole => own != OwnState::Nothing,
            Part::Alike => false,
            Part::Own => true,
        };
        let metadata = self.metadata(names_rank).map_err(|e| e.to_string())?;
        let scalars: Vec<(String, Vec<f64>)> = if part == Part::Own {
            Vec::new()
        } else {
            self.rule
                .scalars()
                .into_iter()
                .map(|(role, values)| (format!("{SCALAR}{role}"), values))
                .collect()
        };
        // State kept on a device is copied to the host (it stays there too).
        let state: Vec<(&'static str, Cow<'_, [f32]>)> = self
            .rule
            .state()
            .into_iter()
            .filter(|(role, _)| match part {
                Part::Whole => true,
                Part::Alike => !own.is_own(role),
                Part::Own => own.is_own(role),
            })
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

    /// Replaces this optimizer's state and step with those saved in `path`
    /// ([`Optimizer::save`]'s file).
    ///
    /// Refused, with the difference named, when the file was written by
    /// another optimizer, config, schedule or parameter layout.
    pub fn load(&mut self, path: &Path) -> Result<(), OptimError> {
        self.load_parts(&[path])
    }

    /// Replaces this optimizer's state and step with those saved in the
    /// files `paths` ([`Optimizer::to_checkpoint_bytes`]'s, or one whole
    /// file): each tensor is read from the first file that has it.
    ///
    /// Refused, with the file and the difference named, when a file was
    /// written by another optimizer, config, schedule, parameter layout or
    /// rank, when the files were saved at different steps, or when a
    /// tensor is in none of them.
    pub fn load_parts(&mut self, paths: &[&Path]) -> Result<(), OptimError> {
        let first = *paths.first().expect("at least one file");
        let mut files = Vec::with_capacity(paths.len());
        for &path in paths {
            let bytes = fs::read(path).map_err(|source| OptimError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            let step = self.check_header(path, &bytes)?;
            files.push((path, bytes, step));
        }
        let step = files[0].2;
        if let Some((path, _, other)) = files.iter().find(|(_, _, s)| *s != step) {
            return Err(bad(
                path,
                format!(
                    "saved at step {other}, {} at step {step}: parts of two different saves",
                    first.display()
                ),
            ));
        }
        let tensors = files
            .iter()
            .map(|(path, bytes, _)| {
                SafeTensors::deserialize(bytes).map_err(|e| bad(path, e.to_string()))
            })
            .collect::<Result<Vec<_>, OptimError>>()?;
        // A tensor and the file it is in.
        let find = |name: &str| {
            tensors
                .iter()
                .zip(paths)
                .find_map(|(t, &path)| Some((path, t.tensor(name).ok()?)))
        };
        let missing = |name: &str| {
            let within = if paths.len() == 1 {
                String::new()
            } else {
                format!(
                    " (nor in {})",
                    paths[1..]
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            bad(first, format!("missing state tensor `{name}`{within}"))
        };
        for (role, target) in self.rule.state() {
            let (path, view) = find(role).ok_or_else(|| missing(role))?;
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
            let (path, view) = find(&name).ok_or_else(|| missing(&name))?;
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

    /// Checks a saved file's metadata against this optimizer: the format,
    /// the optimizer, its config, schedule and layout, and the rank where
    /// the file names one. Returns the step it was saved at.
    fn check_header(&self, path: &Path, bytes: &[u8]) -> Result<u64, OptimError> {
        let (_, header) = SafeTensors::read_metadata(bytes)
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
        // A file that names a rank is that rank's; one that names none is
        // alike on every rank.
        for (key, ours) in self.metadata(meta.contains_key("rank"))? {
            if matches!(key.as_str(), "step") {
                continue;
            }
            let theirs = field(&key)?;
            if !same_metadata(theirs, &ours) {
                return Err(bad(path, describe_difference(&key, theirs, &ours)));
            }
        }
        field("step")?
            .parse()
            .map_err(|e| bad(path, format!("metadata `step`: {e}")))
    }

    /// The metadata of a saved file; `names_rank`: with this rank (a file
    /// of state that is this rank's own).
    fn metadata(&self, names_rank: bool) -> Result<HashMap<String, String>, OptimError> {
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
        if names_rank {
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
