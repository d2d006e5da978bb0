//! Phase 1's training loop (docs/protocol.md §3), with the Trainer's conventions: shuffled
//! mini-batches of `batch_size` (the last one smaller), one optimizer step each, and the epoch's
//! logged loss the mean of its batch losses. Phase 2 steps the same way (`phase2::epochs`).

use anyhow::Result;
use candle_core::Tensor;

use super::optim::{AdamW, OptimizerConfig};
use crate::encoder::layer_rows::LayerRows;
use crate::model::Classifier;
use crate::rng::{Shuffle, Stream};

/// Batches of an epoch of `n` samples (the last one smaller): both phases step this many times.
pub fn steps_per_epoch(n: usize, batch_size: usize) -> usize {
    n.div_ceil(batch_size.max(1))
}

/// What the classifier trains on in one step: features (B, D) and their targets (B).
pub struct ClassifierBatch {
    pub features: Tensor,
    pub targets: Tensor,
}

/// How phase 1 steps: epochs, batch size, optimizer and the batch order.
pub struct Schedule<'a> {
    pub epochs: usize,
    pub batch_size: usize,
    pub optimizer: &'a OptimizerConfig,
    pub shuffle: Shuffle,
}

/// Phase 1: trains `classifier` on fixed features (N, D) with clean labels. `on_epoch` gets
/// (epoch, mean batch loss).
pub fn train_classifier(
    classifier: &Classifier,
    features: &Tensor,
    labels: &[u32],
    schedule: &Schedule,
    on_epoch: &mut dyn FnMut(usize, f64),
) -> Result<()> {
    let targets = Tensor::from_slice(labels, labels.len(), features.device())?;
    let batch = |rows: &[usize]| -> Result<ClassifierBatch> {
        let rows = crate::model::attend::row_indices(rows, features.device())?;
        Ok(ClassifierBatch {
            features: features.index_select(&rows, 0)?,
            targets: targets.index_select(&rows, 0)?,
        })
    };
    train_classifier_on(classifier, labels.len(), batch, schedule, on_epoch)
}

/// Phase 1 on every token of each sample, each labelled with its sample's label (head mode's
/// `tokens` classifier): a batch of samples is all their unpadded tokens, the loss their mean.
pub fn train_classifier_on_tokens(
    classifier: &Classifier,
    tokens: &LayerRows,
    labels: &[u32],
    schedule: &Schedule,
    on_epoch: &mut dyn FnMut(usize, f64),
) -> Result<()> {
    let device = classifier.weight.device();
    let batch = |rows: &[usize]| -> Result<ClassifierBatch> {
        let samples = tokens.batch(rows, device)?;
        let mut kept = Vec::with_capacity(rows.len());
        let mut targets = Vec::new();
        for (i, (&row, &len)) in rows.iter().zip(&samples.lengths).enumerate() {
            kept.push(samples.inputs.get(i)?.narrow(0, 0, len)?);
            targets.extend(std::iter::repeat_n(labels[row], len));
        }
        let count = targets.len();
        Ok(ClassifierBatch {
            features: Tensor::cat(&kept, 0)?,
            targets: Tensor::from_vec(targets, count, device)?,
        })
    };
    train_classifier_on(classifier, labels.len(), batch, schedule, on_epoch)
}

/// The phase-1 loop over `n` samples: `batch` gives the features and targets of sample rows.
fn train_classifier_on(
    classifier: &Classifier,
    n: usize,
    batch: impl Fn(&[usize]) -> Result<ClassifierBatch>,
    schedule: &Schedule,
    on_epoch: &mut dyn FnMut(usize, f64),
) -> Result<()> {
    let (epochs, batch_size) = (schedule.epochs, schedule.batch_size);
    let mut opt = AdamW::new(
        classifier.named(),
        schedule.optimizer.clone(),
        epochs * steps_per_epoch(n, batch_size),
    )?;
    for epoch in 0..epochs {
        let order = schedule.shuffle.order(n, Stream::PretrainShuffle, epoch);
        let mut losses = Vec::with_capacity(steps_per_epoch(n, batch_size));
        for rows in order.chunks(batch_size) {
            let ClassifierBatch { features, targets } = batch(rows)?;
            let (loss, grads) = classifier.cross_entropy_gradients(&features, &targets)?;
            opt.step(&grads)?;
            losses.push(loss.detach());
        }
        // The epoch's batch losses in one read, not one a step (on a device each is a sync).
        let losses: Vec<f32> = crate::kernels::host_reads::flat(&Tensor::stack(&losses, 0)?)?;
        let mean = losses.iter().map(|&l| f64::from(l)).sum::<f64>() / losses.len() as f64;
        on_epoch(epoch, mean);
        // Phase 1 keeps no checkpoint of its own: a run stopped here starts it again.
        crate::interrupt::check()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::metrics::evaluate;
    use candle_core::Device;
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};

    fn authors(seed: u64) -> Shuffle {
        Shuffle {
            rng: crate::rng::RngChoice::Authors,
            seed,
        }
    }

    /// Phase 1 under `--rng authors` equals the same loop written out over
    /// `randperm(n, seed + e)`, and differs from our own order.
    #[test]
    fn phase_one_batches_follow_randperm_of_seed_plus_epoch() {
        let (n, d, batch, epochs, seed) = (37, 4, 8, 3, 2718);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let noise = Normal::new(0.0f32, 1.0).unwrap();
        let values: Vec<f32> = (0..n * d).map(|_| noise.sample(&mut rng)).collect();
        let features = Tensor::from_vec(values, (n, d), &Device::Cpu).unwrap();
        let labels: Vec<u32> = (0..n as u32).map(|k| k % 3).collect();
        let config = OptimizerConfig {
            learning_rate: 1e-2,
            ..Default::default()
        };
        let trained = |shuffle: Shuffle| {
            let mut init = rand_chacha::ChaCha8Rng::seed_from_u64(9);
            let classifier = Classifier::new(d, 3, None, &mut init, &Device::Cpu).unwrap();
            let schedule = Schedule {
                epochs,
                batch_size: batch,
                optimizer: &config,
                shuffle,
            };
            train_classifier(&classifier, &features, &labels, &schedule, &mut |_, _| {}).unwrap();
            classifier
        };
        let weights = |c: &Classifier| -> Vec<f32> {
            c.named()
                .iter()
                .flat_map(|(_, v)| {
                    v.as_tensor()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap()
                })
                .collect()
        };
        // The reference: the authors' order spelled out.
        let mut init = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let reference = Classifier::new(d, 3, None, &mut init, &Device::Cpu).unwrap();
        let targets = Tensor::from_slice(&labels, n, &Device::Cpu).unwrap();
        let mut opt = AdamW::new(
            reference.named(),
            config.clone(),
            epochs * steps_per_epoch(n, batch),
        )
        .unwrap();
        for e in 0..epochs {
            for rows in crate::rng::torch::randperm(n, seed + e as u64).chunks(batch) {
                let rows = crate::model::attend::row_indices(rows, &Device::Cpu).unwrap();
                let logits = reference
                    .forward(&features.index_select(&rows, 0).unwrap())
                    .unwrap();
                let loss = candle_nn::loss::cross_entropy(
                    &logits,
                    &targets.index_select(&rows, 0).unwrap(),
                )
                .unwrap();
                opt.step(&loss.backward().unwrap()).unwrap();
            }
        }
        let authors_weights = weights(&trained(authors(seed)));
        assert_eq!(authors_weights, weights(&reference));
        assert_ne!(authors_weights, weights(&trained(Shuffle::own(seed))));
    }

    /// Two Gaussian blobs in 8 dimensions: the classifier separates them and the loss falls.
    #[test]
    fn phase_one_fits_separable_features() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let noise = Normal::new(0.0f32, 1.0).unwrap();
        let (n, d) = (200, 8);
        let labels: Vec<u32> = (0..n).map(|i| (i % 2) as u32).collect();
        let values: Vec<f32> = (0..n * d)
            .map(|k| {
                noise.sample(&mut rng)
                    + if k % d == 0 {
                        3.0 * (2.0 * labels[k / d] as f32 - 1.0)
                    } else {
                        0.0
                    }
            })
            .collect();
        let features = Tensor::from_vec(values, (n, d), &Device::Cpu).unwrap();
        let classifier = Classifier::new(d, 2, None, &mut rng, &Device::Cpu).unwrap();
        let config = OptimizerConfig {
            learning_rate: 1e-2,
            ..Default::default()
        };
        let mut losses = Vec::new();
        let schedule = Schedule {
            epochs: 20,
            batch_size: 16,
            optimizer: &config,
            shuffle: Shuffle::own(1),
        };
        train_classifier(&classifier, &features, &labels, &schedule, &mut |_, l| {
            losses.push(l)
        })
        .unwrap();
        assert_eq!(losses.len(), 20);
        assert!(losses[19] < losses[0] * 0.5, "{losses:?}");
        let accuracy = evaluate(&classifier.forward(&features).unwrap(), &labels)
            .unwrap()
            .accuracy;
        assert!(accuracy >= 0.95, "accuracy {accuracy}");
    }
}
