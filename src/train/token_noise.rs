//! The SNR dose (`--token-noise k`, docs/design.md "The SNR dose"): to every fine-tune and test
//! token the mode's phase 2 selects from, ξ = √k · Σ̂^{1/2} g is added, so that the tokens' noise
//! covariance grows from Σ̂ to (1 + k) Σ̂ while the class signal, the class count, T, the backbone
//! and the step count stay: SNR² becomes SNR² / (1 + k), and nothing else about the run changes.
//!
//! - **Which tokens.** Head mode: the final tokens (what the head selects from and the classifier
//!   reads). Last-layer mode: the last layer's inputs (what the feature cache holds and the
//!   trained query/key read, through the layer's LN for ViT).
//! - **Σ̂** is the covariance around their position's mean of those tokens of the first
//!   [`REFERENCE_SAMPLES`] test samples, undosed: label-free, and the same for every n, η and seed
//!   of a dataset, backbone and mode, so the dose is one matrix per set-up.
//! - **g** is drawn once per (split, sample, seed) from a ChaCha8 stream keyed by them, a token's
//!   d values after the previous token's: never per epoch, the same for η-siblings (which read the
//!   same samples) and for the sample wherever it appears.
//! - Phase 1 reads the undosed pretrain tokens, so one phase-1 classifier serves every dose.

use anyhow::{Context, Result, bail};
use candle_core::{Device, Tensor};
use nalgebra::{DMatrix, SymmetricEigen};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use super::run::{Mode, RunConfig, token_noise_out_of_range};
use super::setup::{RunFeatures, Setup, layer_inputs};
use crate::data::prepare::PreparedData;
use crate::data::split::SplitName;
use crate::diagnostics::snr::OtherTokens;
use crate::encoder::Model;
use crate::encoder::layer_rows::{LayerRows, RowsBuilder};

/// Test samples whose undosed tokens give Σ̂: 256 × 197 tokens at ViT-Ti's size, ~50 000 tokens
/// for a 192 × 192 covariance.
pub const REFERENCE_SAMPLES: usize = 256;

/// Samples dosed at a time.
const CHUNK: usize = 64;

/// A run's dose: √k Σ̂^{1/2} and the stream g is drawn from.
#[derive(Clone, Debug)]
pub struct TokenNoise {
    pub k: f64,
    seed: u64,
    /// √k Σ̂^{1/2} (d × d, symmetric) as f32 on the host.
    root: Tensor,
    /// tr Σ̂ of the undosed tokens.
    pub trace: f64,
    dim: usize,
}

impl TokenNoise {
    /// The dose `k` with Σ̂ from `reference` (tokens in the dosed space, undosed), drawn with
    /// `seed`.
    pub fn fit(k: f64, seed: u64, reference: &LayerRows) -> Result<Self> {
        if let Some(why) = token_noise_out_of_range(k) {
            bail!("--token-noise {why}");
        }
        let dim = reference.dim();
        let mut tokens = OtherTokens::new(dim);
        let rows: Vec<usize> = (0..reference.len()).collect();
        for chunk in rows.chunks(CHUNK) {
            let batch = reference.host_batch(chunk)?;
            for (b, &length) in batch.lengths.iter().enumerate() {
                for position in 0..length {
                    let start = (b * batch.width + position) * dim;
                    tokens.add(position, &batch.values[start..start + dim]);
                }
            }
        }
        let (covariance, _) = tokens
            .position_covariance()
            .context("--token-noise: too few reference tokens for their covariance")?;
        let trace = covariance.trace();
        let root = symmetric_root(covariance) * k.sqrt();
        let values: Vec<f32> = root.iter().map(|&v| v as f32).collect();
        // Column-major from nalgebra; the matrix is symmetric, so row-major reads the same.
        let root = Tensor::from_vec(values, (dim, dim), &Device::Cpu)?;
        Ok(Self {
            k,
            seed,
            root,
            trace,
            dim,
        })
    }

    /// The dose of a run of `mode` on `model`: Σ̂ from the first [`REFERENCE_SAMPLES`] of the
    /// test set's last-layer inputs `test_inputs`, taken to the dosed space (the final tokens in
    /// head mode, the inputs in last-layer mode).
    pub fn for_run(
        k: f64,
        seed: u64,
        head_mode: bool,
        model: &Model,
        test_inputs: &LayerRows,
        device: &Device,
    ) -> Result<Self> {
        let count = test_inputs.len().min(REFERENCE_SAMPLES);
        let rows: Vec<usize> = (0..count).collect();
        let mut reference = RowsBuilder::in_memory(test_inputs.tokens(), test_inputs.dim());
        for chunk in rows.chunks(CHUNK) {
            let batch = test_inputs.batch(chunk, device)?;
            let tokens = if head_mode {
                finish(model, &batch.inputs, &batch)?
            } else {
                batch.inputs.clone()
            };
            reference.push(&tokens, &batch.lengths)?;
        }
        Self::fit(k, seed, &reference.finish())
    }

    /// The noise of sample `position` of `split`: `length` tokens of width d, row-major.
    pub fn draw(&self, split: SplitName, position: usize, length: usize) -> Result<Tensor> {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.seed.to_le_bytes());
        key[8..16].copy_from_slice(&(split as u64).to_le_bytes());
        key[16..24].copy_from_slice(&(position as u64).to_le_bytes());
        key[24..].copy_from_slice(b"tokdose1");
        let mut rng = ChaCha8Rng::from_seed(key);
        let g: Vec<f32> = (0..length * self.dim)
            .map(|_| rng.sample::<f32, _>(StandardNormal))
            .collect();
        Ok(Tensor::from_vec(g, (length, self.dim), &Device::Cpu)?.matmul(&self.root)?)
    }

    /// `rows` with the dose added, sample i being sample `positions[i]` of `split`: in memory,
    /// or in a temporary file under `spill_dir`.
    pub fn apply(
        &self,
        rows: &LayerRows,
        split: SplitName,
        positions: &[usize],
        spill_dir: Option<&std::path::Path>,
    ) -> Result<LayerRows> {
        if positions.len() != rows.len() || rows.dim() != self.dim {
            bail!(
                "token noise: {} samples of width {} for {} positions and a dose of width {}",
                rows.len(),
                rows.dim(),
                positions.len(),
                self.dim
            );
        }
        let mut out = match spill_dir {
            Some(dir) => RowsBuilder::on_disk(dir, rows.tokens(), self.dim)?,
            None => RowsBuilder::in_memory(rows.tokens(), self.dim),
        };
        let all: Vec<usize> = (0..rows.len()).collect();
        for chunk in all.chunks(CHUNK) {
            let batch = rows.batch(chunk, &Device::Cpu)?;
            let width = batch.inputs.dim(1)?;
            let noise = chunk
                .iter()
                .zip(&batch.lengths)
                .map(|(&i, &length)| {
                    let drawn = self.draw(split, positions[i], length)?;
                    Ok(drawn.pad_with_zeros(0, 0, width - length)?)
                })
                .collect::<Result<Vec<_>>>()?;
            let dosed = (batch.inputs + Tensor::stack(&noise, 0)?)?;
            out.push(&dosed, &batch.lengths)?;
        }
        Ok(out.finish())
    }
}

/// The dose of a run, if its configuration asks for one ([`RunConfig::token_noise`] > 0).
pub(super) fn run_token_noise(
    setup: &Setup,
    features: &RunFeatures,
    config: &RunConfig,
) -> Result<Option<TokenNoise>> {
    if config.token_noise == 0.0 {
        return Ok(None);
    }
    TokenNoise::for_run(
        config.token_noise,
        config.seed,
        config.mode == Mode::Head,
        &setup.backbone.model,
        layer_inputs(&features.test)?,
        &setup.device,
    )
    .map(Some)
}

/// A run's fine-tune and test sets as phase 2 and the SNR estimate read them: the last layer's
/// inputs, with the dose added in last-layer mode; in head mode the dose that the final tokens
/// take.
pub(super) struct DosedSets<'a> {
    pub(super) finetune: LayerRows,
    pub(super) test: LayerRows,
    pub(super) mode: Mode,
    pub(super) head_noise: Option<&'a TokenNoise>,
}

impl<'a> DosedSets<'a> {
    pub(super) fn of(
        setup: &Setup,
        prepared: &PreparedData,
        features: &RunFeatures,
        mode: Mode,
        noise: Option<&'a TokenNoise>,
    ) -> Result<Self> {
        let (finetune, test) = (
            layer_inputs(&features.finetune)?,
            layer_inputs(&features.test)?,
        );
        let partition = &prepared.partition;
        Ok(match (noise, mode) {
            (Some(noise), Mode::LastLayer) => Self {
                finetune: noise.apply(
                    finetune,
                    partition.train_source,
                    &partition.finetune,
                    None,
                )?,
                test: noise.apply(
                    test,
                    SplitName::Test,
                    &partition.test,
                    Some(setup.cache.root()),
                )?,
                mode,
                head_noise: None,
            },
            _ => Self {
                finetune: finetune.clone(),
                test: test.clone(),
                mode,
                head_noise: noise,
            },
        })
    }
}

/// The frozen last layer (and the final LN) on a batch of its inputs.
fn finish(
    model: &Model,
    inputs: &Tensor,
    batch: &crate::encoder::layer_rows::LayerBatch,
) -> Result<Tensor> {
    Ok(match model {
        Model::Vit(vit) => vit.finish(inputs)?,
        Model::Bert(bert) => bert.finish(inputs, &batch.mask()?)?,
    })
}

/// Σ^{1/2} of a symmetric positive semi-definite Σ (negative rounding in its eigenvalues read as 0).
fn symmetric_root(covariance: DMatrix<f64>) -> DMatrix<f64> {
    let eigen = SymmetricEigen::new(covariance);
    let roots = eigen.eigenvalues.map(|v| v.max(0.0).sqrt());
    &eigen.eigenvectors * DMatrix::from_diagonal(&roots) * eigen.eigenvectors.transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(values: Vec<f32>, n: usize, t: usize, d: usize) -> LayerRows {
        let padded = Tensor::from_vec(values, (n, t, d), &Device::Cpu).unwrap();
        LayerRows::from_padded(&padded, vec![t; n]).unwrap()
    }

    /// Tokens with a known anisotropic covariance (variances 4, 1, 0.25 on three axes) and a mean
    /// per position.
    fn anisotropic(n: usize, t: usize, seed: u64) -> LayerRows {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let scales = [2.0f32, 1.0, 0.5];
        let values = (0..n * t)
            .flat_map(|k| {
                let position = (k % t) as f32;
                scales
                    .iter()
                    .map(|&s| s * rng.sample::<f32, _>(StandardNormal) + 3.0 * position)
                    .collect::<Vec<_>>()
            })
            .collect();
        rows(values, n, t, 3)
    }

    fn covariance(rows: &LayerRows) -> DMatrix<f64> {
        let mut tokens = OtherTokens::new(rows.dim());
        let batch = rows
            .host_batch(&(0..rows.len()).collect::<Vec<_>>())
            .unwrap();
        for (b, &length) in batch.lengths.iter().enumerate() {
            for p in 0..length {
                let start = (b * batch.width + p) * rows.dim();
                tokens.add(p, &batch.values[start..start + rows.dim()]);
            }
        }
        tokens.position_covariance().unwrap().0
    }

    #[test]
    fn the_dose_multiplies_the_noise_covariance_by_one_plus_k() {
        let reference = anisotropic(400, 5, 1);
        let tokens = anisotropic(2000, 5, 2);
        let noise = TokenNoise::fit(3.0, 7, &reference).unwrap();
        let positions: Vec<usize> = (0..tokens.len()).collect();
        let dosed = noise
            .apply(&tokens, SplitName::Train, &positions, None)
            .unwrap();
        let after = covariance(&dosed);
        // (1 + k) Σ with Σ = diag(4, 1, 0.25); within 10 % of the diagonal's scale (the sample
        // covariance of 10 000 tokens and Σ̂ of 2000 are each a few per cent off).
        let variances = [4.0f64, 1.0, 0.25];
        for i in 0..3 {
            for j in 0..3 {
                let want = if i == j { 4.0 * variances[i] } else { 0.0 };
                let scale = 4.0 * (variances[i] * variances[j]).sqrt();
                assert!(
                    (after[(i, j)] - want).abs() < 0.1 * scale,
                    "({i}, {j}): {} against {want}",
                    after[(i, j)]
                );
            }
        }
        // tr Σ̂: 4 + 1 + 0.25.
        assert!((noise.trace - 5.25).abs() < 0.2, "{}", noise.trace);
    }

    #[test]
    fn the_noise_is_fixed_by_split_sample_and_seed_alone() {
        let reference = anisotropic(100, 4, 1);
        let noise = TokenNoise::fit(1.0, 7, &reference).unwrap();
        let values = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let a = values(noise.draw(SplitName::Train, 5, 4).unwrap());
        assert_eq!(a, values(noise.draw(SplitName::Train, 5, 4).unwrap()));
        // A shorter sample's tokens are the first ones of the longer draw.
        assert_eq!(
            a[..6],
            values(noise.draw(SplitName::Train, 5, 2).unwrap())[..]
        );
        assert_ne!(a, values(noise.draw(SplitName::Test, 5, 4).unwrap()));
        assert_ne!(a, values(noise.draw(SplitName::Train, 6, 4).unwrap()));
        let other_seed = TokenNoise::fit(1.0, 8, &reference).unwrap();
        assert_ne!(a, values(other_seed.draw(SplitName::Train, 5, 4).unwrap()));
        // Applied twice, the same rows; k = 0 changes nothing.
        let tokens = anisotropic(10, 4, 3);
        let positions: Vec<usize> = (0..10).collect();
        let once = noise
            .apply(&tokens, SplitName::Test, &positions, None)
            .unwrap();
        let twice = noise
            .apply(&tokens, SplitName::Test, &positions, None)
            .unwrap();
        assert_eq!(once.content_digest(), twice.content_digest());
        let none = TokenNoise::fit(0.0, 7, &reference).unwrap();
        let same = none
            .apply(&tokens, SplitName::Test, &positions, None)
            .unwrap();
        assert_eq!(same.content_digest(), tokens.content_digest());
    }

    #[test]
    fn a_dose_out_of_range_is_refused_by_its_flag() {
        let reference = anisotropic(10, 4, 1);
        for k in [-1.0, f64::NAN, f64::INFINITY, 2e6] {
            let err = TokenNoise::fit(k, 0, &reference).unwrap_err().to_string();
            assert!(err.starts_with("--token-noise must be"), "{err}");
        }
    }
}
