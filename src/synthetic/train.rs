//! One synthetic run (docs/protocol.md §2.3) of the model its config names: the token selector,
//! its data generated, W ~ U(±1/√d) and p = 0, trained by the chosen engine; or the one-layer
//! encoder (`super::encoder`). The loop and what it records are `super::trajectory`'s.

use anyhow::{Result, bail};
use candle_core::DType;

use super::config::SyntheticConfig;
use super::data::{TokenSet, initial_key_query, train_and_test};
use super::dense::DenseEngine;
use super::encoder;
use super::engine::{Engine, EngineKind};
use super::model::Forward;
use super::subspace::SubspaceEngine;
use super::trajectory::{EvalSet, SyntheticModel, SyntheticRun, Trace, run_model};
use crate::diagnostics::Traces;

/// Runs one experiment: the encoder when the config names it, else the token selector trained by
/// `engine_kind`. `on_step` is called after every forward with the step index.
pub fn run(
    config: &SyntheticConfig,
    engine_kind: EngineKind,
    trace: Trace,
    on_step: &mut dyn FnMut(usize),
) -> Result<SyntheticRun> {
    if config.encoder.is_some() {
        return encoder::train::run(config, trace, on_step);
    }
    if config.locater > 0.0 && engine_kind != EngineKind::Dense {
        bail!(
            "--locater needs --engine dense: the penalty's gradient (2λ/d)(S − mI) leaves the \
             low-rank subspace the subspace engine trains in"
        );
    }
    run_with_engine(config, engine_kind, trace, on_step, |train, w0| {
        let engine: Box<dyn Engine> = match engine_kind {
            EngineKind::Subspace => Box::new(SubspaceEngine::new(
                train,
                config.signal_norm,
                w0,
                config.learning_rate,
            )?),
            // f32 as the authors' torch model.
            EngineKind::Dense => Box::new(
                DenseEngine::new(
                    train,
                    config.signal_norm,
                    w0,
                    config.learning_rate,
                    DType::F32,
                )?
                .with_locater(config.locater),
            ),
        };
        Ok(engine)
    })
}

/// [`run`]'s token selector with an engine built by `make_engine` from the training set and W₀
/// (d×d row-major); `engine_kind` only labels the summary.
pub fn run_with_engine(
    config: &SyntheticConfig,
    engine_kind: EngineKind,
    trace: Trace,
    on_step: &mut dyn FnMut(usize),
    make_engine: impl FnOnce(&TokenSet, &[f32]) -> Result<Box<dyn Engine>>,
) -> Result<SyntheticRun> {
    config.validate_run(engine_kind, trace == Trace::Full)?;
    let (train, test) = train_and_test(config);
    let w0 = initial_key_query(config.embed_dim, config.seed);
    let engine = make_engine(&train, &w0)?;
    drop(w0);
    let sets = (
        EvalSet::new(train, config.signal_norm)?,
        EvalSet::new(test, config.signal_norm)?,
    );
    let mut selector = TokenSelector { engine };
    run_model(
        config,
        Some(engine_kind),
        trace,
        on_step,
        &mut selector,
        sets,
    )
}

/// The token selector trained by `engine_kind` on sets made elsewhere (real tokens as the noise,
/// `reproduce reference-map` and `twins`): `config` gives the step, the length, the seed of W₀ and
/// ‖μ‖ (the head ν's scale), and must agree with the sets' shapes.
pub fn run_on_sets(
    config: &SyntheticConfig,
    engine_kind: EngineKind,
    trace: Trace,
    (train, test): (TokenSet, TokenSet),
) -> Result<SyntheticRun> {
    config.validate_run(engine_kind, trace == Trace::Full)?;
    let shape = |set: &TokenSet| (set.num_samples, set.seq_len, set.embed_dim);
    if shape(&train) != (config.train_n, config.seq_len, config.embed_dim)
        || shape(&test) != (config.test_n, config.seq_len, config.embed_dim)
    {
        bail!(
            "the sets' shapes {:?} / {:?} are not the config's (n {}, test {}, T {}, d {})",
            shape(&train),
            shape(&test),
            config.train_n,
            config.test_n,
            config.seq_len,
            config.embed_dim
        );
    }
    let w0 = initial_key_query(config.embed_dim, config.seed);
    let engine: Box<dyn Engine> = match engine_kind {
        EngineKind::Subspace => Box::new(SubspaceEngine::new(
            &train,
            config.signal_norm,
            &w0,
            config.learning_rate,
        )?),
        // f64, as the subspace engine computes: the two give one trajectory up to rounding.
        EngineKind::Dense => Box::new(DenseEngine::new(
            &train,
            config.signal_norm,
            &w0,
            config.learning_rate,
            DType::F64,
        )?),
    };
    drop(w0);
    let sets = (
        EvalSet::new(train, config.signal_norm)?,
        EvalSet::new(test, config.signal_norm)?,
    );
    let mut selector = TokenSelector { engine };
    run_model(
        config,
        Some(engine_kind),
        trace,
        &mut |_| {},
        &mut selector,
        sets,
    )
}

/// The token selector f(X) = νᵀ Xᵀ softmax(X W p) through one of its engines.
struct TokenSelector {
    engine: Box<dyn Engine>,
}

impl SyntheticModel for TokenSelector {
    fn train_forward(&mut self, train: &EvalSet) -> Result<Forward> {
        Ok(Forward::new(
            &self.engine.train_logits()?,
            &train.head_values,
            &train.labels,
            train.seq_len,
        ))
    }

    fn test_forward(&mut self, test: &EvalSet) -> Result<Forward> {
        test.forward(&self.engine.scoring_direction()?)
    }

    fn step(&mut self, train: &Forward) -> Result<()> {
        self.engine.step(train)
    }

    fn scoring_direction(&mut self) -> Result<Vec<f64>> {
        self.engine.scoring_direction()
    }

    fn key_query_traces(&mut self) -> Result<Traces> {
        self.engine.key_query_traces()
    }

    fn key_query(&mut self) -> Result<Vec<f64>> {
        self.engine.key_query()
    }
}
