//! TensorBoard's event file in every run folder, written as the run trains, so that a run can be
//! watched live and a grid's runs compared (`tensorboard --logdir results/<grid>/runs`):
//!
//! - `phase1/train_loss` per phase-1 epoch (from 1), and `phase2/<metric>` per phase-2 epoch
//!   (from 0, right after the reset): every number of a metrics.jsonl line under its own name
//!   (`phase2/qk_spectrum.eigen_variance`, …), test metrics at the scored epochs only, and no
//!   value where metrics.jsonl has none (null: memorization at η = 0);
//! - `config`: the resolved configuration as text, and the same values as hparams (TensorBoard's
//!   HParams tab filters runs by dataset, mode, η, n, seed);
//! - `attention_maps`: attention_maps.png at the last epoch (its panels show the attention right
//!   after the reset beside the attention at the end).
//!
//! A resumed run rebuilds the file from its checkpoint (what was logged up to it) before it goes
//! on, so that the epochs a killed sitting logged after its last checkpoint, which the resumed
//! sitting runs again, are not there twice: one value per tag and step, equal to metrics.jsonl.
//!
//! The format: TFRecord framing (length, masked CRC-32C of the length, the record, masked
//! CRC-32C of the record) around `Event` protocol buffers. The few messages needed are declared
//! here with prost's derive, field numbers from TensorFlow's `event.proto`, `summary.proto`,
//! `tensor.proto` and TensorBoard's `hparams/plugin_data.proto`, so that no protoc is needed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use prost::Message;

use crate::train::progress::Progress;

use crate::train::metrics::EpochMetrics;
use crate::train::run::{RunConfig, RunFolder};

#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    what: Option<What>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Value {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
    #[prost(oneof = "Kind", tags = "2, 4, 8")]
    kind: Option<Kind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Kind {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
    #[prost(message, tag = "4")]
    Image(Image),
    #[prost(message, tag = "8")]
    Tensor(TensorProto),
}

#[derive(Clone, PartialEq, prost::Message)]
struct Image {
    #[prost(int32, tag = "1")]
    height: i32,
    #[prost(int32, tag = "2")]
    width: i32,
    /// 3: RGB.
    #[prost(int32, tag = "3")]
    colorspace: i32,
    #[prost(bytes = "vec", tag = "4")]
    encoded_image_string: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    content: Vec<u8>,
}

/// TensorFlow's `DataType`: DT_FLOAT.
const DT_FLOAT: i32 = 1;
/// TensorFlow's `DataType`: DT_STRING.
const DT_STRING: i32 = 7;

/// A scalar tensor (no shape field: rank 0).
#[derive(Clone, PartialEq, prost::Message)]
struct TensorProto {
    #[prost(int32, tag = "1")]
    dtype: i32,
    #[prost(float, repeated, tag = "5")]
    float_val: Vec<f32>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    string_val: Vec<Vec<u8>>,
}

/// TensorBoard's `HParamsPluginData` holding a `SessionStartInfo` (plugin data version 0).
#[derive(Clone, PartialEq, prost::Message)]
struct HParamsPluginData {
    #[prost(message, optional, tag = "3")]
    session_start_info: Option<SessionStartInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SessionStartInfo {
    #[prost(btree_map = "string, message", tag = "1")]
    hparams: BTreeMap<String, ProtoValue>,
    #[prost(double, tag = "5")]
    start_time_secs: f64,
}

/// `google.protobuf.Value`, the kinds an hparam takes.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoValue {
    #[prost(oneof = "ValueKind", tags = "2, 3, 4")]
    kind: Option<ValueKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum ValueKind {
    #[prost(double, tag = "2")]
    Number(f64),
    #[prost(string, tag = "3")]
    Text(String),
    #[prost(bool, tag = "4")]
    Bool(bool),
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One TFRecord: the event's bytes framed with their length and both masked CRC-32Cs.
fn record(event: &Event) -> Vec<u8> {
    const CASTAGNOLI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
    // TFRecord's mask: a CRC of data that holds CRCs is not itself a plain CRC.
    let masked = |bytes: &[u8]| {
        let crc = CASTAGNOLI.checksum(bytes);
        (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
    };
    let data = event.encode_to_vec();
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked(&len).to_le_bytes());
    out.extend_from_slice(&data);
    out.extend_from_slice(&masked(&data).to_le_bytes());
    out
}

fn summary_event(step: usize, value: Vec<Value>) -> Event {
    Event {
        wall_time: now(),
        step: step as i64,
        what: Some(What::Summary(Summary { value })),
    }
}

fn scalar(tag: String, value: f64) -> Value {
    Value {
        tag,
        metadata: None,
        kind: Some(Kind::SimpleValue(value as f32)),
    }
}

fn plugin(name: &str, content: Vec<u8>) -> Option<SummaryMetadata> {
    Some(SummaryMetadata {
        plugin_data: Some(PluginData {
            plugin_name: name.into(),
            content,
        }),
    })
}

/// Phase 2's scalars of one epoch: every finite number of its metrics.jsonl line but the epoch.
fn epoch_scalars(metrics: &EpochMetrics) -> Vec<Value> {
    let json = serde_json::to_value(metrics).unwrap_or_default();
    crate::io::flatten_json(&json)
        .into_iter()
        .filter(|(key, _)| key != "epoch")
        .filter_map(|(key, value)| {
            let number = value.as_f64().filter(|v| v.is_finite())?;
            Some(scalar(format!("phase2/{key}"), number))
        })
        .collect()
}

/// The configuration as text (a JSON block) and as hparams, at step 0.
fn config_event(config: &RunConfig) -> Event {
    let json = serde_json::to_value(config).unwrap_or_default();
    let pretty = serde_json::to_string_pretty(&json).unwrap_or_default();
    let text = Value {
        tag: "config".into(),
        metadata: plugin("text", Vec::new()),
        kind: Some(Kind::Tensor(TensorProto {
            dtype: DT_STRING,
            float_val: Vec::new(),
            string_val: vec![format!("```json\n{pretty}\n```").into_bytes()],
        })),
    };
    let hparams = crate::io::flatten_json(&json)
        .into_iter()
        .filter_map(|(key, value)| {
            let kind = match value {
                serde_json::Value::Number(n) => ValueKind::Number(n.as_f64()?),
                serde_json::Value::String(s) => ValueKind::Text(s),
                serde_json::Value::Bool(b) => ValueKind::Bool(b),
                serde_json::Value::Array(items) => ValueKind::Text(
                    items
                        .iter()
                        .map(|v| v.as_str().map_or(v.to_string(), str::to_string))
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                _ => return None,
            };
            Some((key, ProtoValue { kind: Some(kind) }))
        })
        .collect();
    let session = HParamsPluginData {
        session_start_info: Some(SessionStartInfo {
            hparams,
            start_time_secs: now(),
        }),
    };
    let hparams = Value {
        tag: "_hparams_/session_start_info".into(),
        metadata: plugin("hparams", session.encode_to_vec()),
        kind: Some(Kind::Tensor(TensorProto {
            dtype: DT_FLOAT,
            float_val: vec![0.0],
            string_val: Vec::new(),
        })),
    };
    summary_event(0, vec![text, hparams])
}

/// Writes a run's event file (see the module's documentation) while wrapping the progress
/// display the run reports to, which sees every call as before.
pub struct TensorBoard<'a> {
    inner: &'a dyn Progress,
    path: PathBuf,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    file: Option<File>,
    pretrain_written: usize,
    /// A write failed: warned once, nothing more is written.
    failed: bool,
}

impl<'a> TensorBoard<'a> {
    /// The event file of run folder `dir`, reported to alongside `inner`.
    pub fn new(dir: &Path, inner: &'a dyn Progress) -> Self {
        Self {
            inner,
            path: RunFolder(dir.to_path_buf()).events(),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends `events`; the first failure is a warning and ends the file's writing, not the run.
    fn append(&self, state: &mut State, events: &[Event]) {
        if state.failed {
            return;
        }
        let Some(file) = state.file.as_mut() else {
            return;
        };
        let bytes: Vec<u8> = events.iter().flat_map(record).collect();
        if let Err(e) = file.write_all(&bytes) {
            state.failed = true;
            self.inner.warn(&format!(
                "{}: TensorBoard events not written from here on: {e}",
                self.path.display()
            ));
        }
    }

    fn start(&self, config: &RunConfig, pretrain: &[f64], logged: &[EpochMetrics]) -> Result<File> {
        let mut events = vec![
            Event {
                wall_time: now(),
                step: 0,
                what: Some(What::FileVersion("brain.Event:2".into())),
            },
            config_event(config),
        ];
        events.extend(pretrain_events(pretrain, 0));
        events.extend(
            logged
                .iter()
                .map(|m| summary_event(m.epoch, epoch_scalars(m))),
        );
        crate::io::write_atomic(&self.path, |w| {
            for event in &events {
                w.write_all(&record(event))?;
            }
            Ok(())
        })?;
        File::options()
            .append(true)
            .open(&self.path)
            .with_context(|| format!("{}: cannot open for appending", self.path.display()))
    }

    /// Adds attention_maps.png (the reset's and the last epoch's panels) at step `epoch`.
    pub fn attention_maps(&self, epoch: usize, png: &Path) -> Result<()> {
        let bytes = crate::io::read_input(png, crate::io::limits::SMALL_TEXT)?;
        let (width, height) =
            png_size(&bytes).with_context(|| format!("{}: not a PNG", png.display()))?;
        let image = Value {
            tag: "attention_maps".into(),
            metadata: None,
            kind: Some(Kind::Image(Image {
                height,
                width,
                colorspace: 3,
                encoded_image_string: bytes,
            })),
        };
        let mut state = self.state();
        self.append(&mut state, &[summary_event(epoch, vec![image])]);
        Ok(())
    }
}

/// Phase 1's loss of epoch `epoch` (from 1); none for a loss that is not finite.
fn pretrain_event(epoch: usize, loss: f64) -> Option<Event> {
    loss.is_finite()
        .then(|| summary_event(epoch, vec![scalar("phase1/train_loss".into(), loss)]))
}

/// Phase 1's losses from epoch `from + 1` on.
fn pretrain_events(losses: &[f64], from: usize) -> Vec<Event> {
    (from..losses.len())
        .filter_map(|k| pretrain_event(k + 1, losses[k]))
        .collect()
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(bytes: &[u8]) -> Option<(i32, i32)> {
    if bytes.len() < 24 || &bytes[..8] != b"\x89PNG\r\n\x1a\n" || &bytes[12..16] != b"IHDR" {
        return None;
    }
    let read = |at: usize| i32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    Some((read(16), read(20)))
}

impl Progress for TensorBoard<'_> {
    fn stage(&self, what: &str, total: usize) {
        self.inner.stage(what, total);
    }
    fn advance(&self, by: usize) {
        self.inner.advance(by);
    }
    fn epoch(&self, metrics: &EpochMetrics) {
        self.inner.epoch(metrics);
    }
    fn note(&self, line: &str) {
        self.inner.note(line);
    }
    fn line(&self, line: &str) {
        self.inner.line(line);
    }
    fn warn(&self, line: &str) {
        self.inner.warn(line);
    }

    fn series_start(&self, config: &RunConfig, pretrain: &[f64], logged: &[EpochMetrics]) {
        self.inner.series_start(config, pretrain, logged);
        let mut state = self.state();
        match self.start(config, pretrain, logged) {
            Ok(file) => {
                *state = State {
                    file: Some(file),
                    pretrain_written: pretrain.len(),
                    failed: false,
                }
            }
            Err(e) => {
                state.failed = true;
                self.inner.warn(&format!(
                    "{}: no TensorBoard events for this run: {}",
                    self.path.display(),
                    crate::errors::one_line(&e)
                ));
            }
        }
    }

    fn pretrain_epoch(&self, epoch: usize, loss: f64) {
        self.inner.pretrain_epoch(epoch, loss);
        let mut state = self.state();
        if epoch == state.pretrain_written + 1 {
            let events: Vec<Event> = pretrain_event(epoch, loss).into_iter().collect();
            self.append(&mut state, &events);
            state.pretrain_written = epoch;
        }
    }

    fn pretrain_done(&self, losses: &[f64]) {
        self.inner.pretrain_done(losses);
        let mut state = self.state();
        let events = pretrain_events(losses, state.pretrain_written);
        self.append(&mut state, &events);
        state.pretrain_written = state.pretrain_written.max(losses.len());
    }

    fn logged(&self, metrics: &EpochMetrics) {
        self.inner.logged(metrics);
        let mut state = self.state();
        self.append(
            &mut state,
            &[summary_event(metrics.epoch, epoch_scalars(metrics))],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TFRecord's framing of a known payload: the masked CRC-32C values TensorFlow writes.
    #[test]
    fn records_carry_tensorflows_masked_crcs() {
        let event = Event {
            wall_time: 0.0,
            step: 0,
            what: Some(What::FileVersion("brain.Event:2".into())),
        };
        let bytes = record(&event);
        let data = event.encode_to_vec();
        assert_eq!(bytes.len(), data.len() + 16);
        assert_eq!(
            u64::from_le_bytes(bytes[..8].try_into().unwrap()),
            data.len() as u64
        );
        // CRC-32C of "123456789" is 0xE3069283 (the check value of the Castagnoli polynomial).
        let crc = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI).checksum(b"123456789");
        assert_eq!(crc, 0xE306_9283);
    }
}
