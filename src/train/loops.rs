//! The training loops of the real-data protocol (docs/protocol.md §3), with the Trainer's conventions:
//! shuffled mini-batches of `batch_size` (the last one smaller), one optimizer step each, and the
//! epoch's logged loss the mean of its batch losses.

use anyhow::Result;
use candle_core::{D, Tensor, Var};
use serde::Serialize;

use super::look_ahead::LookAhead;
use super::look_ahead::Pending;
use super::metrics::{accuracy_where, attention_stats, evaluate};
use super::optim::{AdamW, OptimizerConfig};
use crate::encoder::layer_rows::LayerRows;
use crate::model::Classifier;
use crate::rng::{Shuffle, Stream};

pub fn steps_per_epoch(n: usize, batch_size: usize) -> usize {
    n.div_ceil(batch_size.max(1))
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
    let batch = |rows: &[usize]| -> Result<(Tensor, Tensor)> {
        let rows = crate::model::attend::row_indices(rows, features.device())?;
        Ok((
            features.index_select(&rows, 0)?,
            targets.index_select(&rows, 0)?,
        ))
    };
    train_classifier_on(classifier, labels.len(), &batch, schedule, on_epoch)
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
    let batch = |rows: &[usize]| -> Result<(Tensor, Tensor)> {
        let samples = tokens.batch(rows, device)?;
        let mut kept = Vec::with_capacity(rows.len());
        let mut targets = Vec::new();
        for (i, (&row, &len)) in rows.iter().zip(&samples.lengths).enumerate() {
            kept.push(samples.inputs.get(i)?.narrow(0, 0, len)?);
            targets.extend(std::iter::repeat_n(labels[row], len));
        }
        let count = targets.len();
        Ok((
            Tensor::cat(&kept, 0)?,
            Tensor::from_vec(targets, count, device)?,
        ))
    };
    train_classifier_on(classifier, labels.len(), &batch, schedule, on_epoch)
}

/// The features and targets of a batch of sample rows.
type Batch<'a> = dyn Fn(&[usize]) -> Result<(Tensor, Tensor)> + 'a;

/// The phase-1 loop over `n` samples: `batch` gives the features and targets of sample rows.
fn train_classifier_on(
    classifier: &Classifier,
    n: usize,
    batch: &Batch,
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
            let (features, targets) = batch(rows)?;
            let logits = classifier.forward(&features)?;
            let loss = candle_nn::loss::cross_entropy(&logits, &targets)?;
            opt.step(&loss.backward()?)?;
            losses.push(f64::from(loss.to_scalar::<f32>()?));
        }
        on_epoch(epoch, losses.iter().sum::<f64>() / losses.len() as f64);
        // Phase 1 keeps no checkpoint of its own: a run stopped here starts it again.
        crate::interrupt::check()?;
    }
    Ok(())
}

/// Which set a phase-2 forward reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Set {
    /// The n noisy fine-tune samples.
    Finetune,
    Test,
}

/// Logits (B, C) and the attention that selects tokens, (B, …, T), of samples `rows` of a set.
pub type Forward<'a> = dyn Fn(Set, &[usize]) -> Result<(Tensor, Tensor)> + 'a;

/// One training step's arithmetic: the mean data loss of fine-tune samples `rows` against their
/// noisy labels, and its gradient for each trained parameter in the optimizer's order.
pub type Step<'a> = dyn Fn(&[usize]) -> Result<(f64, Vec<Tensor>)> + 'a;

/// The step through autograd: `forward`'s logits of the batch, their cross-entropy against
/// `labels`, and its backward to `params` (zeros for one the loss does not reach).
pub fn autograd_step<'a>(
    forward: &'a Forward<'a>,
    labels: &'a [u32],
    params: Vec<Var>,
) -> impl Fn(&[usize]) -> Result<(f64, Vec<Tensor>)> + 'a {
    move |rows: &[usize]| {
        let (logits, _) = forward(Set::Finetune, rows)?;
        let targets: Vec<u32> = rows.iter().map(|&i| labels[i]).collect();
        let targets = Tensor::from_vec(targets, rows.len(), logits.device())?;
        let loss = candle_nn::loss::cross_entropy(&logits, &targets)?;
        let grads = super::optim::gradients_of(params.iter(), &loss.backward()?)?;
        Ok((f64::from(loss.to_scalar::<f32>()?), grads))
    }
}

/// A regulariser of the trained parameters, added to every batch's loss (e.g. LocAteR).
pub type Penalty<'a> = dyn Fn() -> Result<Tensor> + 'a;

/// The labels phase 2 sees and scores against.
pub struct Phase2Data<'a> {
    /// Noisy labels of the fine-tune set (what is trained on).
    pub labels: &'a [u32],
    pub clean_labels: &'a [u32],
    pub noisy_mask: &'a [bool],
    pub test_labels: &'a [u32],
}

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

/// Samples an evaluation hands the model at once (the streamed test set holds one batch of tokens
/// in memory; the host pass splits it into chunks across threads). Two of the host pass's
/// evaluation chunks of 24, one per core of a 2-core machine: 64 made chunks of 24, 24 and 16,
/// and one core did 40 rows while the other did 24.
const EVAL_BATCH: usize = 48;

fn nan() -> f64 {
    f64::NAN
}

/// Logits and attention of a whole set, in chunks.
fn forward_all(forward: &Forward, set: Set, len: usize) -> Result<(Tensor, Tensor)> {
    let rows: Vec<usize> = (0..len).collect();
    let (mut logits, mut attention) = (Vec::new(), Vec::new());
    for chunk in rows.chunks(EVAL_BATCH) {
        let (l, a) = forward(set, chunk)?;
        logits.push(l.detach());
        attention.push(a.detach());
    }
    // A text chunk is padded to its own longest sample, so its attention may be narrower than
    // another's: widen each to the widest with zero probabilities, what a padded key gets.
    let mut width = 0;
    for a in &attention {
        width = width.max(a.dim(D::Minus1)?);
    }
    let attention = attention
        .into_iter()
        .map(|a| {
            let missing = width - a.dim(D::Minus1)?;
            a.pad_with_zeros(D::Minus1, 0, missing)
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok((Tensor::cat(&logits, 0)?, Tensor::cat(&attention, 0)?))
}

/// Logits of the whole test set, a chunk at a time; its attention is not kept, so nothing but the
/// (N, C) logits grows with the test set.
fn test_logits(forward: &Forward, len: usize) -> Result<Tensor> {
    let rows: Vec<usize> = (0..len).collect();
    let logits = rows
        .chunks(EVAL_BATCH)
        .map(|chunk| Ok(forward(Set::Test, chunk)?.0.detach()))
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&logits, 0)?)
}

/// The metrics after `epoch` epochs (0: before any step): the fine-tune set evaluated, the test
/// set when `score_test`, and the mean of the epoch's `batch_losses` (none at epoch 0).
fn measure(
    forward: &Forward,
    data: &Phase2Data,
    epoch: usize,
    batch_losses: Option<&[f64]>,
    score_test: bool,
) -> Result<EpochMetrics> {
    let (logits, attention) = forward_all(forward, Set::Finetune, data.labels.len())?;
    let test = if score_test {
        let logits = test_logits(forward, data.test_labels.len())?;
        Some(evaluate(&logits, data.test_labels)?)
    } else {
        None
    };
    metrics_of(&logits, &attention, data, epoch, batch_losses, test)
}

/// The metrics after `epoch` epochs from the fine-tune set's `logits` (N, C) and `attention`
/// (N, …, T), the epoch's `batch_losses` and the test set's evaluation when scored.
fn metrics_of(
    logits: &Tensor,
    attention: &Tensor,
    data: &Phase2Data,
    epoch: usize,
    batch_losses: Option<&[f64]>,
    test: Option<super::metrics::Evaluation>,
) -> Result<EpochMetrics> {
    let train = evaluate(logits, data.labels)?;
    let (max_cls_attention, attention_entropy) = attention_stats(attention)?;
    Ok(EpochMetrics {
        epoch,
        train_loss: batch_losses.map_or(f64::NAN, |l| l.iter().sum::<f64>() / l.len() as f64),
        train_eval_loss: train.loss,
        train_acc: train.accuracy,
        memorization: accuracy_where(&train.predictions, data.labels, |i| data.noisy_mask[i]),
        clean_train_acc: accuracy_where(&train.predictions, data.clean_labels, |i| {
            !data.noisy_mask[i]
        }),
        max_cls_attention,
        attention_entropy,
        test_loss: test.as_ref().map(|t| t.loss),
        test_acc: test.as_ref().map(|t| t.accuracy),
        qk_spectrum: None,
        rank_collapse: None,
    })
}

/// What phase 2 computes with: the evaluation of a set, the training step, and optionally the
/// step that also evaluates the last epoch's parameters and a penalty on the trained ones.
pub struct Phase2Model<'a> {
    pub forward: &'a Forward<'a>,
    pub step: &'a Step<'a>,
    /// With it, an epoch that is not scored, not kept and not interrupted is evaluated during
    /// the next one.
    pub look_ahead: Option<&'a LookAhead<'a>>,
    /// Joins the descended objective; the logged train loss stays the data loss.
    pub penalty: Option<&'a Penalty<'a>>,
}

/// How phase 2 steps: the epochs to run, the batches, and when the test set is scored.
pub struct Phase2Schedule {
    /// Epochs `start_epoch..epochs` (0-based) run; `epochs` is the run's whole length.
    pub start_epoch: usize,
    pub epochs: usize,
    pub batch_size: usize,
    pub shuffle: Shuffle,
    /// The test set is scored every `eval_every` epochs and after the last one.
    pub eval_every: usize,
    /// Epoch 0 (right after the reset, before any step) is measured and logged first.
    pub measure_reset: bool,
}

/// Phase 2: trains the optimizer's parameters by the model's step on the noisy labels for the
/// schedule's epochs, in its batch order, evaluating through the model's forward after each
/// epoch. `optimizer` must have been built for all the schedule's epochs (its state restored on
/// resume).
///
/// `on_epoch` gets each epoch's metrics in order, with the optimizer when it still holds that
/// epoch's end state; with a look-ahead, an epoch evaluated during the next one comes without
/// the optimizer.
pub fn train_phase2(
    model: &Phase2Model,
    optimizer: &mut AdamW,
    data: &Phase2Data,
    schedule: &Phase2Schedule,
    on_epoch: &mut dyn FnMut(&EpochMetrics, Option<&AdamW>) -> Result<()>,
) -> Result<()> {
    let Phase2Model {
        forward,
        step,
        look_ahead,
        penalty,
    } = *model;
    let Phase2Schedule {
        start_epoch,
        epochs,
        batch_size,
        shuffle,
        eval_every,
        measure_reset,
    } = *schedule;
    let n = data.labels.len();
    if measure_reset {
        // Epoch 0: right after the reset, before any step, with the test set scored, so that
        // the reset's cost and the noise's are two numbers.
        on_epoch(&measure(forward, data, 0, None, true)?, Some(optimizer))?;
    }
    let mut pending: Option<Pending> = None;
    for epoch in start_epoch..epochs {
        let order = shuffle.order(n, Stream::FinetuneShuffle, epoch);
        // The steps fork and join dozens of times each: the pool's other threads stay awake
        // through them (`with_workers_awake`), and sleep again for the metrics.
        let losses = crate::runtime::with_workers_awake(|| -> Result<Vec<f64>> {
            let mut losses = Vec::with_capacity(steps_per_epoch(n, batch_size));
            for batch in order.chunks(batch_size) {
                let (loss, mut grads) = match (&mut pending, look_ahead) {
                    (Some(pending), Some(look_ahead)) => {
                        let (loss, grads, evaluated) = (look_ahead.step)(batch, &pending.params)?;
                        pending.record(n, batch, &evaluated)?;
                        (loss, grads)
                    }
                    _ => step(batch)?,
                };
                if let Some(penalty) = penalty {
                    // The penalty's gradient joins the data loss's: they are the objective's.
                    let store = penalty()?.backward()?;
                    for (grad, extra) in grads.iter_mut().zip(optimizer.gradients(&store)?) {
                        *grad = (&*grad + extra)?;
                    }
                }
                optimizer.apply(grads)?;
                losses.push(loss);
            }
            Ok(losses)
        })?;
        if let Some(pending) = pending.take() {
            let earlier = pending.finish(n)?;
            let metrics = metrics_of(
                &earlier.logits,
                &earlier.attention,
                data,
                earlier.epoch,
                Some(&earlier.batch_losses),
                None,
            )?;
            on_epoch(&metrics, None)?;
        }
        let done = epoch + 1;
        let last = done == epochs;
        let score_test = last || done.is_multiple_of(eval_every.max(1));
        let defer = look_ahead.is_some_and(|l| !(l.kept)(done))
            && !score_test
            && crate::interrupt::requested().is_none();
        if defer {
            pending = Some(Pending::new(done, losses, optimizer)?);
        } else {
            let metrics = measure(forward, data, done, Some(&losses), score_test)?;
            on_epoch(&metrics, Some(optimizer))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::look_ahead::EvaluatingStep;
    use crate::train::metrics::evaluate;
    use candle_core::{DType, Device, Var};
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};

    /// Text chunks are padded to their own longest sample: a set of several chunks joins
    /// attention of different widths, the narrower ones widened with zeros.
    #[test]
    fn a_set_of_chunks_of_different_widths_joins() {
        let forward = |_: Set, rows: &[usize]| -> Result<(Tensor, Tensor)> {
            let width = 2 + (rows[0] / EVAL_BATCH) % 3;
            let logits = Tensor::zeros((rows.len(), 2), DType::F32, &Device::Cpu)?;
            let attention = Tensor::full(1.0 / width as f32, (rows.len(), 1, width), &Device::Cpu)?;
            Ok((logits, attention))
        };
        let b = EVAL_BATCH;
        let n = 2 * b + 22;
        let (logits, attention) = forward_all(&forward, Set::Finetune, n).unwrap();
        assert_eq!(logits.dims(), [n, 2]);
        // Chunks start at rows 0, b and 2b: widths 2, 3 and 4.
        assert_eq!(attention.dims(), [n, 1, 4]);
        let row = |r: usize| {
            attention
                .get(r)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        assert_eq!(row(0), [0.5, 0.5, 0.0, 0.0]);
        assert_eq!(row(n - 1), [0.25; 4]);
        let (max, _) = attention_stats(&attention).unwrap();
        let expected = (b as f64 * 0.5 + b as f64 / 3.0 + 22.0 * 0.25) / n as f64;
        assert!((max - expected).abs() < 1e-6, "{max} vs {expected}");
    }

    /// With a look-ahead, every epoch's metrics are those the loop measures at each epoch's end
    /// without one, in the same order; the deferred epochs come without the optimizer, and the
    /// kept, scored and last ones with it.
    #[test]
    fn look_ahead_gives_every_epochs_metrics_in_order() {
        let (n, batch, epochs, eval_every, kept_epoch) = (10, 4, 7, 5, 3);
        let labels: Vec<u32> = (0..n as u32).map(|k| k % 2).collect();
        let mask: Vec<bool> = (0..n).map(|k| k % 3 == 0).collect();
        let data = Phase2Data {
            labels: &labels,
            clean_labels: &labels,
            noisy_mask: &mask,
            test_labels: &labels[..4],
        };
        // Logits and attention that differ from row to row, at parameters `bias`.
        let at = |bias: &Tensor, rows: &[usize]| -> Result<(Tensor, Tensor)> {
            let scale: Vec<f32> = rows.iter().map(|&r| 1.0 + 0.1 * r as f32).collect();
            let scale = Tensor::from_vec(scale, (rows.len(), 1), &Device::Cpu)?;
            let logits = bias.unsqueeze(0)?.broadcast_mul(&scale)?;
            let share = |r: usize| (r + 1) as f32 / (n + 1) as f32;
            let attention: Vec<f32> = rows
                .iter()
                .flat_map(|&r| [share(r), 1.0 - share(r)])
                .collect();
            Ok((
                logits,
                Tensor::from_vec(attention, (rows.len(), 1, 2), &Device::Cpu)?,
            ))
        };
        let run = |look: bool| -> Vec<(String, bool)> {
            let bias =
                Var::from_tensor(&Tensor::new(&[0.3f32, -0.2], &Device::Cpu).unwrap()).unwrap();
            let forward = |_: Set, rows: &[usize]| at(bias.as_tensor(), rows);
            let step = autograd_step(&forward, &labels, vec![bias.clone()]);
            let evaluating = |rows: &[usize], earlier: &[Tensor]| -> Result<EvaluatingStep> {
                let (loss, grads) = step(rows)?;
                Ok((loss, grads, at(&earlier[0], rows)?))
            };
            let look_ahead = LookAhead {
                step: &evaluating,
                kept: &|epoch| epoch == kept_epoch,
            };
            let mut opt = AdamW::new(
                vec![("bias".into(), bias.clone())],
                OptimizerConfig {
                    learning_rate: 0.1,
                    ..Default::default()
                },
                epochs * steps_per_epoch(n, batch),
            )
            .unwrap();
            let mut seen = Vec::new();
            train_phase2(
                &Phase2Model {
                    forward: &forward,
                    step: &step,
                    look_ahead: look.then_some(&look_ahead),
                    penalty: None,
                },
                &mut opt,
                &data,
                &Phase2Schedule {
                    start_epoch: 0,
                    epochs,
                    batch_size: batch,
                    shuffle: Shuffle::own(3),
                    eval_every,
                    measure_reset: true,
                },
                &mut |m, opt| {
                    seen.push((format!("{m:?}"), opt.is_some()));
                    Ok(())
                },
            )
            .unwrap();
            seen
        };
        let (plain, ahead) = (run(false), run(true));
        assert_eq!(plain.len(), epochs + 1);
        for (epoch, (a, b)) in plain.iter().zip(&ahead).enumerate() {
            assert_eq!(a.0, b.0, "epoch {epoch}'s metrics");
            assert!(a.1, "without a look-ahead every epoch has its optimizer");
            let at_its_end =
                epoch == 0 || epoch == kept_epoch || epoch % eval_every == 0 || epoch == epochs;
            assert_eq!(b.1, at_its_end, "epoch {epoch}: optimizer given");
        }
        // The parameters moved: a deferred epoch's metrics differ from its neighbours'.
        assert_ne!(
            plain[1].0.replace("epoch: 1", ""),
            plain[2].0.replace("epoch: 2", "")
        );
    }

    fn authors(seed: u64) -> Shuffle {
        Shuffle {
            rng: crate::rng::RngChoice::Authors,
            seed,
        }
    }

    /// Phase 2 under `--rng authors` takes its batches from `randperm(n, seed + e)` in epoch e:
    /// the training forwards of each epoch, in order, read exactly that permutation.
    #[test]
    fn phase_two_batches_follow_randperm_of_seed_plus_epoch() {
        let (n, batch, epochs, seed) = (40, 16, 3, 314);
        let bias = Var::zeros(2, DType::F32, &Device::Cpu).unwrap();
        let calls = std::cell::RefCell::new(Vec::new());
        let forward = |set: Set, rows: &[usize]| -> Result<(Tensor, Tensor)> {
            calls.borrow_mut().push((set, rows.to_vec()));
            let logits = bias.as_tensor().unsqueeze(0)?.repeat((rows.len(), 1))?;
            let attention = Tensor::full(0.5f32, (rows.len(), 1, 2), &Device::Cpu)?;
            Ok((logits, attention))
        };
        let labels: Vec<u32> = (0..n as u32).map(|k| k % 2).collect();
        let mask = vec![false; n];
        let data = Phase2Data {
            labels: &labels,
            clean_labels: &labels,
            noisy_mask: &mask,
            test_labels: &labels[..4],
        };
        let steps = epochs * steps_per_epoch(n, batch);
        let mut opt = AdamW::new(
            vec![("bias".into(), bias.clone())],
            OptimizerConfig::default(),
            steps,
        )
        .unwrap();
        let mut epoch_calls = Vec::new();
        let step = autograd_step(&forward, &labels, vec![bias.clone()]);
        train_phase2(
            &Phase2Model {
                forward: &forward,
                step: &step,
                look_ahead: None,
                penalty: None,
            },
            &mut opt,
            &data,
            &Phase2Schedule {
                start_epoch: 0,
                epochs,
                batch_size: batch,
                shuffle: authors(seed),
                eval_every: usize::MAX,
                measure_reset: false,
            },
            &mut |_, _| {
                epoch_calls.push(calls.borrow_mut().split_off(0));
                Ok(())
            },
        )
        .unwrap();
        for (e, calls) in epoch_calls.iter().enumerate() {
            // The epoch's training batches come first; the evaluation forwards follow.
            let trained: Vec<usize> = calls[..steps_per_epoch(n, batch)]
                .iter()
                .flat_map(|(set, rows)| {
                    assert_eq!(*set, Set::Finetune);
                    rows.clone()
                })
                .collect();
            assert_eq!(
                trained,
                crate::rng::torch::randperm(n, seed + e as u64),
                "epoch {e}"
            );
            assert_eq!(calls[1].1.len(), batch);
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
