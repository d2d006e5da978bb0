//! Metrics of a classifier's logits against labels, and of attention distributions: what the
//! per-epoch JSON lines and the paper's Fig. 9 report.

use anyhow::Result;
use candle_core::{D, Tensor};
use serde::Serialize;

/// One epoch of phase 2, as a JSON line.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct EpochMetrics {
    /// 1-based, as the Trainer counts; 0 is the state right after the query/key reset.
    pub epoch: usize,
    /// Mean of the epoch's batch losses on the noisy labels (the Trainer's logged loss, the
    /// paper's Table 2 "train loss"); NaN (null) at epoch 0.
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub train_loss: f64,
    /// Cross-entropy on the noisy fine-tune set evaluated after the epoch (the authors'
    /// `eval_train/eval_loss`, the paper's Fig. 8 "train loss").
    #[serde(default = "nan", deserialize_with = "crate::io::nan_if_null")]
    pub train_eval_loss: f64,
    /// Accuracy on the noisy labels, evaluated after the epoch.
    pub train_acc: f64,
    /// Share of noisy samples predicted as their noisy label (NaN, written null, when none).
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub memorization: f64,
    /// Accuracy on the samples whose label was not flipped.
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub clean_train_acc: f64,
    /// Mean over fine-tune samples (and heads) of the largest attention probability of the
    /// selecting query (the paper's Fig. 9 quantity).
    pub max_cls_attention: f64,
    /// Mean entropy of that attention.
    pub attention_entropy: f64,
    pub test_loss: Option<f64>,
    pub test_acc: Option<f64>,
    /// The query-key eigenspectrum, at the epochs the test set is scored (filled by the caller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_spectrum: Option<crate::diagnostics::Spectrum>,
    /// Rank-collapse residual of the attention output of every token, mean over a probe of test
    /// samples, at the scored epochs of last-layer mode (filled by the caller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_collapse: Option<f64>,
}

fn nan() -> f64 {
    f64::NAN
}

/// Cross-entropy and accuracy of logits (N, C) against labels.
#[derive(Clone, Debug, PartialEq)]
pub struct LossAndAccuracy {
    /// Mean cross-entropy.
    pub loss: f64,
    pub accuracy: f64,
    pub predictions: Vec<u32>,
}

/// A training loss that turned non-finite stops the run: its accuracies mean nothing, and a
/// summary or a cached classifier holding them would be averaged into a grid. `phase` and
/// `epoch` name where.
pub fn finite_loss(phase: &str, epoch: usize, loss: f64) -> Result<()> {
    if loss.is_finite() {
        return Ok(());
    }
    anyhow::bail!(
        "{phase} epoch {epoch}: the training loss is {loss} (not finite); the run stops without a \
         summary and nothing is kept — lower [optimizer] learning_rate or check the data"
    )
}

pub fn evaluate(logits: &Tensor, labels: &[u32]) -> Result<LossAndAccuracy> {
    let targets = Tensor::from_slice(labels, labels.len(), logits.device())?;
    let loss = crate::kernels::host_reads::scalar::<f64>(
        &candle_nn::loss::cross_entropy(logits, &targets)?.to_dtype(candle_core::DType::F64)?,
    )?;
    let predictions: Vec<u32> = crate::kernels::host_reads::flat(&logits.argmax(D::Minus1)?)?;
    let correct = predictions
        .iter()
        .zip(labels)
        .filter(|(p, y)| p == y)
        .count();
    Ok(LossAndAccuracy {
        loss,
        accuracy: correct as f64 / labels.len().max(1) as f64,
        predictions,
    })
}

/// Share of `predictions` equal to `labels` over the samples where `keep` holds (NaN if none).
pub fn accuracy_where(predictions: &[u32], labels: &[u32], keep: impl Fn(usize) -> bool) -> f64 {
    let (mut hit, mut total) = (0usize, 0usize);
    for i in (0..labels.len()).filter(|&i| keep(i)) {
        total += 1;
        hit += usize::from(predictions[i] == labels[i]);
    }
    if total == 0 {
        f64::NAN
    } else {
        hit as f64 / total as f64
    }
}

/// Mean over all rows of the largest probability, and mean entropy −Σ p log p, of attention
/// distributions along the last dimension (any leading shape: samples, heads), with
/// [`crate::diagnostics::entropy`].
pub fn attention_stats(attention: &Tensor) -> Result<(f64, f64)> {
    let width = attention.dim(D::Minus1)?;
    let probs: Vec<f32> = crate::kernels::host_reads::flat(attention)?;
    let rows = (probs.len() / width.max(1)).max(1) as f64;
    // Each row's two numbers on the current pool's threads (a log per probability: phase 2
    // scores 118 000 of them an epoch at ViT-Ti), summed here in row order as before.
    use rayon::prelude::*;
    let per_row: Vec<(f64, f64)> = probs
        .par_chunks_exact(width)
        .with_min_len(64)
        .map(|row| {
            (
                f64::from(row.iter().copied().fold(f32::NEG_INFINITY, f32::max)),
                crate::diagnostics::entropy(row),
            )
        })
        .collect();
    let (mut max_sum, mut entropy_sum) = (0.0, 0.0);
    for (max, entropy) in per_row {
        max_sum += max;
        entropy_sum += entropy;
    }
    Ok((max_sum / rows, entropy_sum / rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_finite_loss_stops_the_run_naming_phase_and_epoch() {
        assert!(finite_loss("phase-2", 3, 0.7).is_ok());
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err = finite_loss("phase-2", 3, bad).unwrap_err().to_string();
            assert!(
                err.starts_with("phase-2 epoch 3: the training loss is")
                    && err.contains("learning_rate"),
                "{err}"
            );
        }
    }
    use candle_core::Device;

    #[test]
    fn cross_entropy_and_accuracy() {
        let logits = Tensor::new(&[[0f32, 0.0], [2.0, 0.0]], &Device::Cpu).unwrap();
        let e = evaluate(&logits, &[1, 0]).unwrap();
        let expected = (2f64.ln() + (1.0 + (-2f64).exp()).ln()) / 2.0;
        assert!((e.loss - expected).abs() < 1e-6, "{} vs {expected}", e.loss);
        assert_eq!(e.predictions, vec![0, 0]);
        assert_eq!(e.accuracy, 0.5);
        assert_eq!(accuracy_where(&e.predictions, &[1, 0], |i| i == 1), 1.0);
        assert!(accuracy_where(&e.predictions, &[1, 0], |_| false).is_nan());
    }

    #[test]
    fn uniform_attention_has_entropy_log_t() {
        let uniform = Tensor::full(0.25f32, (3, 2, 4), &Device::Cpu).unwrap();
        let (max, entropy) = attention_stats(&uniform).unwrap();
        assert!((max - 0.25).abs() < 1e-7);
        assert!((entropy - 4f64.ln()).abs() < 1e-6);
        let one_hot = Tensor::new(&[[1f32, 0.0, 0.0]], &Device::Cpu).unwrap();
        assert_eq!(attention_stats(&one_hot).unwrap(), (1.0, 0.0));
    }
}
