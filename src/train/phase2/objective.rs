//! The stack's objective and its gradients through autograd (docs/protocol.md §3): each run's
//! mean cross-entropy over its batch against its noisy labels, summed over the runs so that each
//! run's gradient is that of its own loss, plus LocAteR's penalty where λ > 0. The head steps
//! through it, and the last layer where it has no host pass; the host pass computes the same
//! gradients by hand (tests/last_layer_equivalence.rs holds the two equal).

use anyhow::{Context, Result};
use candle_core::{Device, Tensor, Var};

use super::parameters::QkShape;
use crate::diagnostics::locater::{head_symmetric_variance, symmetric_variance};
use crate::model::QueryKey;
use crate::train::optim::gradients_of;
use crate::train::run::Mode;

/// Each run's loss on its batch, and the gradient of the stack's objective with respect to
/// each stacked parameter (of the parameters' shapes): what the optimizer takes.
pub struct Gradients {
    /// (runs,) f64, where the step computed them: the loop reads an epoch's at its end, so that
    /// a step on a device reads nothing back ([`crate::kernels::host_reads`]).
    pub losses: Tensor,
    pub gradients: Vec<Tensor>,
}

/// The noisy labels of rows `rows`, as cross-entropy's targets.
pub fn targets(labels: &[u32], rows: &[usize], device: &Device) -> Result<Tensor> {
    let targets: Vec<u32> = rows.iter().map(|&i| labels[i]).collect();
    Ok(Tensor::from_vec(targets, rows.len(), device)?)
}

/// Each run's mean cross-entropy of `logits[k]` (B, C) against `targets[k]`, and the gradient
/// of their sum with respect to `params` (the logits differentiable in them).
pub fn cross_entropy(
    params: &[Tensor],
    logits: &[Tensor],
    targets: &[Tensor],
) -> Result<Gradients> {
    let mut terms = Vec::with_capacity(logits.len());
    for (logits, targets) in logits.iter().zip(targets) {
        terms.push(candle_nn::loss::cross_entropy(logits, targets)?);
    }
    let losses = Tensor::stack(&terms, 0)
        .context("a step of no runs")?
        .detach()
        .to_dtype(candle_core::DType::F64)?;
    Ok(Gradients {
        losses,
        gradients: gradients_of_sum(params, terms).context("a step of no runs")?,
    })
}

/// LocAteR's penalty λ·v_sym on the query-key matrix the spectrum reads (each run's term reaching
/// its own parameters only), its gradient added to the data loss's: they are the objective's.
pub fn add_locater_penalty(
    gradients: &mut Gradients,
    params: &[Tensor],
    shape: QkShape,
    lambda: f64,
) -> Result<()> {
    if lambda == 0.0 {
        return Ok(());
    }
    let runs = params.first().map_or(0, |p| p.dims()[0]);
    let terms = (0..runs)
        .map(|run| {
            let term = match shape.mode {
                Mode::LastLayer => {
                    let qk = QueryKey::of_run(params, run)?;
                    head_symmetric_variance(&qk.wq, &qk.wk, shape.heads, shape.scale())?
                }
                Mode::Head => symmetric_variance(&params[0].get(run)?)?,
            };
            Ok((term * lambda)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let penalty = gradients_of_sum(params, terms).context("a penalty of no runs")?;
    for (grad, extra) in gradients.gradients.iter_mut().zip(penalty) {
        *grad = (&*grad + extra)?;
    }
    Ok(())
}

/// The gradient of the sum of `terms` (in their order) with respect to each of `params`: zeros
/// where a parameter does not reach the sum.
fn gradients_of_sum(params: &[Tensor], terms: Vec<Tensor>) -> Result<Vec<Tensor>> {
    let mut terms = terms.into_iter();
    let first = terms.next().context("a sum of no terms")?;
    let total = terms.try_fold(first, |sum, term| sum + term)?;
    let store = total.backward()?;
    let vars: Vec<Var> = params
        .iter()
        .map(Var::from_tensor)
        .collect::<candle_core::Result<_>>()?;
    gradients_of(vars.iter(), &store)
}
