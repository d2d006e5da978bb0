//! A dataset's real tokens as the paper's noise ε (docs/design.md, "The paper's model on real
//! noise"): each sample's tokens centred on their position's mean and scaled so that tr Σ̂ = d (the
//! paper's σ_ε = 1 on average, so SNR = ‖μ‖/√d and the paper's step size keeps its meaning), in a
//! seeded random orthonormal basis (so μ_{±1} = ‖μ‖e_{1,2} point in random directions of the real
//! covariance); T of each sample's tokens drawn at seeded random positions; then the paper's
//! three-token signal and label flips on top ([`plant`]).

use anyhow::{Result, bail};
use rand::seq::SliceRandom;
use rand::{Rng, RngExt};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use crate::encoder::layer_rows::LayerRows;
use crate::rng::{Stream, stream};
use crate::synthetic::data::{TokenLaw, TokenSet, add_signals, flips_per_class};

/// Tokens per sample: the paper's T, where its clock is anchored.
pub const SEQ_LEN: usize = 8;

/// The standardisation of one seed: position means, the scale, the basis.
pub struct NoiseBasis {
    dim: usize,
    /// Mean token of each position (as long as the longest sample of the pool).
    position_means: Vec<Vec<f64>>,
    /// √(d / tr Σ̂).
    scale: f64,
    /// Orthonormal basis, (d, d) row-major; row j is the direction that becomes coordinate j.
    basis: Vec<f64>,
}

/// A Haar-random orthonormal basis of R^d: Gram–Schmidt (twice, for rounding) on a Gaussian matrix.
fn random_basis(dim: usize, rng: &mut ChaCha8Rng) -> Vec<f64> {
    let mut rows: Vec<Vec<f64>> = (0..dim)
        .map(|_| (0..dim).map(|_| rng.sample(StandardNormal)).collect())
        .collect();
    for j in 0..dim {
        for _ in 0..2 {
            for k in 0..j {
                let dot: f64 = rows[j].iter().zip(&rows[k]).map(|(a, b)| a * b).sum();
                let (done, rest) = rows.split_at_mut(j);
                rest[0]
                    .iter_mut()
                    .zip(&done[k])
                    .for_each(|(a, b)| *a -= dot * b);
            }
        }
        let norm = rows[j].iter().map(|a| a * a).sum::<f64>().sqrt();
        rows[j].iter_mut().for_each(|a| *a /= norm);
    }
    rows.concat()
}

impl NoiseBasis {
    /// Fitted on `pool` (held-out tokens), the basis drawn from `seed`'s stream.
    pub fn fit(pool: &LayerRows, seed: u64) -> Result<Self> {
        let dim = pool.dim();
        let mut sums: Vec<Vec<f64>> = Vec::new();
        let mut counts: Vec<usize> = Vec::new();
        pool.for_each_sample(|_, values, length| {
            if sums.len() < length {
                sums.resize(length, vec![0.0; dim]);
                counts.resize(length, 0);
            }
            for p in 0..length {
                let row = &values[p * dim..(p + 1) * dim];
                sums[p]
                    .iter_mut()
                    .zip(row)
                    .for_each(|(s, &x)| *s += x as f64);
                counts[p] += 1;
            }
            Ok(())
        })?;
        let position_means: Vec<Vec<f64>> = sums
            .into_iter()
            .zip(&counts)
            .map(|(s, &c)| s.into_iter().map(|v| v / c as f64).collect())
            .collect();
        let (mut squares, mut tokens) = (0.0, 0usize);
        pool.for_each_sample(|_, values, length| {
            for p in 0..length {
                let row = &values[p * dim..(p + 1) * dim];
                squares += row
                    .iter()
                    .zip(&position_means[p])
                    .map(|(&x, m)| (x as f64 - m).powi(2))
                    .sum::<f64>();
                tokens += 1;
            }
            Ok(())
        })?;
        let trace = squares / tokens.max(1) as f64;
        if !(trace.is_finite() && trace > 0.0) {
            bail!("the held-out tokens have no spread to stand for noise (tr Σ̂ = {trace})");
        }
        let mut rng = stream(seed, Stream::ReferenceMap);
        Ok(Self {
            dim,
            position_means,
            scale: (dim as f64 / trace).sqrt(),
            basis: random_basis(dim, &mut rng),
        })
    }

    /// One token standardised and in the basis.
    fn standardise(&self, row: &[f32], position: usize, out: &mut Vec<f32>) {
        let d = self.dim;
        let mean = &self.position_means[position.min(self.position_means.len() - 1)];
        let centred: Vec<f64> = row
            .iter()
            .zip(mean)
            .map(|(&x, m)| (x as f64 - m) * self.scale)
            .collect();
        out.extend((0..d).map(|j| {
            self.basis[j * d..(j + 1) * d]
                .iter()
                .zip(&centred)
                .map(|(b, c)| b * c)
                .sum::<f64>() as f32
        }));
    }

    /// The noise of the first `count` samples of `rows` that have at least T tokens: T of each
    /// one's tokens at positions drawn from `rng`, standardised, (count, T, d) row-major.
    pub fn draw(&self, rows: &LayerRows, count: usize, rng: &mut ChaCha8Rng) -> Result<Vec<f32>> {
        let d = self.dim;
        let mut out = Vec::with_capacity(count * SEQ_LEN * d);
        let mut taken = 0usize;
        rows.for_each_sample(|_, values, length| {
            if taken == count || length < SEQ_LEN {
                return Ok(());
            }
            let mut positions: Vec<usize> = (0..length).collect();
            positions.shuffle(rng);
            for &p in &positions[..SEQ_LEN] {
                self.standardise(&values[p * d..(p + 1) * d], p, &mut out);
            }
            taken += 1;
            Ok(())
        })?;
        if taken < count {
            bail!(
                "only {taken} of the {} samples have at least {SEQ_LEN} tokens; {count} are needed",
                rows.len()
            );
        }
        Ok(out)
    }
}

/// The paper's signal on `noise` (count, T, d): balanced labels in a seeded order, μ_y on x₁,
/// ρμ_y on x₂, ρμ_{−y} on x₃ (μ_{+1} = ‖μ‖e₁, μ_{−1} = ‖μ‖e₂), then ⌈nη⌉/2 labels of each class
/// flipped, as `synthetic::data::generate` does to Gaussian noise.
pub fn plant(
    noise: Vec<f32>,
    dim: usize,
    (rho, signal_norm): (f64, f64),
    noise_ratio: f64,
    rng: &mut impl Rng,
) -> TokenSet {
    let mut tokens = noise;
    let num_samples = tokens.len() / (SEQ_LEN * dim);
    let mut order: Vec<usize> = (0..num_samples).collect();
    order.shuffle(rng);
    let positives = num_samples / 2;
    let mut clean_labels = vec![-1.0; num_samples];
    order[..positives]
        .iter()
        .for_each(|&i| clean_labels[i] = 1.0);
    let law = TokenLaw {
        seq_len: SEQ_LEN,
        embed_dim: dim,
        rho,
        signal_norm,
        noise_std: 1.0,
    };
    add_signals(&mut tokens, &clean_labels, &law);
    // The first flips of each class in the seeded order.
    let flips = flips_per_class(num_samples, noise_ratio);
    let mut noisy_mask = vec![false; num_samples];
    for class in [1.0, -1.0] {
        order
            .iter()
            .filter(|&&i| clean_labels[i] == class)
            .take(flips)
            .for_each(|&i| noisy_mask[i] = true);
    }
    TokenSet::flipped(tokens, (SEQ_LEN, dim), clean_labels, noisy_mask)
}

/// Accuracy of sign(νᵀx₁) on `set`: the test accuracy of attention entirely on the relevant
/// token, the most the model can reach by selecting it (Φ(‖μ‖/√2) under the paper's noise).
pub fn relevant_token_ceiling(set: &TokenSet) -> f64 {
    let d = set.embed_dim;
    let right = (0..set.num_samples)
        .filter(|&i| {
            let x1 = &set.tokens[i * set.seq_len * d..i * set.seq_len * d + d];
            let value = x1[0] as f64 - x1[1] as f64;
            (value > 0.0) == (set.clean_labels[i] > 0.0)
        })
        .count();
    right as f64 / set.num_samples as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_basis_is_orthonormal() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let d = 12;
        let q = random_basis(d, &mut rng);
        for a in 0..d {
            for b in 0..d {
                let dot: f64 = (0..d).map(|k| q[a * d + k] * q[b * d + k]).sum();
                let want = if a == b { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-12, "{a},{b}: {dot}");
            }
        }
    }

    /// Tokens with a mean per position and an anisotropic spread (scales 0.1 to 3 by coordinate).
    fn skewed_rows(samples: usize, length: usize, dim: usize, seed: u64) -> LayerRows {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let values: Vec<f32> = (0..samples * length * dim)
            .map(|k| {
                let (p, j) = ((k / dim) % length, k % dim);
                let g: f32 = rng.sample(StandardNormal);
                5.0 * p as f32 + (0.1 + 2.9 * j as f32 / dim as f32) * g
            })
            .collect();
        let values = candle_core::Tensor::from_vec(
            values,
            (samples, length, dim),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        LayerRows::from_padded(&values, vec![length; samples]).unwrap()
    }

    #[test]
    fn drawn_noise_is_centred_with_trace_d_and_no_direction_favoured() {
        let (dim, length) = (16, 12);
        let pool = skewed_rows(400, length, dim, 1);
        let rows = skewed_rows(300, length, dim, 2);
        let basis = NoiseBasis::fit(&pool, 7).unwrap();
        let noise = basis
            .draw(&rows, 300, &mut ChaCha8Rng::seed_from_u64(3))
            .unwrap();
        let tokens = noise.len() / dim;
        assert_eq!(tokens, 300 * SEQ_LEN);
        let mean: f64 = noise.iter().map(|&v| v as f64).sum::<f64>() / tokens as f64;
        let square: f64 = noise.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / tokens as f64;
        assert!(mean.abs() < 0.2, "position means removed: {mean}");
        assert!(
            (square / dim as f64 - 1.0).abs() < 0.05,
            "tr Σ̂ = d: {square}"
        );
        // The basis spreads the skewed spread: e₁ and e₂ carry about tr/d each, not 0.1² or 3².
        for j in [0, 1] {
            let v: f64 = (0..tokens)
                .map(|t| (noise[t * dim + j] as f64).powi(2))
                .sum::<f64>()
                / tokens as f64;
            assert!(v > 0.2 && v < 3.0, "coordinate {j}: variance {v}");
        }
        // Samples shorter than T are passed over, and too few of them are an error.
        let short = skewed_rows(10, SEQ_LEN - 1, dim, 4);
        let err = basis
            .draw(&short, 1, &mut ChaCha8Rng::seed_from_u64(5))
            .unwrap_err();
        assert!(err.to_string().contains("at least 8 tokens"), "{err}");
    }

    #[test]
    fn the_plant_is_balanced_and_flips_its_share_of_each_class() {
        let (n, d) = (40, 5);
        let noise = vec![0.0; n * SEQ_LEN * d];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let set = plant(noise, d, (0.1, 3.0), 0.2, &mut rng);
        let positives = set.clean_labels.iter().filter(|&&y| y > 0.0).count();
        assert_eq!(positives, n / 2);
        assert_eq!(set.noisy_mask.iter().filter(|&&f| f).count(), 8);
        // The labels do not follow the samples' order (the real data's may follow its classes).
        assert!(set.clean_labels[..n / 2].iter().any(|&y| y < 0.0));
        // Without noise the relevant token gives every clean label.
        assert_eq!(relevant_token_ceiling(&set), 1.0);
        let i = set.clean_labels.iter().position(|&y| y > 0.0).unwrap();
        assert_eq!(set.token(i, 0)[0], 3.0);
        assert!((set.token(i, 2)[1] - 0.3).abs() < 1e-6);
    }
}
