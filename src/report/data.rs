//! What the `data` commands print: completeness lines, checksum tables, split summaries.

use serde::Serialize;

use crate::data::prepare::{NoiseSpec, PreparedData};
use crate::data::split::TrainSource;
use crate::data::{Dataset, Split};

#[derive(Serialize)]
struct Part {
    count: usize,
    class_counts: Vec<usize>,
}

impl Part {
    fn of(split: &Split, num_classes: usize) -> Self {
        Part {
            count: split.len(),
            class_counts: split.class_counts(num_classes),
        }
    }
}

#[derive(Serialize)]
struct SplitSummary<'a> {
    dataset: String,
    class_names: &'a [String],
    train_source: TrainSource,
    pretrain: Part,
    /// Counts by *noisy* label.
    finetune: Part,
    noise: &'a NoiseSpec,
    noisy: usize,
    realised_eta: f64,
    test: Part,
    deviations: &'a [String],
    warnings: &'a [String],
}

/// A JSON description of a prepared split (counts, class histograms, realised noise).
pub fn split_summary(
    dataset: &Dataset,
    prepared: &PreparedData,
    noise: &NoiseSpec,
) -> serde_json::Value {
    let k = dataset.num_classes();
    let summary = SplitSummary {
        dataset: dataset.name.to_string(),
        class_names: &dataset.class_names,
        train_source: prepared.partition.train_source,
        pretrain: Part::of(&prepared.pretrain, k),
        finetune: Part::of(&prepared.finetune, k),
        noise,
        noisy: prepared.labels.noisy_count(),
        realised_eta: prepared.labels.rate(),
        test: Part::of(&prepared.test, k),
        deviations: &prepared.partition.deviations,
        warnings: &dataset.warnings,
    };
    serde_json::to_value(summary).expect("split summary serialises")
}
