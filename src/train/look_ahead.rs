//! Phase 2's look-ahead evaluation (docs/design.md, phase 2's loop): epoch e's evaluation of the
//! fine-tune set done by epoch e + 1's steps, which read the same samples anyway.

use anyhow::{Result, ensure};
use candle_core::{Device, Tensor};

use super::optim::AdamW;

/// A step's loss and gradients (as [`Step`](super::loops::Step)) and its rows' logits and attention at earlier
/// parameters (as [`Forward`](super::loops::Forward) gives them).
pub type EvaluatingStep = (f64, Vec<Tensor>, (Tensor, Tensor));

/// [`Step`](super::loops::Step) on fine-tune rows that also evaluates them at the given parameters (in the
/// optimizer's order), as [`Forward`](super::loops::Forward) would.
pub type EvaluatingStepFn<'a> = dyn Fn(&[usize], &[Tensor]) -> Result<EvaluatingStep> + 'a;

/// Evaluating the fine-tune set after an epoch while the next epoch steps, instead of in a pass of
/// its own: every epoch's metrics read the whole set at that epoch's parameters, and every step
/// of the next epoch reads its samples anyway. The step is given the parameters the epoch ended
/// at and evaluates its rows at them too, reading each sample's tokens once for both, so the
/// set crosses memory once an epoch instead of twice (docs/performance.md). The metrics are the
/// same numbers; they come one epoch later.
pub struct LookAhead<'a> {
    pub step: &'a EvaluatingStepFn<'a>,
    /// Epochs whose end state is kept (a checkpoint is written there): evaluated at their end.
    pub kept: &'a dyn Fn(usize) -> bool,
}

/// An epoch whose fine-tune evaluation rides along the next epoch's steps.
pub(super) struct Pending {
    epoch: usize,
    batch_losses: Vec<f64>,
    /// The parameters the epoch ended at, in the optimizer's order.
    pub(super) params: Vec<Tensor>,
    /// (N, C) and (N, H·T) row-major, filled a batch at a time; the shape of a row of attention.
    logits: Vec<f32>,
    attention: Vec<f32>,
    attention_row: Vec<usize>,
    filled: usize,
}

impl Pending {
    pub(super) fn new(epoch: usize, batch_losses: Vec<f64>, optimizer: &AdamW) -> Result<Self> {
        Ok(Self {
            epoch,
            batch_losses,
            params: optimizer.snapshot()?,
            logits: Vec::new(),
            attention: Vec::new(),
            attention_row: Vec::new(),
            filled: 0,
        })
    }

    /// Rows `rows` of a set of `n`, evaluated: logits (B, C) and attention (B, …, T).
    pub(super) fn record(
        &mut self,
        n: usize,
        rows: &[usize],
        (logits, attention): &(Tensor, Tensor),
    ) -> Result<()> {
        let (b, classes) = logits.dims2()?;
        let attention_row = attention.dims()[1..].to_vec();
        let width: usize = attention_row.iter().product();
        ensure!(
            b == rows.len() && attention.dim(0)? == b,
            "look-ahead: {b} rows evaluated for {} asked",
            rows.len()
        );
        if self.filled == 0 {
            self.logits = vec![0.0; n * classes];
            self.attention = vec![0.0; n * width];
            self.attention_row = attention_row;
        } else {
            ensure!(
                attention_row == self.attention_row && self.logits.len() == n * classes,
                "look-ahead: batches of different shapes"
            );
        }
        let (logits, attention) = (
            logits.flatten_all()?.to_vec1::<f32>()?,
            attention.flatten_all()?.to_vec1::<f32>()?,
        );
        for (k, &row) in rows.iter().enumerate() {
            self.logits[row * classes..(row + 1) * classes]
                .copy_from_slice(&logits[k * classes..(k + 1) * classes]);
            self.attention[row * width..(row + 1) * width]
                .copy_from_slice(&attention[k * width..(k + 1) * width]);
        }
        self.filled += rows.len();
        Ok(())
    }

    /// The whole set's logits (N, C) and attention (N, …, T), once every row of the set of `n`
    /// has been evaluated, with the epoch and its batch losses.
    pub(super) fn finish(self, n: usize) -> Result<EvaluatedEpoch> {
        ensure!(
            self.filled == n,
            "look-ahead: {} of {n} rows evaluated",
            self.filled
        );
        let classes = self.logits.len() / n.max(1);
        let mut shape = vec![n];
        shape.extend_from_slice(&self.attention_row);
        Ok(EvaluatedEpoch {
            epoch: self.epoch,
            batch_losses: self.batch_losses,
            logits: Tensor::from_vec(self.logits, (n, classes), &Device::Cpu)?,
            attention: Tensor::from_vec(self.attention, shape, &Device::Cpu)?,
        })
    }
}

/// An epoch's fine-tune set evaluated by the look-ahead.
pub(super) struct EvaluatedEpoch {
    pub(super) epoch: usize,
    pub(super) batch_losses: Vec<f64>,
    pub(super) logits: Tensor,
    pub(super) attention: Tensor,
}
