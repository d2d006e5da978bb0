//! `diagnose snr --plant-snr S`: the SNR estimate on a run's real tokens with a known signal
//! planted in them ([`crate::diagnostics::plant`]; docs/design.md, "A planted signal").
//!
//! The fine-tune set's tokens in the mode's space (final tokens in head mode, what the last
//! layer's attention reads in last-layer mode) are the noise; K balanced classes (K the
//! dataset's) replace the labels; class c's signal of norm S·√tr Σ̂ goes into one token per
//! sample at a seeded random position. The relevant token is chosen as the real estimate chooses
//! it, by the confidence of a classifier that knows the planted classes: a nearest-mean classifier
//! fitted on planted test tokens (the first [`FIT_SAMPLES`], planted with the same signals at
//! positions of their own). The run's phase 1 takes no part: it knows the real classes, not
//! these.

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

use super::progress::Progress;
use super::run::{FinetuneJob, Mode};
use super::setup::{evaluation_features, layer_inputs, prepare_data, setup};
use crate::diagnostics::plant::{ClassSignals, NearestMean, PlantDraw};
use crate::diagnostics::snr::{OtherTokens, SnrEstimate, confident_choice, estimate_from};
use crate::encoder::Model;
use crate::encoder::layer_rows::{LayerRows, RowsBuilder};
use crate::model::last_layer::attention_inputs;

/// Test samples the classifier is fitted on (fewer where the test set is smaller).
pub const FIT_SAMPLES: usize = 1000;

/// Samples through the last layer at a time.
const CHUNK: usize = 64;

/// The largest S asked for: the tokens' own spread is S = 1.
pub const MAX_PLANT_SNR: f64 = 100.0;

/// One planted S on one run's tokens, and what the estimate read.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlantedSnr {
    pub run: String,
    pub dataset: String,
    pub mode: Mode,
    pub backbone: String,
    /// The S planted: ‖μ‖ / √tr Σ̂.
    pub planted_snr: f64,
    /// n · S², what the estimate should read.
    pub planted_n_snr2: f64,
    /// tr Σ̂ of the fine-tune set's tokens around their position's mean.
    pub noise_trace: f64,
    /// Share of samples whose chosen relevant token is the planted one.
    pub found_share: f64,
    /// The estimate's SNR with σ taken around the position means
    /// ([`SnrEstimate::position_noise_norm`]), the σ the plant's S is defined on.
    pub snr_position_sigma: f64,
    /// `snr_position_sigma` divided by the estimate's κ ([`SnrEstimate::selection_kappa`], the
    /// share of relevant tokens found as the labels tell it; 0 below the floor): the correction
    /// the estimate would need were the misses its only error.
    pub kappa_corrected_snr: f64,
    /// Test samples the classifier was fitted on.
    pub fit_samples: usize,
    pub estimate: SnrEstimate,
    /// The same with the classifier that knows the signals exactly ([`NearestMean::exact`]):
    /// where it finds the planted tokens and the fitted classifier does not, the classifier's fit
    /// is what the estimate lacks; where neither does, the selection of one token of T.
    pub oracle: OracleArm,
}

/// The oracle classifier's reading of the same plant.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OracleArm {
    pub found_share: f64,
    pub snr_position_sigma: f64,
    pub estimate: SnrEstimate,
}

/// The estimate on `job`'s fine-tune tokens at each planted S of `plant`.
pub fn of_job(
    job: &FinetuneJob,
    plant: &[f64],
    progress: &dyn Progress,
) -> Result<Vec<PlantedSnr>> {
    if let Some(&bad) = plant
        .iter()
        .find(|s| !(s.is_finite() && **s > 0.0 && **s <= MAX_PLANT_SNR))
    {
        bail!("--plant-snr: each S must be a number in (0, {MAX_PLANT_SNR}], got {bad}");
    }
    let ModeTokens {
        finetune,
        test: fit,
        backbone,
        classes,
    } = mode_tokens(job, FIT_SAMPLES, progress)?;
    let mode = job.config.mode;
    let fit_count = fit.len();
    let dim = finetune.dim();
    let classes = classes.clamp(2, dim);
    let trace = noise_trace(&finetune)?;
    let seed = job.config.seed;
    let signals = ClassSignals::new(classes, dim, seed ^ 0x706c_616e_7400);
    let draw = PlantDraw::new(finetune.lengths(), classes, seed ^ 0x706c_616e_7401);
    let fit_draw = PlantDraw::new(fit.lengths(), classes, seed ^ 0x706c_616e_7402);
    let run = job.config.run_name()?;
    plant
        .iter()
        .map(|&snr| {
            let norm = snr * trace.sqrt();
            let fit_tokens = planted_tokens(&fit, &fit_draw, &signals, norm)?;
            let classifier = NearestMean::fit(&fit_tokens, &fit_draw.labels, classes, dim);
            let (estimate, found_share) =
                planted_estimate(&finetune, &draw, &signals, norm, &classifier)?;
            let exact = NearestMean::exact(&signals, norm);
            let (oracle, oracle_found) =
                planted_estimate(&finetune, &draw, &signals, norm, &exact)?;
            let n = finetune.len() as f64;
            Ok(PlantedSnr {
                run: run.clone(),
                dataset: job.config.dataset.to_string(),
                mode,
                backbone: backbone.clone(),
                planted_snr: snr,
                planted_n_snr2: n * snr * snr,
                noise_trace: trace,
                found_share,
                snr_position_sigma: estimate.signal_norm / estimate.position_noise_norm,
                kappa_corrected_snr: kappa_corrected(&estimate),
                fit_samples: fit_count,
                estimate,
                oracle: OracleArm {
                    found_share: oracle_found,
                    snr_position_sigma: oracle.signal_norm / oracle.position_noise_norm,
                    estimate: oracle,
                },
            })
        })
        .collect()
}

/// A run's fine-tune and test tokens in its mode's space (the first `test_count` test samples),
/// with the backbone's id: what a model that stands in for phase 2 reads.
pub struct ModeTokens {
    pub finetune: LayerRows,
    pub test: LayerRows,
    pub backbone: String,
    /// The dataset's class count.
    pub classes: usize,
}

/// [`ModeTokens`] of `job`, its features from the cache where they are there.
pub fn mode_tokens(
    job: &FinetuneJob,
    test_count: usize,
    progress: &dyn Progress,
) -> Result<ModeTokens> {
    let setup = setup(job)?;
    let prepared = prepare_data(&setup, job)?;
    let (finetune, test) = evaluation_features(&setup, &prepared, job, progress)?;
    let model = &setup.backbone.model;
    let mode = job.config.mode;
    let finetune = measured_tokens(model, layer_inputs(&finetune)?, None, mode, &setup.device)?;
    let test = layer_inputs(&test)?;
    let count = test.len().min(test_count);
    let test = measured_tokens(model, test, Some(count), mode, &setup.device)?;
    Ok(ModeTokens {
        finetune,
        test,
        backbone: setup.backbone.files.id.clone(),
        classes: setup.dataset.class_names.len(),
    })
}

/// The tokens the mode's phase 2 selects from, of the first `count` samples of `inputs` (all by
/// default), in memory: the final tokens in head mode, the attention's inputs in last-layer mode.
fn measured_tokens(
    model: &Model,
    inputs: &LayerRows,
    count: Option<usize>,
    mode: Mode,
    device: &Device,
) -> Result<LayerRows> {
    let rows: Vec<usize> = (0..count.unwrap_or(inputs.len())).collect();
    let mut out = RowsBuilder::in_memory(inputs.tokens(), inputs.dim());
    for chunk in rows.chunks(CHUNK) {
        let batch = inputs.batch(chunk, device)?;
        let tokens = match (mode, model) {
            (Mode::Head, Model::Vit(vit)) => vit.finish(&batch.inputs)?,
            (Mode::Head, Model::Bert(bert)) => bert.finish(&batch.inputs, &batch.mask()?)?,
            (Mode::LastLayer, _) => attention_inputs(model, &batch.inputs)?,
        };
        out.push(
            &tokens.to_dtype(DType::F32)?.to_device(&Device::Cpu)?,
            &batch.lengths,
        )?;
    }
    Ok(out.finish())
}

/// tr Σ̂ of `tokens` around their position's mean.
fn noise_trace(tokens: &LayerRows) -> Result<f64> {
    let mut others = OtherTokens::new(tokens.dim());
    tokens.for_each_sample(|_, values, length| {
        for p in 0..length {
            others.add(p, &values[p * tokens.dim()..(p + 1) * tokens.dim()]);
        }
        Ok(())
    })?;
    let (covariance, _) = others
        .position_covariance()
        .context("--plant-snr: too few tokens for their covariance")?;
    Ok(covariance.trace())
}

/// Each sample's planted token (n × d): its token at the draw's position plus its class's signal.
fn planted_tokens(
    tokens: &LayerRows,
    draw: &PlantDraw,
    signals: &ClassSignals,
    norm: f64,
) -> Result<Vec<f32>> {
    let d = tokens.dim();
    let mut out = Vec::with_capacity(tokens.len() * d);
    tokens.for_each_sample(|i, values, _| {
        let p = draw.positions[i];
        let signal = signals.signal(draw.labels[i], norm);
        out.extend(
            values[p * d..(p + 1) * d]
                .iter()
                .zip(&signal)
                .map(|(x, s)| x + s),
        );
        Ok(())
    })?;
    Ok(out)
}

/// The estimate on the planted set, its relevant tokens chosen by `classifier`'s confidence,
/// and the share of samples where the chosen token is the planted one.
fn planted_estimate(
    tokens: &LayerRows,
    draw: &PlantDraw,
    signals: &ClassSignals,
    norm: f64,
    classifier: &NearestMean,
) -> Result<(SnrEstimate, f64)> {
    let d = tokens.dim();
    let classes = signals.classes;
    let mut relevant = Vec::with_capacity(tokens.len() * d);
    let mut positions = Vec::with_capacity(tokens.len());
    let mut predicted = Vec::with_capacity(tokens.len());
    let mut others = OtherTokens::new(d);
    let mut found = 0usize;
    tokens.for_each_sample(|i, values, length| {
        let mut sample = values[..length * d].to_vec();
        let p = draw.positions[i];
        let signal = signals.signal(draw.labels[i], norm);
        sample[p * d..(p + 1) * d]
            .iter_mut()
            .zip(&signal)
            .for_each(|(x, s)| *x += s);
        let logits = classifier.logits(&sample);
        let (chosen, class) = confident_choice(&logits, classes)
            .with_context(|| format!("fine-tune sample {i}: no token to score"))?;
        predicted.push(class);
        found += usize::from(chosen == p);
        relevant.extend_from_slice(&sample[chosen * d..(chosen + 1) * d]);
        positions.push(chosen);
        for other in (0..length).filter(|&q| q != chosen) {
            others.add(other, &sample[other * d..(other + 1) * d]);
        }
        Ok(())
    })?;
    let estimate = estimate_from(
        &relevant,
        d,
        &draw.labels,
        (&positions, &predicted),
        &mut others,
    )
    .map_err(anyhow::Error::msg)?;
    Ok((estimate, found as f64 / tokens.len() as f64))
}

/// The position-centred SNR over κ, 0 below the floor, NaN where κ is not positive.
fn kappa_corrected(estimate: &SnrEstimate) -> f64 {
    let read = estimate.signal_norm / estimate.position_noise_norm;
    match estimate.selection_kappa {
        _ if estimate.n_snr2 == 0.0 => 0.0,
        kappa if kappa > 0.0 => read / kappa.min(1.0),
        _ => f64::NAN,
    }
}
