//! What a training engine provides to the driver: the logits of the training tokens, the scoring
//! direction u = W p that ranks any token, and one gradient-descent update of W and p.

use anyhow::Result;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::model::Forward;
use crate::diagnostics::Traces;

pub trait Engine {
    /// a_{i,t} = x_{i,t}^T W p for the training tokens, (n × T) row-major.
    fn train_logits(&self) -> Result<Vec<f64>>;
    /// u = W p (d), so that any token x scores x^T u.
    fn scoring_direction(&self) -> Result<Vec<f64>>;
    /// One full-batch GD update of W and p; `forward` is the model at the current parameters.
    fn step(&mut self, forward: &Forward) -> Result<()>;
    /// The key-query matrix W, (d × d) row-major: for its complex spectrum.
    fn key_query(&self) -> Result<Vec<f64>>;
    /// tr W, tr W² and ‖W‖_F²: the symmetric part's spectrum, cheap enough for every logged step.
    fn key_query_traces(&self) -> Result<Traces>;
}

/// Which computation trains W and p. Both are the same function and the same updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    /// Exact low-rank reformulation: O((nT)²) per step after an O(d²·nT) set-up.
    Subspace,
    /// Plain d×d parameters with candle autograd, as the authors' code: O(d²) per step.
    Dense,
}
