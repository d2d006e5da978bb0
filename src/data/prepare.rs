//! The three sets of one run (clean pretrain, noisy fine-tune, test) from a dataset, a split
//! plan and a noise model: the paper's data protocol in one call.

use std::path::Path;

use serde::Serialize;

use super::catalog::Dataset;
use super::cifar10n;
use super::files::{DataError, Result};
use super::noise::{NoiseModel, NoisyLabels, authors_only_symmetric, corrupt, human};
use super::samples::Split;
use super::split::{Partition, SplitName, SplitPlan, partition};
use crate::rng::RngChoice;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct NoiseSpec {
    pub model: NoiseModel,
    /// Ignored for CIFAR-10N, whose rate is realised.
    pub eta: f64,
    pub seed: u64,
}

#[derive(Clone, Debug)]
pub struct PreparedData {
    pub partition: Partition,
    /// Clean labels.
    pub pretrain: Split,
    /// Inputs with their *noisy* labels (`labels.clean_labels` has the clean ones).
    pub finetune: Split,
    pub labels: NoisyLabels,
    pub test: Split,
}

pub fn prepare(
    dataset: &Dataset,
    plan: &SplitPlan,
    noise: &NoiseSpec,
    data_root: &Path,
) -> Result<PreparedData> {
    if plan.rng == RngChoice::Authors && noise.model != NoiseModel::Symmetric {
        return Err(DataError::Unavailable {
            dataset: dataset.name.to_string(),
            problem: authors_only_symmetric(noise.model),
        });
    }
    let partition = partition(dataset, plan)?;
    let source = match partition.train_source {
        SplitName::Train => dataset
            .train
            .as_ref()
            .ok_or_else(|| DataError::Unavailable {
                dataset: dataset.name.to_string(),
                problem: "the partition drew from a training split that is absent".into(),
            })?,
        SplitName::Test => &dataset.test,
    };
    let pretrain = source.subset(&partition.pretrain);
    let mut finetune = source.subset(&partition.finetune);
    let labels = match noise.model {
        NoiseModel::Cifar10n(kind) => {
            if dataset.name != super::name::DatasetName::Cifar10
                || partition.train_source != SplitName::Train
            {
                return Err(DataError::Unavailable {
                    dataset: dataset.name.to_string(),
                    problem: "CIFAR-10N annotations exist for the CIFAR-10 training images only"
                        .into(),
                });
            }
            let path = data_root.join("cifar10n").join(cifar10n::FILE_NAME);
            human(
                &finetune.labels,
                &finetune.release_index,
                &cifar10n::load(&path, kind)?,
            )?
        }
        model => corrupt(
            &finetune.labels,
            dataset.num_classes(),
            model,
            noise.eta,
            noise.seed,
            plan.rng,
        )?,
    };
    finetune.labels = labels.labels.clone();
    let test = dataset.test.subset(&partition.test);
    Ok(PreparedData {
        partition,
        pretrain,
        finetune,
        labels,
        test,
    })
}
