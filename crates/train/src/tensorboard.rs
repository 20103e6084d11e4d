//! TensorBoard event files, so that `tensorboard --logdir runs/` shows a
//! run's curves while it trains, as a PyTorch user's SummaryWriter would.
//!
//! The format is TensorFlow's: a file of records, each `length (u64 LE) |
//! masked CRC-32C of length | Event protobuf | masked CRC-32C of the
//! Event`; the first Event names the file version, the others hold scalar
//! summaries. Only three messages are needed (`Event`, `Summary`,
//! `Summary.Value`), so they are encoded here by hand in protobuf's wire
//! format, fields in number order as protobuf's own serialisers write them
//! (a protobuf crate with its derive macros would change the features of
//! crates burn shares and rebuild the stack);
//! `crates/train/tests/tensorboard_events.rs` compares the bytes with a
//! file written by the `tensorboard` package itself.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::TrainError;

/// What an [`Event`] holds.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// The first event of a file: `brain.Event:2`.
    FileVersion(String),
    /// Scalars: (tag, value).
    Scalars(Vec<(String, f32)>),
    /// A `SessionLog` with status START: the run (re)starts at this event's
    /// step. TensorBoard then drops every event of an earlier file at this
    /// step or later, so a resumed run's curves do not show the steps a
    /// killed run logged past its checkpoint twice.
    SessionStart,
}

/// tensorboard's `Event` (fields 1 wall_time, 2 step, 3 file_version,
/// 5 summary, 7 session_log).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds since the epoch.
    pub wall_time: f64,
    /// The training step.
    pub step: i64,
    /// What it holds.
    pub what: EventKind,
}

/// Protobuf wire types.
const FIXED64: u8 = 1;
const LENGTH_DELIMITED: u8 = 2;
const FIXED32: u8 = 5;
const VARINT: u8 = 0;

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn key(out: &mut Vec<u8>, field: u64, wire: u8) {
    varint(out, field << 3 | u64::from(wire));
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    key(out, field, LENGTH_DELIMITED);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

impl Event {
    /// The protobuf encoding. proto3 leaves out fields at their default
    /// (a zero wall time or step); `simple_value` is one arm of a oneof and
    /// is always written, 0 included.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.wall_time != 0.0 {
            key(&mut out, 1, FIXED64);
            out.extend_from_slice(&self.wall_time.to_le_bytes());
        }
        if self.step != 0 {
            key(&mut out, 2, VARINT);
            varint(&mut out, self.step as u64);
        }
        match &self.what {
            EventKind::FileVersion(version) => bytes_field(&mut out, 3, version.as_bytes()),
            EventKind::Scalars(scalars) => {
                let mut summary = Vec::new();
                for (tag, value) in scalars {
                    let mut entry = Vec::new();
                    bytes_field(&mut entry, 1, tag.as_bytes());
                    key(&mut entry, 2, FIXED32);
                    entry.extend_from_slice(&value.to_le_bytes());
                    bytes_field(&mut summary, 1, &entry);
                }
                bytes_field(&mut out, 5, &summary);
            }
            EventKind::SessionStart => {
                // SessionLog { status = START (1) }.
                let mut session = Vec::new();
                key(&mut session, 1, VARINT);
                varint(&mut session, 1);
                bytes_field(&mut out, 7, &session);
            }
        }
        out
    }
}

/// `crc` masked as TensorFlow's record format masks it.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One record of the event file format.
pub fn record(event: &Event) -> Vec<u8> {
    let data = event.encode();
    let length = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc(&length).to_le_bytes());
    out.extend_from_slice(&data);
    out.extend_from_slice(&masked_crc(&data).to_le_bytes());
    out
}

/// An event file being written (flushed after every step, so TensorBoard
/// shows the run live).
pub struct EventWriter {
    file: File,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir` (a resumed run adds a file; TensorBoard
    /// reads them all). A run resumed after step `resumed_after` (0: a
    /// fresh run) marks its restart, so TensorBoard forgets what an earlier
    /// file logged after that step.
    pub fn create(dir: &Path, resumed_after: u64) -> Result<Self, TrainError> {
        let io = |path: PathBuf| move |source| TrainError::Io { path, source };
        std::fs::create_dir_all(dir).map_err(io(dir.to_path_buf()))?;
        let now = wall_time();
        let host = crate::run_dir::host_name().unwrap_or_else(|| "localhost".into());
        let path = dir.join(format!(
            "{}{}.{host}.{}",
            crate::run_dir::EVENT_FILE_PREFIX,
            now as u64,
            std::process::id()
        ));
        let file = File::create(&path).map_err(io(path.clone()))?;
        let mut writer = EventWriter { file, path };
        writer.write(&Event {
            wall_time: now,
            step: 0,
            what: EventKind::FileVersion("brain.Event:2".into()),
        })?;
        if resumed_after > 0 {
            writer.write(&Event {
                wall_time: now,
                step: resumed_after as i64 + 1,
                what: EventKind::SessionStart,
            })?;
        }
        Ok(writer)
    }

    /// Writes `scalars` (tag, value) for `step`.
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f64)]) -> Result<(), TrainError> {
        self.write(&Event {
            wall_time: wall_time(),
            step: step as i64,
            what: EventKind::Scalars(
                scalars
                    .iter()
                    .map(|(tag, value)| ((*tag).to_string(), *value as f32))
                    .collect(),
            ),
        })
    }

    fn write(&mut self, event: &Event) -> Result<(), TrainError> {
        self.file
            .write_all(&record(event))
            .and_then(|()| self.file.flush())
            .map_err(|source| TrainError::Io {
                path: self.path.clone(),
                source,
            })
    }
}

fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_the_castagnoli_polynomial() {
        // The check value of CRC-32C (RFC 3720's iSCSI CRC).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn a_zero_scalar_is_still_written() {
        let event = Event {
            wall_time: 0.0,
            step: 300,
            what: EventKind::Scalars(vec![("t".into(), 0.0)]),
        };
        // step (field 2, varint 300 = ac 02), summary (field 5) holding one
        // value (field 1): tag "t" (field 1), simple_value 0.0 (field 2).
        assert_eq!(
            event.encode(),
            [
                0x10, 0xac, 0x02, 0x2a, 10, 0x0a, 8, 0x0a, 1, b't', 0x15, 0, 0, 0, 0
            ]
        );
    }
}
