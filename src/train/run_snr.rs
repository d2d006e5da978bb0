//! A run's fine-tune set on the paper's SNR axis (docs/design.md, "The SNR of real tokens"; the
//! estimator is [`crate::diagnostics::snr`]). Each sample's relevant token is the position whose
//! final token the phase-1 classifier is most confident about, whatever the class; the tokens
//! measured are the ones the mode's phase 2 selects from: the final tokens in head mode, what the
//! last layer's attention reads (LN of its inputs for ViT, the inputs for BERT) in last-layer mode.

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::phase1::{Phase1Outcome, phase1_from_init};
use super::progress::Progress;
use super::run::FinetuneJob;
use super::run::Mode;
use super::setup::{Setup, final_tokens, prepare_data, run_features, setup};
use super::token_noise::{DosedSets, TokenNoise, run_token_noise};
use crate::data::prepare::PreparedData;
use crate::data::split::SplitName;
use crate::diagnostics::snr::{OtherTokens, SnrEstimate, confident_choice, estimate_from};
use crate::encoder::Model;
use crate::encoder::layer_rows::LayerRows;
use crate::model::Classifier;
use crate::model::last_layer::attention_inputs;

/// Samples through the last layer at a time.
const CHUNK: usize = 64;

/// One run's estimate, with what it was made of.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunSnr {
    pub run: String,
    pub dataset: String,
    pub mode: Mode,
    pub backbone: String,
    /// Test accuracy of the phase-1 classifier whose scores chose the relevant tokens: equal to
    /// a finished run's `baseline_test_acc` when the estimate used that run's phase 1.
    pub phase1_test_acc: f64,
    #[serde(flatten)]
    pub estimate: SnrEstimate,
}

/// The estimate of `job`'s fine-tune set: its set-up, features and phase 1 as `finetune` has them
/// (the phase-1 classifier from the shared cache when it is there), its SNR dose if it has one,
/// and no phase 2.
pub fn of_job(job: &FinetuneJob, progress: &dyn Progress) -> Result<RunSnr> {
    let setup = setup(job)?;
    let prepared = prepare_data(&setup, job)?;
    let features = run_features(&setup, &prepared, job, progress)?;
    let (phase1, _) = phase1_from_init(&setup, &prepared, &features, job, None, progress)?;
    let noise = run_token_noise(&setup, &features, &job.config)?;
    let sets = DosedSets::of(
        &setup,
        &prepared,
        &features,
        job.config.mode,
        noise.as_ref(),
    )?;
    let estimate = of_run(&setup, &sets, &prepared, &phase1)?;
    Ok(RunSnr {
        run: job.config.run_name()?,
        dataset: job.config.dataset.to_string(),
        mode: job.config.mode,
        backbone: setup.backbone.files.id.clone(),
        phase1_test_acc: phase1.baseline_test_acc,
        estimate,
    })
}

/// The estimate on a set-up run's fine-tune set (dosed as its phase 2 reads it), once its
/// phase 1 is had.
pub(super) fn of_run(
    setup: &Setup,
    sets: &DosedSets,
    prepared: &PreparedData,
    phase1: &Phase1Outcome,
) -> Result<SnrEstimate> {
    let final_noise = sets.head_noise.map(|noise| FinalNoise {
        noise,
        split: prepared.partition.train_source,
        positions: &prepared.partition.finetune,
    });
    fine_tune_snr(
        &setup.backbone.model,
        &phase1.classifier,
        &sets.finetune,
        &prepared.labels.clean_labels,
        sets.mode,
        &setup.device,
        final_noise,
    )
}

/// An SNR dose on a set's final tokens: the dose and the set's samples.
#[derive(Clone, Copy)]
pub struct FinalNoise<'a> {
    pub noise: &'a TokenNoise,
    pub split: SplitName,
    pub positions: &'a [usize],
}

/// The estimate on a fine-tune set given by its last layer's inputs and clean labels, a chunk of
/// samples at a time: what it holds beyond a chunk is each sample's relevant token (n × d).
/// `final_noise` is added to the final tokens (head mode under a dose).
pub fn fine_tune_snr(
    model: &Model,
    classifier: &Classifier,
    inputs: &LayerRows,
    clean_labels: &[u32],
    mode: Mode,
    device: &Device,
    final_noise: Option<FinalNoise>,
) -> Result<SnrEstimate> {
    let inputs = inputs.resident()?;
    let mut finals = final_tokens(model, &inputs, device, None)?;
    if let Some(dose) = final_noise {
        finals = dose
            .noise
            .apply(&finals, dose.split, dose.positions, None)?;
    }
    let (n, dim) = (inputs.len(), inputs.dim());
    let mut relevant = Vec::with_capacity(n * dim);
    let mut positions = Vec::with_capacity(n);
    let mut predicted = Vec::with_capacity(n);
    let mut others = OtherTokens::new(dim);
    let rows: Vec<usize> = (0..n).collect();
    for chunk in rows.chunks(CHUNK) {
        let finished = finals.batch(chunk, device)?;
        let (b, l, _) = finished.inputs.dims3()?;
        let logits = classifier.forward(&finished.inputs.reshape((b * l, dim))?)?;
        let classes = logits.dim(1)?;
        let logits = host(&logits)?;
        let measured = match mode {
            Mode::Head => host(&finished.inputs)?,
            Mode::LastLayer => host(&attention_inputs(
                model,
                &inputs.batch(chunk, device)?.inputs,
            )?)?,
        };
        for (k, &sample) in chunk.iter().enumerate() {
            let length = finished.lengths[k];
            let sample_logits = &logits[k * l * classes..(k * l + length) * classes];
            let (position, class) = confident_choice(sample_logits, classes)
                .with_context(|| format!("fine-tune sample {sample}: no token to score"))?;
            predicted.push(class);
            let token = |p: usize| &measured[(k * l + p) * dim..(k * l + p + 1) * dim];
            relevant.extend_from_slice(token(position));
            positions.push(position);
            for other in (0..length).filter(|&p| p != position) {
                others.add(other, token(other));
            }
        }
    }
    let labels: Vec<usize> = clean_labels.iter().map(|&c| c as usize).collect();
    estimate_from(
        &relevant,
        dim,
        &labels,
        (&positions, &predicted),
        &mut others,
    )
    .map_err(anyhow::Error::msg)
}

fn host(tensor: &Tensor) -> Result<Vec<f32>> {
    tensor
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()
        .context("reading tokens back to the host")
}
