//! A run's defaults as its dataset's configs/ file gives them (configs/<dataset>.toml,
//! docs/protocol.md §3; which file is the dataset's business: [`DatasetName::defaults`]); flags
//! override them per run.

use anyhow::{Context, Result};
use serde::Deserialize;

use super::optim::OptimizerConfig;
use crate::data::DatasetName;

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    pub dataset: String,
    /// Clean phase-1 samples.
    pub pretrain_n: usize,
    /// Noisy phase-2 samples (the authors' default; Table 2 uses 20, 200, 1000).
    pub n: usize,
    pub pretrain_epochs: usize,
    pub epochs: usize,
    pub batch_size: usize,
    /// In order of preference: the paper's backbone first, then offline ones.
    pub backbones: Vec<String>,
    pub optimizer: OptimizerConfig,
}

/// The defaults of `dataset` (the configs/ file its name takes, [`DatasetName::defaults`]); for a
/// MedMNIST task phase 1 takes at most the training images the fine-tune set leaves.
pub fn dataset_config(dataset: &DatasetName) -> Result<DatasetConfig> {
    let defaults = dataset.defaults().map_err(anyhow::Error::msg)?;
    let mut config: DatasetConfig = toml::from_str(defaults.toml)
        .with_context(|| format!("configs/{}.toml is invalid", defaults.file))?;
    if let Some(train) = defaults.train_images {
        config.pretrain_n = config.pretrain_n.min(train.saturating_sub(config.n));
    }
    config.dataset = dataset.to_string();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/protocol.md §3 table: pretrain_sample_size per dataset (the classes are the loaded
    /// dataset's own); Trainer defaults.
    #[test]
    fn configs_hold_the_papers_table() {
        let expected = [
            (DatasetName::Mnist, 10_000),
            (DatasetName::Cifar10, 10_000),
            (DatasetName::PneumoniaMnist, 3000),
            (DatasetName::BreastMnist, 200),
            (DatasetName::AgNews, 10_000),
            (DatasetName::Trec, 3000),
            (DatasetName::Stl10, 3000),
            (DatasetName::Sst2, 10_000),
        ];
        for (name, pretrain_n) in expected {
            let c = dataset_config(&name).unwrap();
            assert_eq!((c.dataset.as_str(), c.pretrain_n), (name.id(), pretrain_n));
            assert_eq!(
                (c.n, c.pretrain_epochs, c.epochs, c.batch_size),
                (200, 300, 2000, 16)
            );
            assert_eq!(c.optimizer, OptimizerConfig::default());
            let paper = if name.modality() == crate::data::catalog::Modality::Image {
                "google/vit-base-patch16-224-in21k"
            } else {
                "bert-base-uncased"
            };
            assert_eq!(c.backbones[0], paper);
        }
        // The rest of the MedMNIST family: PneumoniaMNIST's defaults, phase 1 capped at the
        // training images the n fine-tune samples leave (RetinaMNIST has 1080).
        let family = |name: &str| dataset_config(&name.parse().unwrap()).unwrap();
        let derma = family("dermamnist_224");
        assert_eq!((derma.pretrain_n, derma.n, derma.epochs), (3000, 200, 2000));
        assert_eq!(derma.dataset, "dermamnist_224");
        assert_eq!(family("retinamnist").pretrain_n, 1080 - 200);
    }
}
