//! What changes a run's settings: one [`RunOverrides`], every field optional, made by a
//! --config file ([`super::config_file`]), by the flags (`finetune`) or by a grid (its point, its
//! budget), and applied by one [`RunConfig::overlay`]. The defaults it lands on are configs/run.toml
//! and the dataset's configs/ file, read by [`RunConfig::paper`].

use serde::Deserialize;

use super::optim::OptimizerOverrides;
use super::run::{HeadClassifier, Mode, RunConfig};
use crate::data::noise::NoiseModel;
use crate::kernels::Precision;
use crate::rng::RngChoice;
use crate::runtime::DeviceKind;

/// Values that replace a run's own; an absent one leaves it. A key the run does not have is
/// refused when one is read from a file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunOverrides {
    /// The content digest the run's files must have (a replayed config.json's own).
    pub data_digest: Option<String>,
    pub mode: Option<Mode>,
    pub head_classifier: Option<HeadClassifier>,
    #[serde(deserialize_with = "crate::io::as_string_opt::deserialize")]
    pub noise: Option<NoiseModel>,
    pub eta: Option<f64>,
    pub n: Option<usize>,
    pub pretrain_n: Option<usize>,
    pub test_n: Option<usize>,
    pub seed: Option<u64>,
    pub rng: Option<RngChoice>,
    pub epochs: Option<usize>,
    pub pretrain_epochs: Option<usize>,
    pub batch_size: Option<usize>,
    /// Keys of the optimizer, each on its own.
    pub optimizer: Option<OptimizerOverrides>,
    pub eval_every: Option<usize>,
    pub carve_train_from_test: Option<f64>,
    pub backbones: Option<Vec<String>>,
    pub special_tokens: Option<bool>,
    pub locater: Option<f64>,
    pub token_noise: Option<f64>,
    pub train_threads: Option<usize>,
    pub device: Option<DeviceKind>,
    pub precision: Option<Precision>,
    pub train_device: Option<DeviceKind>,
}

impl RunConfig {
    /// This run with `overrides`' values in place of its own, and the label-noise draw its
    /// η and stream now call for ([`RunConfig::with_noise_draw`]).
    pub fn overlay(&self, overrides: &RunOverrides) -> RunConfig {
        let o = overrides;
        RunConfig {
            data_digest: o.data_digest.clone().or_else(|| self.data_digest.clone()),
            mode: o.mode.unwrap_or(self.mode),
            head_classifier: o.head_classifier.or(self.head_classifier),
            noise: o.noise.unwrap_or(self.noise),
            eta: o.eta.unwrap_or(self.eta),
            n: o.n.unwrap_or(self.n),
            pretrain_n: o.pretrain_n.unwrap_or(self.pretrain_n),
            test_n: o.test_n.or(self.test_n),
            seed: o.seed.unwrap_or(self.seed),
            rng: o.rng.unwrap_or(self.rng),
            epochs: o.epochs.unwrap_or(self.epochs),
            pretrain_epochs: o.pretrain_epochs.unwrap_or(self.pretrain_epochs),
            batch_size: o.batch_size.unwrap_or(self.batch_size),
            optimizer: o.optimizer.as_ref().map_or_else(
                || self.optimizer.clone(),
                |keys| keys.apply(&self.optimizer),
            ),
            eval_every: o.eval_every.unwrap_or(self.eval_every),
            carve_train_from_test: o.carve_train_from_test.or(self.carve_train_from_test),
            backbones: o
                .backbones
                .clone()
                .unwrap_or_else(|| self.backbones.clone()),
            special_tokens: o.special_tokens.unwrap_or(self.special_tokens),
            locater: o.locater.unwrap_or(self.locater),
            token_noise: o.token_noise.unwrap_or(self.token_noise),
            train_threads: o.train_threads.unwrap_or(self.train_threads),
            device: o.device.unwrap_or(self.device),
            precision: o.precision.unwrap_or(self.precision),
            train_device: o.train_device.or(self.train_device),
            ..self.clone()
        }
        .with_noise_draw()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DatasetName;

    #[test]
    fn no_override_changes_nothing_and_each_one_changes_its_field() {
        let paper = RunConfig::paper(&DatasetName::Trec).unwrap();
        assert_eq!(
            paper.overlay(&RunOverrides::default()),
            paper.clone().with_noise_draw()
        );
        let changed = paper.overlay(&RunOverrides {
            n: Some(20),
            eta: Some(0.2),
            test_n: Some(100),
            backbones: Some(vec!["other".into()]),
            ..RunOverrides::default()
        });
        assert_eq!(
            (changed.n, changed.eta, changed.test_n),
            (20, 0.2, Some(100))
        );
        assert_eq!(changed.backbones, ["other"]);
        assert_eq!(changed.epochs, paper.epochs);
    }

    #[test]
    fn a_key_the_run_does_not_have_is_refused() {
        let error = serde_json::from_str::<RunOverrides>(r#"{"n": 20, "etaa": 0.2}"#).unwrap_err();
        assert!(
            error.to_string().contains("unknown field `etaa`"),
            "{error}"
        );
    }
}
