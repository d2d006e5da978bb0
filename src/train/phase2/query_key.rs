//! The paper's phase 2 (docs/protocol.md §3) as a [`Trainee`]: each run's last-layer query and
//! key, reset, trained through the frozen rest of the layer and the run's phase-1 classifier.
//!
//! On the CPU a step is the host pass over the whole stack ([`LastLayer::host_step_stack`]): each
//! frozen weight and each shared token read once for every run, and with the look-ahead
//! ([`super::look_ahead`]) the last epoch's evaluation riding along. On the resident route (a
//! GPU, or asked for on the CPU) every run's fine-tune tokens are one tensor on the device and a
//! step is one batched forward of the whole stack ([`LastLayer::forward_stack`]) through candle's
//! autograd, with nothing read back.

use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::Tensor;

use super::look_ahead::Pending;
use super::objective::{self, Gradients};
use super::parameters::{QkShape, qk_spectrum, stacked_optimizer};
use super::runs::{Route, RunData, StackShared, copies};
use super::trainee::{EpochEnd, EpochEvaluation, RunEvaluation, SetOutput, Trainee, eval_chunks};
use crate::diagnostics::Spectrum;
use crate::encoder::layer_rows::LayerRows;
use crate::model::last_layer::{HostRows, HostSource, ResidentSet, StackEval, StackRun};
use crate::model::{LastLayer, QueryKey};
use crate::train::optim::AdamW;
use crate::train::setup::text_mask;

/// Test samples whose full last layer is run at scored epochs for the rank-collapse residual.
const RANK_PROBE: usize = 16;

/// Test-set tokens held in memory, read and normed once, up to this size; past it the set
/// streams, and memory stays bounded whatever `--test-n` is (ViT-Ti over MNIST's 10 000 test
/// images takes 1.5 GB and streams; the partial CIFAR-10's 1017 test images at ViT-Ti, 154 MB,
/// BreastMNIST's and TREC's are held). A scored epoch that streams re-reads and re-norms the set.
pub const RESIDENT_TEST_BYTES: usize = 256 << 20;

/// A test set as the evaluations read it. Both give the same numbers, bit for bit
/// (tests/last_layer_equivalence.rs).
enum TestRows<'a> {
    /// Read from the feature cache and normed a chunk at a time, so that no set-sized buffer
    /// exists whatever the set's size.
    Streamed(&'a LayerRows),
    /// Read and normed once, into the host pass's form ([`LastLayer::host_rows`]).
    Held(HostRows),
}

impl<'a> TestRows<'a> {
    /// Held in memory when the layer has a host pass and the tokens fit `budget` bytes,
    /// streamed otherwise.
    fn held_if_within(layer: &LastLayer, rows: &'a LayerRows, budget: usize) -> Result<Self> {
        let width = rows.lengths().iter().copied().max().unwrap_or(0);
        let bytes = rows.len() * width * rows.dim() * size_of::<f32>();
        if bytes <= budget
            && let Some(held) = layer.host_rows(rows)?
        {
            return Ok(Self::Held(held));
        }
        Ok(Self::Streamed(rows))
    }

    fn len(&self) -> usize {
        match self {
            Self::Streamed(rows) => rows.len(),
            Self::Held(rows) => rows.len(),
        }
    }
}

/// The first test samples of a test set, whose full last layer the rank-collapse residual reads.
struct Probe {
    inputs: Tensor,
    mask: Option<Tensor>,
}

/// A stack of last-layer runs.
pub struct LastLayerTrainee<'a> {
    /// Each run's layer: one frozen layer, each run's classifier.
    layers: Vec<LastLayer<'a>>,
    /// The distinct fine-tune sets, normed once, and the one each run reads, from its row
    /// `run_offset[k]` on (the resident route holds every set as one, one after another).
    finetune: Vec<ResidentSet>,
    run_finetune: Vec<usize>,
    run_offset: Vec<usize>,
    /// Fine-tune samples of each run.
    n: usize,
    /// The distinct test sets (with their rank-collapse probes), and the one each run reads.
    test: Vec<(TestRows<'a>, Probe)>,
    run_test: Vec<usize>,
    /// Each run's noisy fine-tune labels.
    labels: Vec<&'a [u32]>,
    optimizer: AdamW,
    shape: QkShape,
    locater: f64,
    /// The epoch whose evaluation the current epoch's steps carry (host pass only).
    pending: Option<Pending>,
    pool: Arc<rayon::ThreadPool>,
}

impl<'a> LastLayerTrainee<'a> {
    /// The stack of `runs`, each with its query and key reset from its own stream, stepping on
    /// `pool` (the host pass's threads).
    pub fn new(
        shared: &StackShared<'a>,
        runs: &[&'a RunData<'a>],
        pool: Arc<rayon::ThreadPool>,
    ) -> Result<Self> {
        let first = runs.first().context("a stack of no runs")?;
        let mut layer = LastLayer::new(shared.model, first.classifier)?;
        let resident = shared.route == Route::Resident || !layer.has_host_pass();
        if resident {
            layer = layer.without_host_pass();
        }
        let mut layers = Vec::with_capacity(runs.len());
        for run in &runs[1..] {
            layers.push(layer.with_classifier(run.classifier)?);
        }
        layers.insert(0, layer);
        let first_copies = copies(&runs.iter().map(|r| r.finetune_samples).collect::<Vec<_>>());
        // The n ≤ 1000 fine-tune samples of each distinct set are read into memory once.
        let mut distinct = Vec::new();
        for (k, run) in runs.iter().enumerate() {
            if first_copies[k] == k {
                distinct.push(run.finetune.resident()?);
            }
        }
        let copy_of = index_of_copies(&first_copies);
        let (finetune, run_finetune, run_offset) = if resident {
            let sets: Vec<&LayerRows> = distinct.iter().collect();
            let (set, offsets) = layers[0].resident_stack(&sets, shared.device)?;
            let run_offset = copy_of.iter().map(|&c| offsets[c]).collect();
            (vec![set], vec![0; runs.len()], run_offset)
        } else {
            let sets = distinct
                .iter()
                .map(|rows| layers[0].resident(rows, shared.device))
                .collect::<Result<Vec<_>>>()?;
            (sets, copy_of, vec![0; runs.len()])
        };
        let run_test = copies(&runs.iter().map(|r| r.test_samples).collect::<Vec<_>>());
        let mut test = Vec::new();
        for (k, run) in runs.iter().enumerate() {
            if run_test[k] == k {
                test.push((
                    TestRows::held_if_within(&layers[0], run.test, RESIDENT_TEST_BYTES)?,
                    probe(shared, run.test)?,
                ));
            }
        }
        let run_test = index_of_copies(&run_test);
        let resets = runs
            .iter()
            .map(|run| run.with_init_rng(|rng| QueryKey::reset(shared.hidden, rng, shared.device)))
            .collect::<Result<Vec<_>>>()?;
        let named = resets
            .iter()
            .map(QueryKey::named)
            .collect::<Result<Vec<_>>>()?;
        let config = first.config;
        let optimizer = stacked_optimizer(config, &named, shared.route)?;
        Ok(Self {
            shape: QkShape::of(shared.model, config.mode, shared.hidden),
            locater: config.locater,
            labels: runs.iter().map(|r| r.labels.labels).collect(),
            layers,
            finetune,
            run_finetune,
            run_offset,
            n: first.finetune.len(),
            test,
            run_test,
            optimizer,
            pending: None,
            pool,
        })
    }

    /// Whether the host pass steps (else autograd).
    pub fn has_host_pass(&self) -> bool {
        self.layers[0].has_host_pass()
    }

    /// The stack's parameters as they are now, in [`QueryKey::named`]'s order.
    fn params(&self) -> Vec<Tensor> {
        self.optimizer.tensors()
    }

    /// The host pass's step of every run, the look-ahead's rows recorded.
    fn host_step(&mut self, batches: &[&[usize]]) -> Result<Gradients> {
        let targets: Vec<Vec<u32>> = batches
            .iter()
            .zip(&self.labels)
            .map(|(rows, labels)| rows.iter().map(|&i| labels[i]).collect())
            .collect();
        let runs: Vec<StackRun> = (0..batches.len())
            .map(|k| StackRun {
                layer: &self.layers[k],
                source: HostSource::Resident(&self.finetune[self.run_finetune[k]]),
                rows: batches[k],
                targets: &targets[k],
            })
            .collect();
        let ahead = self.pending.as_ref().map(|p| p.params.as_slice());
        let step = LastLayer::host_step_stack(&self.params(), ahead, &runs)?
            .context("the host pass stepped a layer without one")?;
        if let Some(pending) = &mut self.pending {
            for (k, evaluated) in step.evaluated.iter().enumerate() {
                let evaluated = evaluated
                    .as_ref()
                    .context("the look-ahead's rows unevaluated")?;
                pending.record(k, batches[k], evaluated)?;
            }
        }
        let runs = step.losses.len();
        Ok(Gradients {
            losses: Tensor::from_vec(step.losses, runs, &candle_core::Device::Cpu)?,
            gradients: step.gradients,
        })
    }

    /// Every run's step on the resident route: one batched forward of the stack
    /// ([`LastLayer::forward_stack`]) and the gradients through autograd
    /// ([`objective::cross_entropy`]); nothing is read back.
    fn resident_step(&self, batches: &[&[usize]]) -> Result<Gradients> {
        let params = self.params();
        let rows: Vec<Vec<usize>> = (0..batches.len())
            .map(|k| self.set_rows(k, batches[k]))
            .collect();
        let rows: Vec<&[usize]> = rows.iter().map(Vec::as_slice).collect();
        let layers: Vec<&LastLayer> = self.layers.iter().collect();
        let logits = LastLayer::forward_stack(&layers, &params, &self.finetune[0], &rows)?;
        let targets = batches
            .iter()
            .enumerate()
            .map(|(k, rows)| objective::targets(self.labels[k], rows, logits[k].device()))
            .collect::<Result<Vec<_>>>()?;
        objective::cross_entropy(&params, &logits, &targets)
    }

    /// Run `run`'s fine-tune rows `rows` as rows of the set it reads.
    fn set_rows(&self, run: usize, rows: &[usize]) -> Vec<usize> {
        rows.iter().map(|&i| self.run_offset[run] + i).collect()
    }

    /// Run `run`'s query-key eigenspectrum now (docs/protocol.md §5).
    fn spectrum(&self, run: usize) -> Result<Spectrum> {
        qk_spectrum(&self.optimizer, run, self.shape)
    }

    /// Run `run`'s rank-collapse residual now, on its test set's probe.
    fn rank_collapse(&self, run: usize) -> Result<f64> {
        let qk = QueryKey::of_run(&self.params(), run)?;
        let (_, probe) = &self.test[self.run_test[run]];
        self.layers[run].rank_collapse(&qk, &probe.inputs, probe.mask.as_ref())
    }

    /// Every run's whole fine-tune set, and test set when `score_test`, at the current parameters.
    fn evaluate_now(&self, epoch: usize, score_test: bool) -> Result<EpochEvaluation> {
        let params = self.params();
        let runs = self.runs();
        let mut finetune: Vec<Vec<SetOutput>> = (0..runs).map(|_| Vec::new()).collect();
        for chunk in eval_chunks(self.n) {
            for (k, out) in self
                .evaluate_finetune(&params, &chunk)?
                .into_iter()
                .enumerate()
            {
                finetune[k].push(out);
            }
        }
        let mut test_logits: Vec<Option<Tensor>> = vec![None; runs];
        if score_test {
            for (k, logits) in self.test_logits(&params)?.into_iter().enumerate() {
                test_logits[k] = Some(logits);
            }
        }
        let runs = finetune
            .into_iter()
            .zip(test_logits)
            .enumerate()
            .map(|(k, (chunks, test_logits))| {
                RunEvaluation::of(chunks, test_logits, || {
                    Ok((self.spectrum(k)?, Some(self.rank_collapse(k)?)))
                })
            })
            .collect::<Result<_>>()?;
        Ok(EpochEvaluation { epoch, runs })
    }

    /// Rows `rows` of every run's fine-tune set at `params`.
    fn evaluate_finetune(&self, params: &[Tensor], rows: &[usize]) -> Result<Vec<SetOutput>> {
        let own_rows: Vec<Vec<usize>> = (0..self.runs()).map(|k| self.set_rows(k, rows)).collect();
        let evals: Vec<StackEval> = (0..self.runs())
            .map(|k| StackEval {
                layer: &self.layers[k],
                source: HostSource::Resident(&self.finetune[self.run_finetune[k]]),
                rows: &own_rows[k],
            })
            .collect();
        let outputs = match self
            .pool
            .install(|| LastLayer::evaluate_stack(params, &evals))?
        {
            Some(outputs) => outputs,
            None => (0..self.runs())
                .map(|k| {
                    let qk = QueryKey::of_run(params, k)?;
                    let set = &self.finetune[self.run_finetune[k]];
                    self.pool
                        .install(|| self.layers[k].evaluate_resident(&qk, set, &own_rows[k]))
                })
                .collect::<Result<_>>()?,
        };
        Ok(outputs
            .into_iter()
            .map(|o| SetOutput {
                logits: o.logits,
                attention: o.cls_attention,
            })
            .collect())
    }

    /// Every run's test logits at `params`: the runs that read one test set together, a chunk
    /// at a time.
    fn test_logits(&self, params: &[Tensor]) -> Result<Vec<Tensor>> {
        let runs = self.runs();
        let mut chunks: Vec<Vec<Tensor>> = (0..runs).map(|_| Vec::new()).collect();
        for (copy, (test, _)) in self.test.iter().enumerate() {
            let members: Vec<usize> = (0..runs).filter(|&k| self.run_test[k] == copy).collect();
            let own_params = gather_runs(params, &members, runs)?;
            let layers: Vec<&LastLayer> = members.iter().map(|&k| &self.layers[k]).collect();
            for rows in eval_chunks(test.len()) {
                let outputs = self
                    .pool
                    .install(|| self.test_chunk(&own_params, &layers, test, &rows))?;
                for (&k, out) in members.iter().zip(outputs) {
                    chunks[k].push(out.logits.detach());
                }
            }
        }
        chunks
            .into_iter()
            .map(|c| Ok(Tensor::cat(&c, 0)?))
            .collect()
    }

    /// Rows `rows` of one test set, evaluated for the runs of `layers` at `params` (theirs).
    fn test_chunk(
        &self,
        params: &[Tensor],
        layers: &[&LastLayer],
        test: &TestRows,
        rows: &[usize],
    ) -> Result<Vec<crate::model::last_layer::Output>> {
        let stacked = match test {
            TestRows::Streamed(cached) => {
                LastLayer::evaluate_streamed_stack(params, layers, cached, rows)?
            }
            TestRows::Held(held) => {
                let evals: Vec<StackEval> = layers
                    .iter()
                    .map(|layer| StackEval {
                        layer,
                        source: HostSource::Held(held),
                        rows,
                    })
                    .collect();
                LastLayer::evaluate_stack(params, &evals)?
            }
        };
        if let Some(outputs) = stacked {
            return Ok(outputs);
        }
        let TestRows::Streamed(cached) = test else {
            anyhow::bail!("held test rows without a host pass");
        };
        layers
            .iter()
            .enumerate()
            .map(|(k, layer)| layer.evaluate_rows(&QueryKey::of_run(params, k)?, cached, rows))
            .collect()
    }
}

/// For each run, which of the distinct copies (numbered in order of first use) it reads, from
/// [`copies`]' first-run indices.
pub(super) fn index_of_copies(first_runs: &[usize]) -> Vec<usize> {
    let mut distinct: Vec<usize> = Vec::new();
    first_runs
        .iter()
        .map(|&first| match distinct.iter().position(|&d| d == first) {
            Some(at) => at,
            None => {
                distinct.push(first);
                distinct.len() - 1
            }
        })
        .collect()
}

/// The runs `members` of `params` (each with a leading axis of `runs`), stacked alike: the
/// tensors themselves when every run is a member.
fn gather_runs(params: &[Tensor], members: &[usize], runs: usize) -> Result<Vec<Tensor>> {
    if members.len() == runs {
        return Ok(params.to_vec());
    }
    let index = crate::model::attend::row_indices(members, params[0].device())?;
    params
        .iter()
        .map(|p| Ok(p.index_select(&index, 0)?))
        .collect()
}

/// The rank-collapse probe of a test set: its first [`RANK_PROBE`] samples with their mask.
fn probe(shared: &StackShared, test: &LayerRows) -> Result<Probe> {
    let rows: Vec<usize> = (0..RANK_PROBE.min(test.len())).collect();
    let batch = test.batch(&rows, shared.device)?;
    Ok(Probe {
        mask: text_mask(shared.model, &batch)?,
        inputs: batch.inputs,
    })
}

impl Trainee for LastLayerTrainee<'_> {
    fn runs(&self) -> usize {
        self.layers.len()
    }

    fn gradients(&mut self, batches: &[&[usize]]) -> Result<Gradients> {
        let mut gradients = if self.has_host_pass() {
            let pool = Arc::clone(&self.pool);
            pool.install(|| self.host_step(batches))?
        } else {
            self.resident_step(batches)?
        };
        objective::add_locater_penalty(&mut gradients, &self.params(), self.shape, self.locater)?;
        Ok(gradients)
    }

    fn evaluations(&mut self, end: &EpochEnd) -> Result<Vec<EpochEvaluation>> {
        // The epoch before, if its evaluation rode along these steps.
        let mut complete: Vec<EpochEvaluation> = self
            .pending
            .take()
            .map(Pending::finish)
            .transpose()?
            .into_iter()
            .collect();
        if self.has_host_pass() && !end.kept && !end.score_test && end.epoch > 0 {
            // This one rides along the next epoch's steps.
            let n = self.n;
            let params = self.optimizer.snapshot()?;
            self.pending = Some(Pending::new(end.epoch, params, self.runs(), n));
        } else {
            complete.push(self.evaluate_now(end.epoch, end.score_test)?);
        }
        Ok(complete)
    }

    fn optimizer(&self) -> &AdamW {
        &self.optimizer
    }

    fn optimizer_mut(&mut self) -> &mut AdamW {
        &mut self.optimizer
    }

    fn pictured(&self, run: usize, rows: &[usize]) -> Result<SetOutput> {
        let qk = QueryKey::of_run(&self.params(), run)?;
        let set = &self.finetune[self.run_finetune[run]];
        let rows = self.set_rows(run, rows);
        let out = self
            .pool
            .install(|| self.layers[run].evaluate_resident(&qk, set, &rows))?;
        Ok(SetOutput {
            logits: out.logits,
            attention: out.cls_attention,
        })
    }
}
