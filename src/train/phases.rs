//! The training loops of the real-data protocol (PAPER.md §3), with the Trainer's conventions:
//! shuffled mini-batches of `batch_size` (the last one smaller), one optimizer step each, and the
//! epoch's logged loss the mean of its batch losses.

use anyhow::Result;
use candle_core::Tensor;

use super::optim::{AdamW, OptimizerConfig};
use crate::model::Classifier;
use crate::rng::{Stream, epoch_order};

pub fn steps_per_epoch(n: usize, batch_size: usize) -> usize {
    n.div_ceil(batch_size.max(1))
}

/// Phase 1: trains `classifier` on fixed features (N, D) with clean labels. `on_epoch` gets
/// (epoch, mean batch loss).
#[allow(clippy::too_many_arguments)]
pub fn train_classifier(
    classifier: &Classifier,
    features: &Tensor,
    labels: &[u32],
    epochs: usize,
    batch_size: usize,
    optimizer: &OptimizerConfig,
    seed: u64,
    on_epoch: &mut dyn FnMut(usize, f64),
) -> Result<()> {
    let n = labels.len();
    let targets = Tensor::from_slice(labels, n, features.device())?;
    let mut opt = AdamW::new(
        classifier.named(),
        optimizer.clone(),
        epochs * steps_per_epoch(n, batch_size),
    )?;
    for epoch in 0..epochs {
        let order = epoch_order(n, seed, Stream::PretrainShuffle, epoch);
        let mut losses = Vec::with_capacity(steps_per_epoch(n, batch_size));
        for batch in order.chunks(batch_size) {
            let rows = crate::model::last_layer::row_indices(batch, features.device())?;
            let logits = classifier.forward(&features.index_select(&rows, 0)?)?;
            let loss = candle_nn::loss::cross_entropy(&logits, &targets.index_select(&rows, 0)?)?;
            opt.step(&loss.backward()?)?;
            losses.push(f64::from(loss.to_scalar::<f32>()?));
        }
        on_epoch(epoch, losses.iter().sum::<f64>() / losses.len() as f64);
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
        train_classifier(
            &classifier,
            &features,
            &labels,
            20,
            16,
            &config,
            1,
            &mut |_, l| losses.push(l),
        )
        .unwrap();
        assert_eq!(losses.len(), 20);
        assert!(losses[19] < losses[0] * 0.5, "{losses:?}");
        let accuracy = evaluate(&classifier.forward(&features).unwrap(), &labels)
            .unwrap()
            .accuracy;
        assert!(accuracy >= 0.95, "accuracy {accuracy}");
    }
}
