//! What the `data` commands print: completeness lines, checksum tables, split summaries.

use serde::Serialize;

use crate::data::prepare::{NoiseSpec, PreparedData};
use crate::data::split::{SplitName, SplitPlan};
use crate::data::{Dataset, Split};
use crate::rng::RngChoice;

#[derive(Serialize)]
struct PartCounts {
    count: usize,
    class_counts: Vec<usize>,
}

impl PartCounts {
    fn of(split: &Split, num_classes: usize) -> Self {
        PartCounts {
            count: split.len(),
            class_counts: split.class_counts(num_classes),
        }
    }
}

#[derive(Serialize)]
struct SplitSummary<'a> {
    dataset: String,
    class_names: &'a [String],
    rng: RngChoice,
    train_source: SplitName,
    pretrain: PartCounts,
    /// Counts by *noisy* label.
    finetune: PartCounts,
    noise: &'a NoiseSpec,
    noisy: usize,
    realised_eta: f64,
    test: PartCounts,
    deviations: &'a [String],
    warnings: &'a [String],
}

/// A JSON description of a prepared split (counts, class histograms, realised noise).
pub fn split_summary(
    dataset: &Dataset,
    prepared: &PreparedData,
    plan: &SplitPlan,
    noise: &NoiseSpec,
) -> serde_json::Value {
    let k = dataset.num_classes();
    let summary = SplitSummary {
        dataset: dataset.name.to_string(),
        class_names: &dataset.class_names,
        rng: plan.rng,
        train_source: prepared.partition.train_source,
        pretrain: PartCounts::of(&prepared.pretrain, k),
        finetune: PartCounts::of(&prepared.finetune, k),
        noise,
        noisy: prepared.labels.noisy_count(),
        realised_eta: prepared.labels.rate(),
        test: PartCounts::of(&prepared.test, k),
        deviations: &prepared.partition.deviations,
        warnings: &dataset.warnings,
    };
    serde_json::to_value(summary).expect("split summary serialises")
}

/// `data split --out`: the rows a split drew and the labels the noise left.
#[derive(Serialize)]
pub struct DrawnRows<'a> {
    dataset: String,
    rng: RngChoice,
    seed: u64,
    /// The split the indices point into (`test` when carved from it).
    train_source: SplitName,
    /// Release indices of the pretrain rows, in the split's order (draw order for `authors`).
    pretrain_indices: &'a [usize],
    /// Release indices of the fine-tune rows, likewise.
    finetune_indices: &'a [usize],
    finetune_clean_labels: &'a [u32],
    /// After the label noise.
    finetune_labels: &'a [u32],
    noisy_mask: &'a [bool],
    deviations: &'a [String],
}

pub fn drawn_rows<'a>(
    dataset: &Dataset,
    plan: &SplitPlan,
    prepared: &'a PreparedData,
) -> DrawnRows<'a> {
    DrawnRows {
        dataset: dataset.name.to_string(),
        rng: plan.rng,
        seed: plan.seed,
        train_source: prepared.partition.train_source,
        pretrain_indices: &prepared.pretrain.release_index,
        finetune_indices: &prepared.finetune.release_index,
        finetune_clean_labels: &prepared.labels.clean_labels,
        finetune_labels: &prepared.labels.labels,
        noisy_mask: &prepared.labels.noisy_mask,
        deviations: &prepared.partition.deviations,
    }
}
