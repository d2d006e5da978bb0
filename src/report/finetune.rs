//! Outputs of `finetune`: metrics.jsonl (phase 2, one line per epoch), pretrain.jsonl (phase-1
//! loss per epoch), attention_maps.png and summary.json, each written atomically; and the live
//! progress bar.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use anyhow::Result;

use crate::io::{ensure_dir, write_json, write_json_lines};
use crate::progress_bar::Bar;
use crate::train::finetune::FinetuneRun;
use crate::train::metrics::EpochMetrics;
use crate::train::progress::Progress;
use crate::train::run::RunFolder;

/// The run's files, once it has finished; with the run's event file, its attention maps join it.
pub fn write_run(
    dir: &Path,
    run: &FinetuneRun,
    events: Option<&super::tensorboard::TensorBoard>,
) -> Result<()> {
    ensure_dir(dir)?;
    let pretrain: Vec<serde_json::Value> = run
        .pretrain_losses
        .iter()
        .enumerate()
        .map(|(k, loss)| serde_json::json!({ "epoch": k + 1, "train_loss": loss }))
        .collect();
    write_json_lines(&dir.join("pretrain.jsonl"), &pretrain)?;
    write_json_lines(&dir.join("metrics.jsonl"), &run.epochs)?;
    let maps = RunFolder(dir.to_path_buf()).attention_maps();
    super::attention_maps::write(&maps, &run.attention_maps)?;
    if let Some(events) = events {
        events.attention_maps(run.summary.config.epochs, &maps)?;
    }
    write_json(&dir.join("summary.json"), &run.summary)
}

/// One bar per stage on stderr (lines where stderr is not a terminal, see `progress`); phase 2
/// shows train/test accuracy and memorization live.
#[derive(Default)]
pub struct Bars {
    bar: Mutex<Option<Bar>>,
    last_test: Mutex<Option<f64>>,
}

/// The guarded value even if a thread panicked while holding it: progress is display only.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Progress for Bars {
    /// On stderr (notes come at set-up, before any bar is drawn).
    fn note(&self, line: &str) {
        eprintln!("note: {line}");
    }

    fn stage(&self, what: &str, total: usize) {
        let mut bar = lock(&self.bar);
        if let Some(old) = bar.take() {
            old.finish_and_clear();
        }
        *bar = Some(crate::progress_bar::bar(total as u64, what));
    }

    fn advance(&self, by: usize) {
        if let Some(bar) = lock(&self.bar).as_ref() {
            bar.inc(by as u64);
        }
    }

    fn epoch(&self, m: &EpochMetrics) {
        if m.test_acc.is_some() {
            *lock(&self.last_test) = m.test_acc;
        }
        if let Some(bar) = lock(&self.bar).as_ref() {
            let test = lock(&self.last_test).map_or("–".to_string(), |t| format!("{t:.3}"));
            bar.set_message(format!(
                "train {:.3} · {} · test {test} · loss {:.3}",
                m.train_acc,
                memorization(m.memorization),
                m.train_loss
            ));
            bar.inc(1);
        }
    }
}

impl Drop for Bars {
    /// Clears a bar left on the terminal; prints no "done" line for a stage an error may have cut
    /// short (a stage that ran to its length has printed it).
    fn drop(&mut self) {
        if let Some(bar) = lock(&self.bar).take() {
            bar.abandon();
        }
    }
}

/// The memorization as a progress or result line says it: "no label flipped" where there is no
/// flipped label to memorise (summary.json's null), not "NaN".
pub fn memorization(share: f64) -> String {
    if share.is_nan() {
        "no label flipped".to_string()
    } else {
        format!("memorization {share:.3}")
    }
}

#[cfg(test)]
mod memorization_tests {
    #[test]
    fn no_flipped_label_is_said_in_words() {
        assert_eq!(super::memorization(f64::NAN), "no label flipped");
        assert_eq!(super::memorization(0.6316), "memorization 0.632");
    }
}
