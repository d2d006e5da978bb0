//! A planted class signal on real tokens: the calibration that the SNR estimate
//! ([`super::snr`]) must pass where real SNRs lie (docs/design.md, "A planted signal").
//!
//! The tokens of a real fine-tune set are the noise; the labels are replaced by K balanced
//! classes; class c's signal μ_c, of norm S·√tr Σ̂ (Σ̂ the tokens' covariance around their
//! position's mean, so that S is the paper's ‖μ‖ / (σ_ε √d)) along K orthonormal random
//! directions, is added to one token per sample at a random position. The estimate, given a
//! classifier that knows the classes, should read S back. This module draws the plant and the
//! classifier; `train::snr_plant` runs it on a run's tokens.

use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

/// A plant's class signals: K orthonormal random directions; the norm is the caller's, so that
/// one draw serves every S of a recovery curve.
#[derive(Clone, Debug)]
pub struct ClassSignals {
    /// K orthonormal directions of width d, row-major.
    directions: Vec<f64>,
    pub classes: usize,
    pub dim: usize,
}

impl ClassSignals {
    pub fn new(classes: usize, dim: usize, seed: u64) -> Self {
        assert!(
            classes >= 2 && classes <= dim,
            "{classes} classes in width {dim}"
        );
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        Self {
            directions: orthonormal(classes, dim, &mut rng),
            classes,
            dim,
        }
    }

    /// Class `class`'s signal at norm `norm`.
    pub fn signal(&self, class: usize, norm: f64) -> Vec<f32> {
        self.directions[class * self.dim..(class + 1) * self.dim]
            .iter()
            .map(|&u| (u * norm) as f32)
            .collect()
    }
}

/// Which samples carry which class where: balanced classes (sizes differ by at most one) and a
/// position uniform over each sample's unpadded tokens.
#[derive(Clone, Debug)]
pub struct PlantDraw {
    pub labels: Vec<usize>,
    pub positions: Vec<usize>,
}

impl PlantDraw {
    pub fn new(lengths: &[usize], classes: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut labels: Vec<usize> = (0..lengths.len()).map(|i| i % classes).collect();
        labels.shuffle(&mut rng);
        let positions = lengths
            .iter()
            .map(|&length| rng.random_range(0..length.max(1)))
            .collect();
        Self { labels, positions }
    }
}

/// `count` orthonormal vectors of width `dim` (Gram–Schmidt on Gaussian draws), row-major.
fn orthonormal(count: usize, dim: usize, rng: &mut ChaCha8Rng) -> Vec<f64> {
    let mut basis: Vec<f64> = Vec::with_capacity(count * dim);
    while basis.len() < count * dim {
        let mut v: Vec<f64> = (0..dim).map(|_| rng.sample(StandardNormal)).collect();
        for b in basis.chunks_exact(dim) {
            let dot: f64 = v.iter().zip(b).map(|(x, y)| x * y).sum();
            v.iter_mut().zip(b).for_each(|(x, y)| *x -= dot * y);
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm > 1e-6 {
            basis.extend(v.iter().map(|x| x / norm));
        }
    }
    basis
}

/// A nearest-class-mean classifier: logit_c(x) = m_cᵀ x − ‖m_c‖² / 2, m_c the mean of class c's
/// planted tokens in a set held apart from the one measured. It stands for a phase 1 fitted on
/// the planted classes: it knows the signal's directions, no better than its fit set does.
#[derive(Clone, Debug)]
pub struct NearestMean {
    means: Vec<f64>,
    offsets: Vec<f64>,
    dim: usize,
}

impl NearestMean {
    /// Fitted on `tokens` (one per sample, n × d) with `labels` in `classes` classes.
    pub fn fit(tokens: &[f32], labels: &[usize], classes: usize, dim: usize) -> Self {
        let mut means = vec![0f64; classes * dim];
        let mut counts = vec![0usize; classes];
        for (token, &c) in tokens.chunks_exact(dim).zip(labels) {
            counts[c] += 1;
            for (m, &v) in means[c * dim..(c + 1) * dim].iter_mut().zip(token) {
                *m += v as f64;
            }
        }
        for (c, &count) in counts.iter().enumerate() {
            means[c * dim..(c + 1) * dim]
                .iter_mut()
                .for_each(|m| *m /= count.max(1) as f64);
        }
        let offsets = means
            .chunks_exact(dim)
            .map(|m| m.iter().map(|v| v * v).sum::<f64>() / 2.0)
            .collect();
        Self {
            means,
            offsets,
            dim,
        }
    }

    /// The classifier that knows the signals exactly: m_c = μ_c (the oracle arm of the
    /// calibration, which leaves the selection of the token as the estimate's only limit).
    pub fn exact(signals: &ClassSignals, norm: f64) -> Self {
        let means: Vec<f64> = (0..signals.classes)
            .flat_map(|c| signals.signal(c, norm))
            .map(f64::from)
            .collect();
        let offsets = means
            .chunks_exact(signals.dim)
            .map(|m| m.iter().map(|v| v * v).sum::<f64>() / 2.0)
            .collect();
        Self {
            means,
            offsets,
            dim: signals.dim,
        }
    }

    /// The logits of every token of `tokens` (m × d), m × K row-major.
    pub fn logits(&self, tokens: &[f32]) -> Vec<f32> {
        tokens
            .chunks_exact(self.dim)
            .flat_map(|x| {
                self.means
                    .chunks_exact(self.dim)
                    .zip(&self.offsets)
                    .map(move |(m, offset)| {
                        let dot: f64 = m.iter().zip(x).map(|(a, &b)| a * b as f64).sum();
                        (dot - offset) as f32
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draw_is_balanced_orthonormal_and_within_each_sample() {
        let lengths: Vec<usize> = (0..101).map(|i| 1 + i % 7).collect();
        let draw = PlantDraw::new(&lengths, 3, 5);
        let mut sizes = [0usize; 3];
        draw.labels.iter().for_each(|&c| sizes[c] += 1);
        assert_eq!(sizes, [34, 34, 33]);
        assert!(draw.positions.iter().zip(&lengths).all(|(&p, &l)| p < l));
        assert_eq!(draw.labels, PlantDraw::new(&lengths, 3, 5).labels);
        let signals = ClassSignals::new(3, 16, 5);
        for a in 0..3 {
            for b in 0..3 {
                let dot: f64 = signals
                    .signal(a, 1.0)
                    .iter()
                    .zip(signals.signal(b, 1.0))
                    .map(|(&x, y)| x as f64 * y as f64)
                    .sum();
                assert!(
                    (dot - f64::from(u8::from(a == b))).abs() < 1e-6,
                    "{a} {b} {dot}"
                );
            }
        }
        let signal = signals.signal(1, 3.0);
        let norm = signal
            .iter()
            .map(|&v| (v as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!((norm - 3.0).abs() < 1e-5);
    }

    #[test]
    fn the_nearest_mean_classifier_prefers_its_own_class() {
        let means = [[2.0f32, 0.0], [0.0, 2.0]];
        let tokens: Vec<f32> = means.iter().flatten().copied().collect();
        let classifier = NearestMean::fit(&tokens, &[0, 1], 2, 2);
        let logits = classifier.logits(&[1.9, 0.1, 0.1, 1.9]);
        assert!(logits[0] > logits[1] && logits[3] > logits[2], "{logits:?}");
    }
}
