//! What every synthetic model's run records, and the loop that records it: full-batch gradient
//! descent from step 0 to `num_steps`, the training set's forward at every step (its attention
//! kept for the plots with `Trace::Full`), the test set's and the metrics every `log_interval`
//! steps and at the last, then the summary and the regime (docs/protocol.md §2.3).
//!
//! Localization diagnostics (docs/protocol.md §5) ride along: the attention entropy of clean and
//! noisy samples at every logged step; with `Trace::Full` or `Trace::FinalWithSpectrum`, the
//! symmetric part's eigen-mean and -variance of the query-key matrix (exact from traces) at every
//! logged step and at step 0, and its full complex spectrum at the end when d ≤
//! [`FULL_SPECTRUM_MAX_DIM`].
//!
//! Step s means "after s updates": the forward at step s is the pre-update forward of update s+1
//! (the authors record attention there), and the last logged step is s = num_steps.

use std::time::Instant;

use anyhow::Result;
use candle_core::{Device, Tensor};
use nalgebra::DMatrix;
use serde::Serialize;

use super::config::SyntheticConfig;
use super::data::TokenSet;
use super::engine::EngineKind;
use super::model::{Forward, Regime};
use crate::diagnostics::{Spectrum, SymmetricSpectrum, Traces, spectrum};

/// Largest d whose full complex spectrum is computed at the end of a run: the eigen-solver is
/// O(d³) (about a second at d = 1000 on one core); above it only the symmetric part is reported.
pub const FULL_SPECTRUM_MAX_DIM: usize = 1000;

/// A synthetic model as the loop trains it: the token selector (through its engine) or the
/// one-layer encoder.
pub trait SyntheticModel {
    /// The model on the training samples at the current parameters.
    fn train_forward(&mut self, train: &EvalSet) -> Result<Forward>;
    /// The model on the test samples at the current parameters.
    fn test_forward(&mut self, test: &EvalSet) -> Result<Forward>;
    /// One full-batch gradient step; `train` is [`train_forward`](Self::train_forward)'s result
    /// at the current parameters.
    fn step(&mut self, train: &Forward) -> Result<()>;
    /// The direction u that scores a token x as x · u (the token selector's W p).
    fn scoring_direction(&mut self) -> Result<Vec<f64>>;
    /// tr, tr² and ‖·‖_F² of the query-key matrix: its symmetric part's spectrum.
    fn key_query_traces(&mut self) -> Result<Traces>;
    /// The query-key matrix, d × d row-major: for its complex spectrum.
    fn key_query(&mut self) -> Result<Vec<f64>>;
    /// Whether [`key_query_traces`](Self::key_query_traces) is cheap enough for every logged
    /// step; if not, the spectrum is taken at the start and at the end only.
    fn spectrum_at_every_log(&self) -> bool {
        true
    }
}

/// How much of the trajectory to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trace {
    /// Metrics every `log_interval` steps and the attention of every training sample at every
    /// step (for the plots).
    Full,
    /// The final step only (grids).
    FinalOnly,
    /// The final step, with the spectrum diagnostics (and the symmetric part's at step 0).
    FinalWithSpectrum,
    /// Metrics every `log_interval` steps and nothing else (a stopping rule's checkpoints).
    Checkpoints,
}

/// Metrics at one logged step.
#[derive(Clone, Debug, Serialize)]
pub struct StepMetrics {
    pub step: usize,
    pub train_loss: f64,
    pub train_acc: f64,
    pub test_loss: f64,
    pub test_acc: f64,
    /// Accuracy on the clean (not flipped) training samples.
    pub clean_train_acc: f64,
    /// Noisy samples classified as their flipped label.
    pub noisy_fitted: usize,
    pub noisy_total: usize,
    /// Mean softmax probability of each token position over clean training samples.
    pub clean_token_probs: Vec<f64>,
    /// The same over noisy training samples (empty without label noise).
    pub noisy_token_probs: Vec<f64>,
    /// Mean attention entropy of clean training samples (log T: uniform, 0: one token).
    pub clean_entropy: f64,
    /// The same over noisy training samples (null without label noise).
    pub noisy_entropy: Option<f64>,
    /// Eigen-mean and -variance of W's symmetric part (not with `Trace::FinalOnly`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qk_symmetric: Option<SymmetricSpectrum>,
}

/// Which role a selected token plays for its sample.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SelectionCounts {
    /// x_1 = μ_{Y*} + ε.
    pub relevant: usize,
    /// x_2 = ρμ_{Y*} + ε.
    pub weak_same: usize,
    /// x_3 = ρμ_{−Y*} + ε: carries the flipped label's signal.
    pub weak_opposite: usize,
    /// x_4..x_T = ε: memorised noise.
    pub irrelevant: usize,
}

impl SelectionCounts {
    fn add(&mut self, position: usize) {
        match position {
            0 => self.relevant += 1,
            1 => self.weak_same += 1,
            2 => self.weak_opposite += 1,
            _ => self.irrelevant += 1,
        }
    }
}

/// The final state of a run in a few numbers.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub train_acc: f64,
    pub test_acc: f64,
    pub train_loss: f64,
    pub test_loss: f64,
    pub clean_train_acc: f64,
    pub noisy_fitted: usize,
    pub noisy_total: usize,
    /// Mean final probability of x_1 over clean training samples.
    pub clean_x1_prob: f64,
    /// Mean final probability of x_3 over noisy training samples (null without label noise).
    pub noisy_x3_prob: Option<f64>,
    /// Most attended token of each noisy training sample, by role.
    pub noisy_selected: SelectionCounts,
    /// Final mean attention entropy of clean training samples.
    pub clean_entropy: f64,
    /// The same of noisy training samples (null without label noise).
    pub noisy_entropy: Option<f64>,
    /// W's symmetric-part spectrum at initialisation and at the end (null with `FinalOnly`).
    pub qk_symmetric_init: Option<SymmetricSpectrum>,
    pub qk_symmetric: Option<SymmetricSpectrum>,
    /// W's full spectrum at the end: real parts, moduli, symmetric part (d ≤
    /// `FULL_SPECTRUM_MAX_DIM` and not `FinalOnly`; else null).
    pub qk_spectrum: Option<Spectrum>,
    /// ‖μ‖/√d.
    pub snr: f64,
    pub regime: Regime,
    /// The token selector's training engine (absent for the encoder).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineKind>,
    /// "independent" or "paper (shared seed)".
    pub test_set: &'static str,
    pub wall_seconds: f64,
}

/// The most attended token of one sample at the end of training, in the μ_{+1}/μ_{−1} plane.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SelectedToken {
    pub position: usize,
    /// Coordinate along μ_{+1}/‖μ‖ (= e_1) of the selected token.
    pub mu_plus: f32,
    /// Coordinate along μ_{−1}/‖μ‖ (= e_2).
    pub mu_minus: f32,
    pub label: f64,
    pub noisy: bool,
}

pub struct SyntheticRun {
    pub config: SyntheticConfig,
    pub metrics: Vec<StepMetrics>,
    /// Attention of every training sample at every step, (num_steps + 1) × (n·T); empty for
    /// `Trace::FinalOnly`.
    pub attention_trace: Vec<Vec<f32>>,
    pub noisy_mask: Vec<bool>,
    pub selected_train: Vec<SelectedToken>,
    pub selected_test: Vec<SelectedToken>,
    /// Final u = W p (d): the direction that scores every token.
    pub scoring_direction: Vec<f64>,
    pub summary: RunSummary,
}

/// A labelled set ready to be scored by any u = W p, or put through the encoder.
pub struct EvalSet {
    pub seq_len: usize,
    /// (num_samples·T, d), f32 as the tokens.
    pub tokens: Tensor,
    pub head_values: Vec<f64>,
    pub labels: Vec<f64>,
    pub noisy_mask: Vec<bool>,
    /// (e_1, e_2) coordinates of every token.
    plane: Vec<(f32, f32)>,
}

impl EvalSet {
    pub fn new(set: TokenSet, signal_norm: f64) -> Result<Self> {
        let head_values = set.head_values(signal_norm);
        let plane = set
            .tokens
            .chunks_exact(set.embed_dim)
            .map(|x| (x[0], x[1]))
            .collect();
        let shape = (set.num_samples * set.seq_len, set.embed_dim);
        Ok(Self {
            seq_len: set.seq_len,
            tokens: Tensor::from_vec(set.tokens, shape, &Device::Cpu)?,
            head_values,
            labels: set.labels,
            noisy_mask: set.noisy_mask,
            plane,
        })
    }

    /// The token selector with scoring direction u = W p on this set.
    pub fn forward(&self, direction: &[f64]) -> Result<Forward> {
        let u: Vec<f32> = direction.iter().map(|&v| v as f32).collect();
        let u = Tensor::from_vec(u, (direction.len(), 1), &Device::Cpu)?;
        let logits: Vec<f32> = self.tokens.matmul(&u)?.flatten_all()?.to_vec1()?;
        let logits: Vec<f64> = logits.into_iter().map(f64::from).collect();
        Ok(Forward::new(
            &logits,
            &self.head_values,
            &self.labels,
            self.seq_len,
        ))
    }

    fn selected(&self, forward: &Forward) -> Vec<SelectedToken> {
        (0..self.labels.len())
            .map(|i| {
                let position = forward.selected_token(i);
                let (mu_plus, mu_minus) = self.plane[i * self.seq_len + position];
                SelectedToken {
                    position,
                    mu_plus,
                    mu_minus,
                    label: self.labels[i],
                    noisy: self.noisy_mask[i],
                }
            })
            .collect()
    }
}

/// Training-set metrics that need the noisy mask.
fn step_metrics(
    step: usize,
    train: &Forward,
    test: &Forward,
    labels: &[f64],
    noisy_mask: &[bool],
    qk_symmetric: Option<SymmetricSpectrum>,
) -> StepMetrics {
    let noisy_total = noisy_mask.iter().filter(|&&m| m).count();
    let noisy_fitted = (0..labels.len())
        .filter(|&i| noisy_mask[i] && train.fits(i, labels[i]))
        .count();
    let clean_total = labels.len() - noisy_total;
    let clean_fitted = (0..labels.len())
        .filter(|&i| !noisy_mask[i] && train.fits(i, labels[i]))
        .count();
    StepMetrics {
        step,
        train_loss: train.loss,
        train_acc: train.accuracy,
        test_loss: test.loss,
        test_acc: test.accuracy,
        clean_train_acc: clean_fitted as f64 / clean_total.max(1) as f64,
        noisy_fitted,
        noisy_total,
        clean_token_probs: train.mean_attention(|i| !noisy_mask[i]),
        noisy_token_probs: train.mean_attention(|i| noisy_mask[i]),
        clean_entropy: train.mean_entropy(|i| !noisy_mask[i]).unwrap_or(f64::NAN),
        noisy_entropy: train.mean_entropy(|i| noisy_mask[i]),
        qk_symmetric,
    }
}

/// Trains `model` from its initial parameters on `train`, scoring `test`, as `config` says;
/// `engine` labels the summary (the token selector's). `on_step` is called after every forward
/// with the step index.
pub fn run_model(
    config: &SyntheticConfig,
    engine: Option<EngineKind>,
    trace: Trace,
    on_step: &mut dyn FnMut(usize),
    model: &mut dyn SyntheticModel,
    (train, test): (EvalSet, EvalSet),
) -> Result<SyntheticRun> {
    let started = Instant::now();
    let with_spectrum = matches!(trace, Trace::Full | Trace::FinalWithSpectrum);
    let logs_every_interval = matches!(trace, Trace::Full | Trace::Checkpoints);
    let symmetric_of = |model: &mut dyn SyntheticModel| -> Result<Option<SymmetricSpectrum>> {
        Ok(if with_spectrum {
            Some(model.key_query_traces()?.symmetric())
        } else {
            None
        })
    };
    let qk_symmetric_init = symmetric_of(model)?;
    let mut metrics = Vec::new();
    let mut attention_trace = Vec::new();
    let mut last = None;
    for step in 0..=config.num_steps {
        crate::interrupt::check()?;
        let train_fwd = model.train_forward(&train)?;
        if trace == Trace::Full {
            attention_trace.push(train_fwd.attention.iter().map(|&s| s as f32).collect());
        }
        let is_last = step == config.num_steps;
        let test_fwd = if is_last || (logs_every_interval && step % config.log_interval == 0) {
            let test_fwd = model.test_forward(&test)?;
            let qk_symmetric = if is_last || model.spectrum_at_every_log() {
                symmetric_of(model)?
            } else {
                None
            };
            metrics.push(step_metrics(
                step,
                &train_fwd,
                &test_fwd,
                &train.labels,
                &train.noisy_mask,
                qk_symmetric,
            ));
            Some(test_fwd)
        } else {
            None
        };
        on_step(step);
        if is_last {
            last = Some((train_fwd, test_fwd.expect("the last step is evaluated")));
        } else {
            model.step(&train_fwd)?;
        }
    }
    let (train_fwd, test_fwd) = last.expect("the loop ends at the last step");
    let qk_spectrum = if with_spectrum {
        final_spectrum(config.embed_dim, model)?
    } else {
        None
    };
    let summary = summarise(
        config,
        engine,
        metrics.last().expect("the last step is logged"),
        (&train, &train_fwd),
        (qk_symmetric_init, qk_spectrum),
        started.elapsed().as_secs_f64(),
    );
    Ok(SyntheticRun {
        config: config.clone(),
        metrics,
        attention_trace,
        noisy_mask: train.noisy_mask.clone(),
        selected_train: train.selected(&train_fwd),
        selected_test: test.selected(&test_fwd),
        scoring_direction: model.scoring_direction()?,
        summary,
    })
}

/// The full eigenspectrum of the trained key-query matrix, where d is small enough to afford it.
fn final_spectrum(d: usize, model: &mut dyn SyntheticModel) -> Result<Option<Spectrum>> {
    if d > FULL_SPECTRUM_MAX_DIM {
        return Ok(None);
    }
    let key_query = model.key_query()?;
    Ok(Some(spectrum(&DMatrix::from_row_slice(d, d, &key_query))))
}

/// The run's summary from its last logged metrics and the final training forward.
fn summarise(
    config: &SyntheticConfig,
    engine: Option<EngineKind>,
    final_metrics: &StepMetrics,
    (train, train_fwd): (&EvalSet, &Forward),
    (qk_symmetric_init, qk_spectrum): (Option<SymmetricSpectrum>, Option<Spectrum>),
    wall_seconds: f64,
) -> RunSummary {
    let mut noisy_selected = SelectionCounts::default();
    for i in (0..train.labels.len()).filter(|&i| train.noisy_mask[i]) {
        noisy_selected.add(train_fwd.selected_token(i));
    }
    let probability = |probs: &[f64], position: usize| probs.get(position).copied();
    RunSummary {
        train_acc: final_metrics.train_acc,
        test_acc: final_metrics.test_acc,
        train_loss: final_metrics.train_loss,
        test_loss: final_metrics.test_loss,
        clean_train_acc: final_metrics.clean_train_acc,
        noisy_fitted: final_metrics.noisy_fitted,
        noisy_total: final_metrics.noisy_total,
        clean_x1_prob: probability(&final_metrics.clean_token_probs, 0).unwrap_or(f64::NAN),
        noisy_x3_prob: probability(&final_metrics.noisy_token_probs, 2),
        noisy_selected,
        clean_entropy: final_metrics.clean_entropy,
        noisy_entropy: final_metrics.noisy_entropy,
        qk_symmetric_init,
        qk_symmetric: final_metrics.qk_symmetric,
        qk_spectrum,
        snr: config.snr(),
        regime: Regime::classify(
            final_metrics.noisy_total,
            final_metrics.train_acc,
            final_metrics.test_acc,
        ),
        engine,
        test_set: if config.paper_test_seed {
            "paper (shared seed)"
        } else {
            "independent"
        },
        wall_seconds,
    }
}
