//! Each dataset's paper defaults (configs/<dataset>.toml, docs/protocol.md §3), compiled in so the binary
//! carries them; flags override them per run.

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

const CONFIGS: [(&str, &str); 8] = [
    ("mnist", include_str!("../../configs/mnist.toml")),
    ("cifar10", include_str!("../../configs/cifar10.toml")),
    (
        "pneumoniamnist",
        include_str!("../../configs/pneumoniamnist.toml"),
    ),
    (
        "breastmnist",
        include_str!("../../configs/breastmnist.toml"),
    ),
    ("ag_news", include_str!("../../configs/ag_news.toml")),
    ("trec", include_str!("../../configs/trec.toml")),
    ("stl10", include_str!("../../configs/stl10.toml")),
    ("sst2", include_str!("../../configs/sst2.toml")),
];

/// The MedMNIST family's tasks besides the paper's two (configs/medmnist.toml).
const MEDMNIST_FAMILY: &str = include_str!("../../configs/medmnist.toml");

/// Defaults for the datasets a user brings, by modality (configs/own_*.toml).
const OWN_IMAGES: &str = include_str!("../../configs/own_images.toml");
const OWN_TEXTS: &str = include_str!("../../configs/own_texts.toml");

/// The defaults of `dataset`; an error for datasets without a paper config.
pub fn dataset_config(dataset: &DatasetName) -> Result<DatasetConfig> {
    if let DatasetName::Own(source) = dataset {
        let (file, text) = match source.modality() {
            crate::data::catalog::Modality::Image => ("own_images", OWN_IMAGES),
            crate::data::catalog::Modality::Text => ("own_texts", OWN_TEXTS),
        };
        let config: DatasetConfig =
            toml::from_str(text).with_context(|| format!("configs/{file}.toml is invalid"))?;
        return Ok(DatasetConfig {
            dataset: dataset.to_string(),
            ..config
        });
    }
    if let DatasetName::OtherMedMnist(name) = dataset {
        let release = crate::data::medmnist_family::release(name).map_err(anyhow::Error::msg)?;
        let mut config: DatasetConfig =
            toml::from_str(MEDMNIST_FAMILY).context("configs/medmnist.toml is invalid")?;
        let train = release.task.samples.get("train").copied().unwrap_or(0);
        config.pretrain_n = config.pretrain_n.min(train.saturating_sub(config.n));
        config.dataset = name.clone();
        return Ok(config);
    }
    let (_, text) = CONFIGS
        .iter()
        .find(|(name, _)| *name == dataset.id())
        .with_context(|| {
            format!(
                "{dataset}: no paper config (configs/ has {})",
                CONFIGS.map(|(n, _)| n).join(", ")
            )
        })?;
    toml::from_str(text).with_context(|| format!("configs/{}.toml is invalid", dataset.id()))
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
