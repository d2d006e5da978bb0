//! The host pass's look-ahead: an epoch's evaluation of the fine-tune set done by the next
//! epoch's steps, which read the same samples anyway.
//!
//! Every step of epoch e + 1 is given the parameters epoch e ended at and evaluates its rows at
//! them too, reading each sample's tokens once for both, so the set crosses memory once an epoch
//! instead of twice. The metrics are the same numbers; they come one epoch later. An epoch whose
//! end is kept (a checkpoint, a stop) or whose test set is scored is evaluated at its end instead.

use anyhow::{Result, ensure};
use candle_core::{Device, Tensor};

use super::trainee::{EpochEvaluation, RunEvaluation, SetOutput};
use crate::model::last_layer::Output;

/// An epoch whose fine-tune evaluation rides along the next epoch's steps, for every run of the
/// stack.
pub struct Pending {
    pub epoch: usize,
    /// The parameters the epoch ended at: the stack's, in the optimizer's order.
    pub params: Vec<Tensor>,
    /// Each run's rows evaluated so far.
    runs: Vec<Filled>,
    /// Fine-tune samples of each run.
    n: usize,
}

/// One run's evaluation, filled a batch at a time: (N, C) and (N, H·T) row-major, and the shape
/// of a row of attention.
#[derive(Default)]
struct Filled {
    logits: Vec<f32>,
    attention: Vec<f32>,
    attention_row: Vec<usize>,
    filled: usize,
}

impl Pending {
    pub fn new(epoch: usize, params: Vec<Tensor>, runs: usize, n: usize) -> Self {
        Self {
            epoch,
            params,
            runs: (0..runs).map(|_| Filled::default()).collect(),
            n,
        }
    }

    /// Run `run`'s rows `rows` evaluated: logits (B, C) and attention (B, …, T).
    pub fn record(&mut self, run: usize, rows: &[usize], output: &Output) -> Result<()> {
        let n = self.n;
        let own = &mut self.runs[run];
        let (b, classes) = output.logits.dims2()?;
        let attention_row = output.cls_attention.dims()[1..].to_vec();
        let width: usize = attention_row.iter().product();
        ensure!(
            b == rows.len() && output.cls_attention.dim(0)? == b,
            "look-ahead: {b} rows evaluated for {} asked",
            rows.len()
        );
        if own.filled == 0 {
            own.logits = vec![0.0; n * classes];
            own.attention = vec![0.0; n * width];
            own.attention_row = attention_row;
        } else {
            ensure!(
                attention_row == own.attention_row && own.logits.len() == n * classes,
                "look-ahead: batches of different shapes"
            );
        }
        let logits = crate::kernels::host_reads::flat::<f32>(&output.logits)?;
        let attention = crate::kernels::host_reads::flat::<f32>(&output.cls_attention)?;
        for (k, &row) in rows.iter().enumerate() {
            own.logits[row * classes..(row + 1) * classes]
                .copy_from_slice(&logits[k * classes..(k + 1) * classes]);
            own.attention[row * width..(row + 1) * width]
                .copy_from_slice(&attention[k * width..(k + 1) * width]);
        }
        own.filled += rows.len();
        Ok(())
    }

    /// Every run's whole fine-tune set evaluated, once every row of every run has been.
    pub fn finish(self) -> Result<EpochEvaluation> {
        let n = self.n;
        let runs = self
            .runs
            .into_iter()
            .map(|own| {
                ensure!(
                    own.filled == n,
                    "look-ahead: {} of {n} rows evaluated",
                    own.filled
                );
                let classes = own.logits.len() / n.max(1);
                let mut shape = vec![n];
                shape.extend_from_slice(&own.attention_row);
                Ok(RunEvaluation {
                    finetune: SetOutput {
                        logits: Tensor::from_vec(own.logits, (n, classes), &Device::Cpu)?,
                        attention: Tensor::from_vec(own.attention, shape, &Device::Cpu)?,
                    },
                    test_logits: None,
                    spectrum: None,
                    rank_collapse: None,
                })
            })
            .collect::<Result<_>>()?;
        Ok(EpochEvaluation {
            epoch: self.epoch,
            runs,
        })
    }
}
