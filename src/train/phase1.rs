//! Phase 1 (docs/protocol.md §3): the classifier on clean pretrain features, from the run's
//! checkpoint, the phase-1 cache that runs of a grid share, or trained here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::checkpoint::{self, Checkpoint};
use super::classifier_loop::{Schedule, train_classifier, train_classifier_on_tokens};
use super::metrics::evaluate;
use super::progress::Progress;
use super::run::{FinetuneJob, HeadClassifier, Mode, RunConfig};
use super::setup::{RunFeatures, Setup, final_tokens, layer_inputs, train_source};
use crate::data::prepare::PreparedData;
use crate::data::{self};
use crate::encoder::Model;
use crate::encoder::layer_rows::LayerRows;
use crate::model::Classifier;
use crate::rng::Shuffle;

/// The phase-1 classifier and what phase 1 measured.
pub(super) struct Phase1Outcome {
    pub(super) classifier: Classifier,
    pub(super) baseline_test_acc: f64,
    pub(super) pretrain_losses: Vec<f64>,
}

/// Everything phase 1's result depends on: the configuration as phase 1 sees it, and digests of
/// what it reads (the samples, their labels and their features).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Phase1Key {
    pub(super) version: u32,
    pub(super) config: RunConfig,
    pub(super) backbone_sha256: String,
    pub(super) train_source: String,
    pub(super) pretrain: Vec<usize>,
    pub(super) test: Vec<usize>,
    pub(super) labels_sha256: String,
    pub(super) features_sha256: String,
}

/// A finished phase 1, as the cache keeps it (with the classifier's tensors).
#[derive(Serialize, Deserialize)]
pub(super) struct CachedPhase1 {
    pub(super) key: Phase1Key,
    pub(super) baseline_test_acc: f64,
    pub(super) pretrain_losses: Vec<f64>,
}

pub(super) fn release_indices(split: &data::Split, positions: &[usize]) -> Vec<usize> {
    positions.iter().map(|&p| split.release_index[p]).collect()
}

/// sha256 over the bytes of every tensor, in order.
pub(super) fn tensors_sha256(tensors: &[&Tensor]) -> Result<String> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    for t in tensors {
        let values: Vec<f32> =
            crate::kernels::host_reads::flat(&t.to_dtype(candle_core::DType::F32)?)?;
        for v in values {
            hasher.update(v.to_le_bytes());
        }
    }
    Ok(crate::io::hex(&hasher.finalize()))
}

/// One lock per phase-1 file, so that concurrent runs of a grid compute it once. A run that
/// panicked while holding it leaves nothing half-written (the file is written atomically), so a
/// poisoned lock is taken over.
pub(super) fn phase1_lock(file: &Path) -> Arc<Mutex<()>> {
    static LOCKS: std::sync::OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> =
        std::sync::OnceLock::new();
    let locks = LOCKS.get_or_init(Default::default);
    let mut locks = locks.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(locks.entry(file.to_path_buf()).or_default())
}

/// What the phase-1 classifier trains on, and the test features its baseline is scored on.
pub(super) enum Phase1Input<'a> {
    /// One feature per sample (N, D).
    Features {
        pretrain: &'a Tensor,
        test: &'a Tensor,
    },
    /// Every final token of the pretrain samples, from their last-layer inputs (head mode's
    /// `tokens`); the baseline scores the mean-pooled test tokens, which for a linear classifier
    /// is the mean of its per-token logits, and what the head selects right after its reset.
    Tokens {
        layer_inputs: &'a LayerRows,
        test: &'a Tensor,
    },
}

impl<'a> Phase1Input<'a> {
    pub(super) fn of(config: &RunConfig, features: &'a RunFeatures) -> Result<Self> {
        let (pretrain, test) = (&features.pretrain, &features.test);
        Ok(match (config.mode, config.head_classifier) {
            (Mode::LastLayer, _) | (Mode::Head, Some(HeadClassifier::Cls)) => Self::Features {
                pretrain: &pretrain.cls,
                test: &test.cls,
            },
            (Mode::Head, Some(HeadClassifier::Tokens)) => Self::Tokens {
                layer_inputs: layer_inputs(pretrain)?,
                test: &test.mean,
            },
            (Mode::Head, Some(HeadClassifier::Mean) | None) => Self::Features {
                pretrain: &pretrain.mean,
                test: &test.mean,
            },
        })
    }

    pub(super) fn test(&self) -> &'a Tensor {
        match self {
            Self::Features { test, .. } | Self::Tokens { test, .. } => test,
        }
    }

    /// What phase 1's result depends on beyond the configuration, labels and backbone.
    pub(super) fn sha256(&self) -> Result<String> {
        match self {
            Self::Features { pretrain, test } => tensors_sha256(&[pretrain, test]),
            // The final tokens are a function of the layer inputs and the backbone (in the key).
            Self::Tokens { layer_inputs, test } => Ok(crate::io::json_digest(&(
                layer_inputs.content_digest(),
                tensors_sha256(&[test])?,
            ))?),
        }
    }
}

/// Phase 1 drawn from the run's initialisation stream ([`Stream::Init`]): its outcome, and the
/// stream after the classifier's draws (the query/key reset or the head draws next).
pub(super) fn phase1_from_init(
    setup: &Setup,
    prepared: &PreparedData,
    features: &RunFeatures,
    job: &FinetuneJob,
    resumed: Option<&Checkpoint>,
    progress: &dyn Progress,
) -> Result<(Phase1Outcome, rand_chacha::ChaCha8Rng)> {
    let mut init_rng = crate::rng::stream(job.config.seed, crate::rng::Stream::Init);
    let outcome = obtain_phase1(
        setup,
        prepared,
        features,
        job,
        resumed,
        &mut init_rng,
        progress,
    )?;
    Ok((outcome, init_rng))
}

/// Phase 1: the classifier on clean features, from the checkpoint, the shared phase-1 cache, or
/// trained here.
fn obtain_phase1(
    setup: &Setup,
    prepared: &PreparedData,
    features: &RunFeatures,
    job: &FinetuneJob,
    resumed: Option<&Checkpoint>,
    init_rng: &mut rand_chacha::ChaCha8Rng,
    progress: &dyn Progress,
) -> Result<Phase1Outcome> {
    let config = &job.config;
    let classifier = new_classifier(setup, config.mode, init_rng)?;
    let input = Phase1Input::of(config, features)?;
    if let Some(saved) = resumed {
        checkpoint::restore_params("classifier", &classifier.named(), &saved.tensors)?;
        return Ok(Phase1Outcome {
            classifier,
            baseline_test_acc: saved.state.baseline_test_acc,
            pretrain_losses: saved.state.pretrain_losses.clone(),
        });
    }
    let key = phase1_key(setup, prepared, config, &input)?;
    // Phase 1 depends on the pretrain set, not on n or η (the split keeps it fixed across n):
    // runs of a grid share it through the cache, computed once.
    let file = setup.cache.root().join("phase1").join(format!(
        "{}.safetensors",
        &crate::io::json_digest(&key)?[..24]
    ));
    let lock = phase1_lock(&file);
    let _only_one_computes = lock.lock().unwrap_or_else(|e| e.into_inner());
    if let Ok(Some((saved, tensors))) = checkpoint::load_state::<CachedPhase1>(&file, &setup.device)
        && saved.key == key
    {
        checkpoint::restore_params("classifier", &classifier.named(), &tensors)?;
        return Ok(Phase1Outcome {
            classifier,
            baseline_test_acc: saved.baseline_test_acc,
            pretrain_losses: saved.pretrain_losses,
        });
    }
    let pretrain_losses = train_phase1(setup, &classifier, &input, prepared, config, progress)?;
    let baseline_test_acc = evaluate(
        &classifier
            .forward(&input.test().to_device(&setup.device)?)?
            .detach(),
        &prepared.test.labels,
    )?
    .accuracy;
    let saved = CachedPhase1 {
        key,
        baseline_test_acc,
        pretrain_losses,
    };
    checkpoint::save_state(
        &file,
        &saved,
        &checkpoint::named_tensors("classifier", &classifier.named()),
    )?;
    Ok(Phase1Outcome {
        classifier,
        baseline_test_acc,
        pretrain_losses: saved.pretrain_losses,
    })
}

/// The classifier before phase 1. ViT's reads the CLS feature, BERT's its pooler on position 0
/// (when the checkpoint has one), the head mode's the tokens the head selects.
fn new_classifier(
    setup: &Setup,
    mode: Mode,
    init_rng: &mut rand_chacha::ChaCha8Rng,
) -> Result<Classifier> {
    let pooler = match (&setup.backbone.model, mode) {
        (Model::Bert(bert), Mode::LastLayer) => bert
            .pooler
            .as_ref()
            .map(|p| p.bias().map(|b| (p.weight(), b)))
            .map(|p| p.context("pooler.dense has no bias"))
            .transpose()?,
        _ => None,
    };
    let (hidden, classes) = (setup.backbone.hidden_size(), setup.dataset.num_classes());
    Classifier::new(hidden, classes, pooler, init_rng, &setup.device)
}

/// What this phase 1's result depends on, as the shared cache files it.
fn phase1_key(
    setup: &Setup,
    prepared: &PreparedData,
    config: &RunConfig,
    input: &Phase1Input,
) -> Result<Phase1Key> {
    let (source_name, source) = train_source(&setup.dataset, prepared.partition.train_source)?;
    let labels: Vec<u32> = prepared
        .pretrain
        .labels
        .iter()
        .chain(&prepared.test.labels)
        .copied()
        .collect();
    Ok(Phase1Key {
        version: 2,
        config: config.phase1_view(),
        backbone_sha256: setup.backbone.weights_sha256.clone(),
        train_source: source_name.name().to_string(),
        pretrain: release_indices(source, &prepared.partition.pretrain),
        test: release_indices(&setup.dataset.test, &prepared.partition.test),
        labels_sha256: crate::io::json_digest(&labels)?,
        features_sha256: input.sha256()?,
    })
}

/// Trains the classifier on the clean pretrain set; returns each epoch's mean batch loss.
fn train_phase1(
    setup: &Setup,
    classifier: &Classifier,
    input: &Phase1Input,
    prepared: &PreparedData,
    config: &RunConfig,
    progress: &dyn Progress,
) -> Result<Vec<f64>> {
    let mut losses = Vec::new();
    progress.stage("phase 1 epochs", config.pretrain_epochs);
    let schedule = Schedule {
        epochs: config.pretrain_epochs,
        batch_size: config.batch_size,
        optimizer: &config.optimizer,
        shuffle: Shuffle {
            rng: config.rng,
            seed: config.seed,
        },
    };
    let mut on_epoch = |_, loss| {
        losses.push(loss);
        progress.pretrain_epoch(losses.len(), loss);
        progress.advance(1);
    };
    let labels = &prepared.pretrain.labels;
    let device = &setup.device;
    match input {
        Phase1Input::Features { pretrain, .. } => train_classifier(
            classifier,
            &pretrain.to_device(device)?,
            labels,
            &schedule,
            &mut on_epoch,
        )?,
        Phase1Input::Tokens { layer_inputs, .. } => {
            // The final tokens once, spilled beside the cache; every epoch reads them back.
            let model = &setup.backbone.model;
            let tokens = final_tokens(model, layer_inputs, device, Some(setup.cache.root()))?;
            train_classifier_on_tokens(classifier, &tokens, labels, &schedule, &mut on_epoch)?
        }
    }
    // A classifier trained to a non-finite loss is neither kept nor cached.
    for (k, loss) in losses.iter().enumerate() {
        crate::train::metrics::finite_loss("phase-1", k + 1, *loss)?;
    }
    Ok(losses)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that panics while holding the phase-1 lock does not take the other runs of a grid
    /// down with it.
    #[test]
    fn a_poisoned_phase1_lock_is_taken_over() {
        let file = Path::new("/nonexistent/phase1-lock-test");
        let lock = phase1_lock(file);
        let poisoned = Arc::clone(&lock);
        let _ = std::thread::spawn(move || {
            let _held = poisoned.lock().unwrap();
            panic!("a run failed while computing phase 1");
        })
        .join();
        assert!(lock.is_poisoned());
        let again = phase1_lock(file);
        let _held = again.lock().unwrap_or_else(|e| e.into_inner());
    }
}
