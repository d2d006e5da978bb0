//! The host pass as phase 2 and the tests call it: a stack of runs stepped or evaluated at once
//! ([`LastLayer::host_step_stack`], [`LastLayer::evaluate_stack`]), and a lone run as a stack of
//! one ([`LastLayer::host_step`], the `evaluate_*` methods). The runs of a stack share one
//! frozen layer ([`LastLayer::with_classifier`]); their parameters come stacked, each tensor with
//! a leading run axis, and are read in place.

use std::sync::{Arc, PoisonError};

use anyhow::{Result, bail, ensure};
use candle_core::Tensor;

use super::host::HostSpread;
use super::host::{ClsRows, Evaluated, HostLayer, HostQk, RunGradients, RunPass, RunStep};
use super::layer::{LastLayer, Output, QueryKey, ResidentSet, detached};
use crate::encoder::layer_rows::LayerRows;
use crate::kernels::with_host_f32;
use crate::model::attend::KeyValues;

/// A set's layer inputs on the host as the host pass reads them, read and normed once
/// ([`LastLayer::host_rows`]).
pub struct HostRows {
    /// The CLS row of the layer inputs and that row normed, (N, D) each.
    cls_inputs: Vec<f32>,
    cls_normed: Vec<f32>,
    /// The normed tokens of every sample.
    tokens: KeyValues,
    dim: usize,
}

impl HostRows {
    pub fn len(&self) -> usize {
        self.cls_inputs.len() / self.dim.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.cls_inputs.is_empty()
    }
}

/// What a host pass reads rows of: a resident set (the fine-tune set) or held rows (the test
/// set, when it fits in memory).
#[derive(Clone, Copy)]
pub enum HostSource<'a> {
    Resident(&'a ResidentSet),
    Held(&'a HostRows),
}

impl<'a> HostSource<'a> {
    /// The CLS inputs and normed rows of samples `rows`, gathered (B×D each).
    fn cls_rows(&self, rows: &[usize]) -> Result<(Vec<f32>, Vec<f32>)> {
        let (inputs, normed, d) = match self {
            Self::Resident(set) => (
                &set.cls_inputs_host,
                &set.cls_normed_host,
                set.cls_inputs.dims()[1],
            ),
            Self::Held(set) => (&set.cls_inputs, &set.cls_normed, set.dim),
        };
        let held = inputs.len() / d.max(1);
        if let Some(&bad) = rows.iter().find(|&&i| i >= held) {
            bail!("host pass: sample {bad} of {held}");
        }
        let gather = |all: &[f32]| -> Vec<f32> {
            rows.iter()
                .flat_map(|&i| all[i * d..(i + 1) * d].iter().copied())
                .collect()
        };
        Ok((gather(inputs), gather(normed)))
    }

    fn tokens(self) -> &'a KeyValues {
        match self {
            Self::Resident(set) => &set.tokens,
            Self::Held(set) => &set.tokens,
        }
    }
}

/// One run of a stacked host step: its layer (the stack's frozen layer with the run's
/// classifier), the fine-tune rows of its batch and their (noisy) labels.
pub struct StackRun<'a> {
    pub layer: &'a LastLayer<'a>,
    pub source: HostSource<'a>,
    pub rows: &'a [usize],
    pub targets: &'a [u32],
}

/// One run of a stacked evaluation.
pub struct StackEval<'a> {
    pub layer: &'a LastLayer<'a>,
    pub source: HostSource<'a>,
    pub rows: &'a [usize],
}

/// What a stacked host step gives.
pub struct StackStep {
    /// Each run's mean cross-entropy over its batch.
    pub losses: Vec<f64>,
    /// The gradient of each of [`QueryKey::named`], of the stacked parameters' shapes.
    pub gradients: Vec<Tensor>,
    /// Each run's rows evaluated at the look-ahead's parameters, when the step was given some.
    pub evaluated: Vec<Option<Output>>,
}

/// What [`LastLayer::host_step`] gives: the batch's mean loss, its gradient for each of
/// [`QueryKey::named`] in that order, and the rows evaluated at the look-ahead's parameters
/// when it was given some.
pub struct HostStep {
    pub loss: f64,
    pub gradients: Vec<Tensor>,
    pub evaluated: Option<Output>,
}

/// `f` with each of `runs` runs' query and key read in place from `params` ([`QueryKey::named`]'s
/// order; run r's values the r-th equal part of each tensor, so with a leading run axis or, for
/// one run, without).
fn on_host<R>(params: &[Tensor], runs: usize, f: impl FnOnce(&[HostQk]) -> R) -> Result<R> {
    let [wq, bq, wk, bk] = params else {
        bail!(
            "the query and key take 4 tensors (weights and biases), got {}",
            params.len()
        );
    };
    Ok(with_host_f32(wq, |wq| {
        with_host_f32(bq, |bq| {
            with_host_f32(wk, |wk| {
                with_host_f32(bk, |bk| {
                    let of = |all: &[f32], r: usize| {
                        let len = all.len() / runs.max(1);
                        (r * len, (r + 1) * len)
                    };
                    let qks: Vec<HostQk> = (0..runs)
                        .map(|r| {
                            let (a, b) = of(wq, r);
                            let (c, e) = of(bq, r);
                            let (g, h) = of(wk, r);
                            let (i, j) = of(bk, r);
                            HostQk {
                                wq: &wq[a..b],
                                bq: &bq[c..e],
                                wk: &wk[g..h],
                                bk: &bk[i..j],
                            }
                        })
                        .collect();
                    f(&qks)
                })
            })
        })
    })????)
}

impl<'a> LastLayer<'a> {
    /// Whether [`Self::host_step`] and the evaluations run the host pass (the CPU, GELU).
    pub fn has_host_pass(&self) -> bool {
        self.host.is_some()
    }

    /// How the host pass shares rows out over the threads, when the layer has one (chosen from
    /// the size of its frozen weights).
    pub fn host_spread(&self) -> Option<HostSpread> {
        self.host.as_ref().map(|host| host.spread)
    }

    /// Sets the host pass's spread (the tests run both; the numbers do not depend on it). The
    /// layer's host pass is made anew, so layers made from it before keep theirs.
    pub fn set_host_spread(&mut self, spread: HostSpread) -> Result<()> {
        if self.host.is_some()
            && let Some(mut host) = HostLayer::new(self)?
        {
            host.spread = spread;
            self.host = Some(Arc::new(host));
        }
        Ok(())
    }

    /// The stack's frozen host layer, checked to be every run's.
    fn stack_host<'s>(
        layers: impl Iterator<Item = &'s LastLayer<'s>>,
    ) -> Result<Option<&'s HostLayer>>
    where
        'a: 's,
    {
        let mut shared: Option<&HostLayer> = None;
        for layer in layers {
            let Some(host) = layer.host.as_deref() else {
                return Ok(None);
            };
            match shared {
                None => shared = Some(host),
                Some(first) => ensure!(
                    first.shares_weights_with(host),
                    "the runs of a stack must share one frozen layer (LastLayer::with_classifier)"
                ),
            }
        }
        Ok(shared)
    }

    /// Each run's mean cross-entropy of its rows against its targets, and its gradient for its
    /// query and key, from the host pass; `None` when the layers have none (then autograd
    /// through [`Self::forward_resident`] is the route). `params` are the runs' query and key
    /// ([`QueryKey::named`]'s order, each with a leading run axis, or without for one run).
    /// With `look_ahead` (the same form), each run's rows are also evaluated at those
    /// parameters: what [`Self::evaluate_stack`] gives them, bit for bit, each sample's tokens
    /// read once for both. A run's numbers are those it gets alone, bit for bit.
    pub fn host_step_stack(
        params: &[Tensor],
        look_ahead: Option<&[Tensor]>,
        runs: &[StackRun],
    ) -> Result<Option<StackStep>> {
        let Some(host) = Self::stack_host(runs.iter().map(|r| r.layer))? else {
            return Ok(None);
        };
        let s = runs.len();
        let cls = runs
            .iter()
            .map(|r| r.source.cls_rows(r.rows))
            .collect::<Result<Vec<_>>>()?;
        let mut buffers: Vec<Vec<f32>> =
            params.iter().map(|p| vec![0f32; p.elem_count()]).collect();
        let targets: Vec<&[u32]> = runs.iter().map(|r| r.targets).collect();
        let steps = on_host(params, s, |qks| -> Result<Vec<RunStep>> {
            let mut step = |ahead: Option<&[HostQk]>| {
                let passes = passes(
                    runs.iter().map(|r| (r.layer, r.source, r.rows)),
                    &cls,
                    qks,
                    ahead,
                )?;
                host.step(&passes, &targets, split_gradients(&mut buffers, s)?)
            };
            match look_ahead {
                None => step(None),
                Some(ahead) => on_host(ahead, s, |ahead| step(Some(ahead)))?,
            }
        })??;
        let device = runs[0].layer.value_device().clone();
        let gradients = buffers
            .into_iter()
            .zip(params)
            .map(|(values, p)| Ok(Tensor::from_vec(values, p.shape(), &device)?))
            .collect::<Result<Vec<_>>>()?;
        let mut losses = Vec::with_capacity(s);
        let mut evaluated = Vec::with_capacity(s);
        for (run, step) in runs.iter().zip(steps) {
            losses.push(f64::from(step.loss));
            evaluated.push(match step.evaluated {
                Some(e) => Some(run.layer.output(e, run.rows.len(), run.source.tokens())?),
                None => None,
            });
        }
        Ok(Some(StackStep {
            losses,
            gradients,
            evaluated,
        }))
    }

    /// Each run's logits and CLS attention of its rows, detached, from the host pass; `None`
    /// when the layers have none. `params` as for [`Self::host_step_stack`].
    pub fn evaluate_stack(params: &[Tensor], runs: &[StackEval]) -> Result<Option<Vec<Output>>> {
        let Some(host) = Self::stack_host(runs.iter().map(|r| r.layer))? else {
            return Ok(None);
        };
        let cls = runs
            .iter()
            .map(|r| r.source.cls_rows(r.rows))
            .collect::<Result<Vec<_>>>()?;
        let evaluated = on_host(params, runs.len(), |qks| -> Result<Vec<Evaluated>> {
            let passes = passes(
                runs.iter().map(|r| (r.layer, r.source, r.rows)),
                &cls,
                qks,
                None,
            )?;
            Ok(host.forward(&passes))
        })??;
        runs.iter()
            .zip(evaluated)
            .map(|(run, e)| run.layer.output(e, run.rows.len(), run.source.tokens()))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// [`Self::evaluate_stack`] on samples `which` of cached layer inputs that every run reads
    /// (the streamed test set): the samples are read and normed once for all the runs, straight
    /// into the host pass's form.
    pub fn evaluate_streamed_stack(
        params: &[Tensor],
        layers: &[&LastLayer],
        rows: &LayerRows,
        which: &[usize],
    ) -> Result<Option<Vec<Output>>> {
        let Some(first) = layers.first() else {
            return Ok(Some(Vec::new()));
        };
        let Some(host) = first.host.as_deref() else {
            return Ok(None);
        };
        let buffer = std::mem::take(
            &mut *first
                .streamed_buffer
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let set = first.host_rows_of(host, rows, which, buffer)?;
        let all: Vec<usize> = (0..which.len()).collect();
        let runs: Vec<StackEval> = layers
            .iter()
            .map(|layer| StackEval {
                layer,
                source: HostSource::Held(&set),
                rows: &all,
            })
            .collect();
        let out = Self::evaluate_stack(params, &runs);
        drop(runs);
        *first
            .streamed_buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = set.tokens.into_host_values();
        out
    }

    /// [`Self::forward_resident`] for evaluation: the same logits and attention, detached, from
    /// the host pass when the layer has one.
    pub fn evaluate_resident(
        &self,
        qk: &QueryKey,
        set: &ResidentSet,
        rows: &[usize],
    ) -> Result<Output> {
        self.evaluate_one(qk, HostSource::Resident(set), rows)?
            .map_or_else(|| detached(self.forward_resident(qk, set, rows)?), Ok)
    }

    /// [`Self::forward`] for evaluation, on samples `which` of cached layer inputs: detached, and
    /// read straight into the host pass when the layer has one (the streamed test set: no tensor,
    /// no copy of its tokens).
    pub fn evaluate_rows(
        &self,
        qk: &QueryKey,
        rows: &LayerRows,
        which: &[usize],
    ) -> Result<Output> {
        match Self::evaluate_streamed_stack(&qk.tensors(), &[self], rows, which)? {
            Some(mut out) => out.pop().ok_or_else(|| anyhow::anyhow!("no evaluation")),
            None => {
                let batch = rows.batch(which, self.value_device())?;
                detached(self.forward(qk, &batch.inputs, &batch.lengths)?)
            }
        }
    }

    /// Every sample of `rows` read and normed once for the host pass (the test set, when it fits
    /// in memory), or `None` when the layer has no host pass. Its evaluations
    /// ([`Self::evaluate_host_rows`]) give [`Self::evaluate_rows`]'s numbers bit for bit: the
    /// same reads and the same norm, row by row, and the host pass gives a row the same numbers
    /// whatever rows are beside it.
    pub fn host_rows(&self, rows: &LayerRows) -> Result<Option<HostRows>> {
        let Some(host) = self.host.as_deref().filter(|_| !rows.is_empty()) else {
            return Ok(None);
        };
        let all: Vec<usize> = (0..rows.len()).collect();
        Ok(Some(self.host_rows_of(host, rows, &all, Vec::new())?))
    }

    /// Samples `which` of `rows` in the form of the layer's host pass, written into `buffer`:
    /// each sample's CLS row kept, then its tokens normed, right after it is read.
    fn host_rows_of(
        &self,
        host: &HostLayer,
        rows: &LayerRows,
        which: &[usize],
        buffer: Vec<f32>,
    ) -> Result<HostRows> {
        let d = rows.dim();
        let (batch, cls_inputs) = rows.host_batch_then(which, buffer, |tokens| {
            let cls_input = tokens[..d].to_vec();
            host.normalise_sample(tokens);
            cls_input
        })?;
        let width = batch.width;
        let cls_normed = batch
            .values
            .chunks_exact(width * d)
            .flat_map(|sample| sample[..d].iter().copied())
            .collect();
        let tokens = KeyValues::from_host(
            batch.values,
            (which.len(), width, d),
            self.attention().num_heads,
            batch.lengths,
            self.scale(),
        )?;
        Ok(HostRows {
            cls_inputs: cls_inputs.concat(),
            cls_normed,
            tokens,
            dim: d,
        })
    }

    /// Logits and CLS attention of samples `which` of a [`HostRows`] set, detached.
    pub fn evaluate_host_rows(
        &self,
        qk: &QueryKey,
        set: &HostRows,
        which: &[usize],
    ) -> Result<Output> {
        match self.evaluate_one(qk, HostSource::Held(set), which)? {
            Some(out) => Ok(out),
            None => bail!("held rows are evaluated by the host pass, and this layer has none"),
        }
    }

    /// A stack of one through [`Self::evaluate_stack`].
    fn evaluate_one(
        &self,
        qk: &QueryKey,
        source: HostSource,
        rows: &[usize],
    ) -> Result<Option<Output>> {
        let run = StackEval {
            layer: self,
            source,
            rows,
        };
        Ok(Self::evaluate_stack(&qk.tensors(), &[run])?.and_then(|mut out| out.pop()))
    }

    /// The mean cross-entropy of resident samples `rows` against `targets`, and its gradient for
    /// each of [`QueryKey::named`] in that order, from the host pass; `None` when the layer has
    /// none (then autograd through [`Self::forward_resident`] is the route). With `look_ahead`,
    /// the step also evaluates its rows at those parameters: the logits and attention
    /// [`Self::evaluate_resident`] gives them, bit for bit, with each sample's tokens read once
    /// for both.
    pub fn host_step(
        &self,
        qk: &QueryKey,
        set: &ResidentSet,
        rows: &[usize],
        targets: &[u32],
        look_ahead: Option<&QueryKey>,
    ) -> Result<Option<HostStep>> {
        let run = StackRun {
            layer: self,
            source: HostSource::Resident(set),
            rows,
            targets,
        };
        let ahead = look_ahead.map(QueryKey::tensors);
        let Some(mut step) =
            Self::host_step_stack(&qk.tensors(), ahead.as_ref().map(|a| a.as_slice()), &[run])?
        else {
            return Ok(None);
        };
        Ok(Some(HostStep {
            loss: step.losses[0],
            gradients: step.gradients,
            evaluated: step.evaluated.pop().flatten(),
        }))
    }

    /// The host pass's logits (B×C) and attention (B×H×T) as an [`Output`].
    pub(super) fn output(
        &self,
        evaluated: Evaluated,
        rows: usize,
        tokens: &KeyValues,
    ) -> Result<Output> {
        let (h, _, t) = tokens.geometry();
        let device = self.value_device();
        let Evaluated { logits, probs } = evaluated;
        ensure!(
            logits.len().is_multiple_of(rows.max(1)),
            "host pass: logits do not split into {rows} rows"
        );
        let classes = logits.len() / rows.max(1);
        Ok(Output {
            logits: Tensor::from_vec(logits, (rows, classes), device)?,
            cls_attention: Tensor::from_vec(probs, (rows, h, t), device)?,
        })
    }
}

/// Each run's pass: its parameters (and the look-ahead's), its classifier, its gathered CLS rows
/// and its samples.
fn passes<'p>(
    runs: impl Iterator<Item = (&'p LastLayer<'p>, HostSource<'p>, &'p [usize])>,
    cls: &'p [(Vec<f32>, Vec<f32>)],
    qks: &[HostQk<'p>],
    look_ahead: Option<&[HostQk<'p>]>,
) -> Result<Vec<RunPass<'p>>> {
    runs.zip(cls)
        .enumerate()
        .map(|(r, ((layer, source, rows), (inputs, normed)))| {
            let Some(readout) = layer.host_readout.as_ref() else {
                bail!("a layer with a host pass lacks its classifier's host form");
            };
            Ok(RunPass {
                qk: qks[r],
                look_ahead: look_ahead.map(|a| a[r]),
                readout,
                cls: ClsRows { inputs, normed },
                tokens: source.tokens(),
                rows,
            })
        })
        .collect()
}

/// Each run's part of the zeroed gradient buffers ([`QueryKey::named`]'s order).
fn split_gradients(buffers: &mut [Vec<f32>], runs: usize) -> Result<Vec<RunGradients<'_>>> {
    let [wq, bq, wk, bk] = buffers else {
        bail!("four gradient buffers expected, one per parameter");
    };
    let len = |all: &Vec<f32>| (all.len() / runs.max(1)).max(1);
    let (lq, lbq, lk, lbk) = (len(wq), len(bq), len(wk), len(bk));
    Ok(wq
        .chunks_mut(lq)
        .zip(bq.chunks_mut(lbq))
        .zip(wk.chunks_mut(lk))
        .zip(bk.chunks_mut(lbk))
        .map(|(((wq, bq), wk), bk)| RunGradients { wq, bq, wk, bk })
        .collect())
}
