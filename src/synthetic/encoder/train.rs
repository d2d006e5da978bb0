//! A run of the one-layer encoder: the model the shared loop trains (`trajectory::run_model`), on
//! the same data as the token selector, with the same records.

use anyhow::{Context, Result};

use super::params::EncoderParams;
use super::pass::logistic_loss_grads;
use super::pass::{ClsQuery, NormedTokens, Pass, Update, backward, forward, forward_with};
use crate::diagnostics::Traces;
use crate::synthetic::config::SyntheticConfig;
use crate::synthetic::data::train_and_test;
use crate::synthetic::engine::EngineKind;
use crate::synthetic::model::Forward;
use crate::synthetic::trajectory::{EvalSet, SyntheticModel, SyntheticRun, Trace, run_model};

/// Test samples put through the encoder at once: bounds the normalised tokens held.
const EVAL_CHUNK: usize = 256;

/// One run of the encoder `config.encoder` describes. `on_step` is called after every forward.
pub fn run(
    config: &SyntheticConfig,
    trace: Trace,
    on_step: &mut dyn FnMut(usize),
) -> Result<SyntheticRun> {
    let settings = config
        .encoder
        .as_ref()
        .context("an encoder run needs the config's encoder settings")?;
    // The engine is the token selector's; the encoder's estimate ignores it.
    config.validate_run(EngineKind::Subspace, trace == Trace::Full)?;
    let (train, test) = train_and_test(config);
    let (n, t, d) = (train.num_samples, train.seq_len, train.embed_dim);
    let mut model = Encoder {
        params: EncoderParams::init(d, settings.mlp_dim, settings.init_seed),
        train_tokens: NormedTokens::of(&train.tokens, n, t, d),
        labels: train.labels.clone(),
        learning_rate: config.learning_rate as f32,
        last_pass: None,
    };
    let sets = (
        EvalSet::new(train, config.signal_norm)?,
        EvalSet::new(test, config.signal_norm)?,
    );
    run_model(config, None, trace, on_step, &mut model, sets)
}

/// The encoder's parameters and what its steps reuse.
struct Encoder {
    params: EncoderParams,
    /// The training tokens normalised once: LN₁ reads them only through γ₁ and β₁.
    train_tokens: NormedTokens,
    /// The observed (noisy) training labels, ±1.
    labels: Vec<f64>,
    learning_rate: f32,
    /// The last training forward, which the next step differentiates.
    last_pass: Option<Pass>,
}

impl SyntheticModel for Encoder {
    fn train_forward(&mut self, train: &EvalSet) -> Result<Forward> {
        let pass = forward(&self.params, &self.train_tokens);
        let outputs =
            Forward::of_encoder(&pass.attention, &pass.logits, &train.labels, train.seq_len);
        self.last_pass = Some(pass);
        Ok(outputs)
    }

    fn test_forward(&mut self, test: &EvalSet) -> Result<Forward> {
        let (attention, logits) = evaluate(&self.params, test)?;
        Ok(Forward::of_encoder(
            &attention,
            &logits,
            &test.labels,
            test.seq_len,
        ))
    }

    fn step(&mut self, _train: &Forward) -> Result<()> {
        let pass = self
            .last_pass
            .take()
            .context("an encoder step needs the training forward at its parameters")?;
        let d_logits = logistic_loss_grads(&pass.logits, &self.labels);
        backward(
            &mut self.params,
            &pass,
            &self.train_tokens,
            &d_logits,
            Update::Descend(self.learning_rate),
        );
        Ok(())
    }

    /// d^-½ γ₁ ⊙ u: a data token's score is x̂ · this + d^-½ β₁ · u, with x̂ the token normalised
    /// (LN₁ without scale and shift).
    fn scoring_direction(&mut self) -> Result<Vec<f64>> {
        let query = ClsQuery::of(&self.params);
        let scale = 1.0 / (self.params.dim as f64).sqrt();
        Ok(query
            .direction()
            .iter()
            .zip(&self.params.attn_norm.weight)
            .map(|(&u, &g)| scale * f64::from(g) * f64::from(u))
            .collect())
    }

    fn key_query_traces(&mut self) -> Result<Traces> {
        Ok(super::spectrum::traces(&self.params))
    }

    fn key_query(&mut self) -> Result<Vec<f64>> {
        Ok(super::spectrum::key_query(&self.params))
    }

    fn spectrum_at_every_log(&self) -> bool {
        false
    }
}

/// The CLS attention rows and logits of every test sample, in chunks of [`EVAL_CHUNK`].
fn evaluate(params: &EncoderParams, test: &EvalSet) -> Result<(Vec<f32>, Vec<f32>)> {
    let query = ClsQuery::of(params);
    let (t, d) = (test.seq_len, params.dim);
    let (mut attention, mut logits) = (Vec::new(), Vec::new());
    crate::kernels::with_host_f32(&test.tokens, |tokens| {
        for chunk in tokens.chunks(EVAL_CHUNK * t * d) {
            let samples = chunk.len() / (t * d);
            let normed = NormedTokens::of(chunk, samples, t, d);
            let pass = forward_with(params, query.clone(), &normed);
            attention.extend_from_slice(&pass.attention);
            logits.extend_from_slice(&pass.logits);
        }
    })?;
    Ok((attention, logits))
}
