//! Outputs of `finetune`: metrics.jsonl (phase 2, one line per epoch), pretrain.jsonl (phase-1
//! loss per epoch) and summary.json, each written atomically; and the live progress bar.

use std::path::Path;
use std::sync::Mutex;

use anyhow::Result;
use indicatif::ProgressBar;

use crate::io::{ensure_dir, write_json, write_json_lines};
use crate::train::finetune::{FinetuneRun, Progress};
use crate::train::phases::EpochMetrics;

pub fn write_run(dir: &Path, run: &FinetuneRun) -> Result<()> {
    ensure_dir(dir)?;
    let pretrain: Vec<serde_json::Value> = run
        .pretrain_losses
        .iter()
        .enumerate()
        .map(|(k, loss)| serde_json::json!({ "epoch": k + 1, "train_loss": loss }))
        .collect();
    write_json_lines(&dir.join("pretrain.jsonl"), &pretrain)?;
    write_json_lines(&dir.join("metrics.jsonl"), &run.epochs)?;
    write_json(&dir.join("summary.json"), &run.summary)
}

/// One bar per stage on stderr; phase 2 shows train/test accuracy and memorization live.
#[derive(Default)]
pub struct Bars {
    bar: Mutex<Option<ProgressBar>>,
    last_test: Mutex<Option<f64>>,
}

impl Progress for Bars {
    fn stage(&self, what: &str, total: usize) {
        if let Some(old) = self.bar.lock().expect("progress lock").take() {
            old.finish_and_clear();
        }
        *self.bar.lock().expect("progress lock") = Some(super::progress::bar(total as u64, what));
    }

    fn advance(&self, by: usize) {
        if let Some(bar) = self.bar.lock().expect("progress lock").as_ref() {
            bar.inc(by as u64);
        }
    }

    fn epoch(&self, m: &EpochMetrics) {
        if m.test_acc.is_some() {
            *self.last_test.lock().expect("progress lock") = m.test_acc;
        }
        if let Some(bar) = self.bar.lock().expect("progress lock").as_ref() {
            let test = self
                .last_test
                .lock()
                .expect("progress lock")
                .map_or("–".to_string(), |t| format!("{t:.3}"));
            bar.set_message(format!(
                "train {:.3} · memorization {:.3} · test {test} · loss {:.3}",
                m.train_acc, m.memorization, m.train_loss
            ));
            bar.inc(1);
        }
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.lock().expect("progress lock").take() {
            bar.finish_and_clear();
        }
    }
}
