//! What phase 2 trains, as the loop sees it: a stack of runs that step together
//! ([`Trainee`]), with what a step and an evaluation return. A lone run is a stack of one.

use anyhow::Result;
use candle_core::{D, Tensor};

use super::objective::Gradients;
use crate::diagnostics::Spectrum;
use crate::train::optim::AdamW;

/// A stack of runs whose parameters train together: the last layer's query and key
/// ([`super::query_key`]) or the token-selection head ([`super::head`]).
pub trait Trainee: Send {
    /// Runs in the stack.
    fn runs(&self) -> usize;

    /// Every run's loss on its batch (run r on rows `batches[r]` of its fine-tune set) and the
    /// gradient of the stack's objective ([`super::objective`]), at the current parameters.
    fn gradients(&mut self, batches: &[&[usize]]) -> Result<Gradients>;

    /// The stack's optimizer: each run's parameters, moments and step count.
    fn optimizer(&self) -> &AdamW;

    /// The same, to update, or to restore a resumed run's state into.
    fn optimizer_mut(&mut self) -> &mut AdamW;

    /// The evaluations complete once the epoch `end` names has ended, oldest first. A trainee may
    /// evaluate an epoch that is neither scored nor kept along the next epoch's steps instead of
    /// at its end (the host pass's look-ahead): its evaluation then comes with the next one's.
    fn evaluations(&mut self, end: &EpochEnd) -> Result<Vec<EpochEvaluation>>;

    /// Run `run`'s logits and attention on rows `rows` of its fine-tune set, now (the attention
    /// maps' samples).
    fn pictured(&self, run: usize, rows: &[usize]) -> Result<SetOutput>;
}

/// The end of an epoch, as the loop tells the trainee.
#[derive(Clone, Copy, Debug)]
pub struct EpochEnd {
    /// Epochs done (0: right after the reset, before any step).
    pub epoch: usize,
    /// The test set is scored at this epoch, with the query-key diagnostics.
    pub score_test: bool,
    /// This epoch's end state is kept (a checkpoint, or a stop): it is evaluated at its end.
    pub kept: bool,
}

/// Every run of the stack evaluated after one epoch, at the parameters that epoch ended at.
pub struct EpochEvaluation {
    pub epoch: usize,
    pub runs: Vec<RunEvaluation>,
}

/// One run's evaluation.
pub struct RunEvaluation {
    /// The whole fine-tune set.
    pub finetune: SetOutput,
    /// The test set's logits (N, C), when it was scored.
    pub test_logits: Option<Tensor>,
    /// The query-key eigenspectrum (docs/protocol.md §5), when the test set was scored.
    pub spectrum: Option<Spectrum>,
    /// The rank-collapse residual, when the test set was scored and the trainee measures one
    /// (last-layer mode).
    pub rank_collapse: Option<f64>,
}

impl RunEvaluation {
    /// A run's evaluation from its fine-tune set's chunks and, at a scored epoch, its test
    /// logits with the query-key diagnostics `diagnostics` measures then (the spectrum, and the
    /// rank-collapse residual where the trainee has one).
    pub fn of(
        chunks: Vec<SetOutput>,
        test_logits: Option<Tensor>,
        diagnostics: impl FnOnce() -> Result<(Spectrum, Option<f64>)>,
    ) -> Result<Self> {
        let (spectrum, rank_collapse) = match test_logits {
            Some(_) => {
                let (spectrum, rank_collapse) = diagnostics()?;
                (Some(spectrum), rank_collapse)
            }
            None => (None, None),
        };
        Ok(Self {
            finetune: SetOutput::join(chunks)?,
            test_logits,
            spectrum,
            rank_collapse,
        })
    }
}

/// Logits (N, C) and the selecting attention (N, …, T) of rows of a set.
pub struct SetOutput {
    pub logits: Tensor,
    pub attention: Tensor,
}

impl SetOutput {
    /// Chunks of one set joined. A text chunk is padded to its own longest sample, so its
    /// attention may be narrower than another's: each is widened to the widest with zero
    /// probabilities, what a padded key gets.
    pub fn join(chunks: Vec<SetOutput>) -> Result<Self> {
        let mut width = 0;
        for chunk in &chunks {
            width = width.max(chunk.attention.dim(D::Minus1)?);
        }
        let (mut logits, mut attention) = (Vec::new(), Vec::new());
        for chunk in chunks {
            let missing = width - chunk.attention.dim(D::Minus1)?;
            logits.push(chunk.logits.detach());
            attention.push(
                chunk
                    .attention
                    .detach()
                    .pad_with_zeros(D::Minus1, 0, missing)?,
            );
        }
        Ok(Self {
            logits: Tensor::cat(&logits, 0)?,
            attention: Tensor::cat(&attention, 0)?,
        })
    }
}

/// Samples an evaluation hands the model at once (the streamed test set holds one batch of tokens
/// in memory; the host pass splits it into parts across threads): two of the host pass's
/// evaluation parts of 24.
pub const EVAL_BATCH: usize = 48;

/// Rows `0..len` in chunks of [`EVAL_BATCH`].
pub fn eval_chunks(len: usize) -> Vec<Vec<usize>> {
    let rows: Vec<usize> = (0..len).collect();
    rows.chunks(EVAL_BATCH).map(<[usize]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::metrics::attention_stats;
    use candle_core::{DType, Device};

    /// Text chunks are padded to their own longest sample: a set of several chunks joins
    /// attention of different widths, the narrower ones widened with zeros.
    #[test]
    fn a_set_of_chunks_of_different_widths_joins() {
        let b = EVAL_BATCH;
        let n = 2 * b + 22;
        let chunks = eval_chunks(n)
            .into_iter()
            .map(|rows| {
                let width = 2 + (rows[0] / EVAL_BATCH) % 3;
                let logits = Tensor::zeros((rows.len(), 2), DType::F32, &Device::Cpu).unwrap();
                let attention =
                    Tensor::full(1.0 / width as f32, (rows.len(), 1, width), &Device::Cpu).unwrap();
                SetOutput { logits, attention }
            })
            .collect();
        let SetOutput { logits, attention } = SetOutput::join(chunks).unwrap();
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
}
