//! A run's defaults, in two files: configs/run.toml for what every run starts from (seed,
//! evaluation interval, threads, the optimizer) and its dataset's configs/<dataset>.toml for the
//! paper's per-dataset values (docs/protocol.md §3; which file is the dataset's business:
//! [`DatasetName::defaults`]). A --config file and the flags override them per run.

use std::sync::LazyLock;

use anyhow::{Context, Result};
use serde::Deserialize;

use super::optim::{OptimizerConfig, OptimizerOverrides};
use crate::data::DatasetName;

/// configs/run.toml: what every run starts from, whatever its dataset.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunDefaults {
    pub seed: u64,
    pub eval_every: usize,
    pub train_threads: usize,
    pub optimizer: OptimizerConfig,
}

/// The file, built in; a test reads it, so a binary never starts with a broken one.
static RUN_DEFAULTS: LazyLock<RunDefaults> = LazyLock::new(|| {
    toml::from_str(include_str!("../../configs/run.toml")).expect("configs/run.toml is valid")
});

/// [`RunDefaults`] of configs/run.toml.
pub fn run_defaults() -> &'static RunDefaults {
    &RUN_DEFAULTS
}

/// The optimizer of configs/run.toml (the HF Trainer defaults).
impl Default for OptimizerConfig {
    fn default() -> Self {
        run_defaults().optimizer.clone()
    }
}

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
    /// configs/run.toml's optimizer with this file's `[optimizer]` keys, if it has any.
    #[serde(default, rename = "optimizer")]
    optimizer_keys: OptimizerOverrides,
}

impl DatasetConfig {
    /// The optimizer a run of this dataset starts with.
    pub fn optimizer(&self) -> OptimizerConfig {
        self.optimizer_keys.apply(&OptimizerConfig::default())
    }
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

    /// configs/run.toml reads, and holds the HF Trainer's AdamW and the single run's values; a
    /// dataset file's `[optimizer]` table replaces only the keys it gives.
    #[test]
    fn the_run_defaults_read_and_a_dataset_file_replaces_only_its_optimizer_keys() {
        let every_run = run_defaults();
        assert_eq!(
            (
                every_run.seed,
                every_run.eval_every,
                every_run.train_threads
            ),
            (42, 50, 1)
        );
        let adamw = &every_run.optimizer;
        assert_eq!(
            (adamw.learning_rate, adamw.beta1, adamw.beta2, adamw.epsilon),
            (5e-5, 0.9, 0.999, 1e-8)
        );
        assert_eq!(
            (adamw.weight_decay, adamw.max_grad_norm, adamw.warmup_steps),
            (0.0, 1.0, 0)
        );
        let text = "dataset = \"x\"\npretrain_n = 1\nn = 1\npretrain_epochs = 1\nepochs = 1\n\
                    batch_size = 1\nbackbones = []\n[optimizer]\nlearning_rate = 1e-3\n";
        let config: DatasetConfig = toml::from_str(text).unwrap();
        let optimizer = config.optimizer();
        assert_eq!(optimizer.learning_rate, 1e-3);
        assert_eq!(optimizer.beta2, adamw.beta2);
        let unknown = text.replace("learning_rate", "lr");
        assert!(toml::from_str::<DatasetConfig>(&unknown).is_err());
    }

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
            assert_eq!(c.optimizer(), OptimizerConfig::default());
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
