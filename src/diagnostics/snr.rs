//! The signal-to-noise ratio of a set of tokens, as the paper's theorem uses it (docs/protocol.md §2):
//! SNR = ‖μ‖ / (σ_ε √d), and the regime is set by n·SNR². On the synthetic data μ and σ_ε are
//! known; on real tokens they are estimated here from the set's own tokens and clean labels.
//!
//! The rule (docs/design.md, "The SNR of real tokens"):
//! 1. Each sample's **relevant token** is the one the head scores highest for the sample's clean
//!    class (the caller passes those scores; a token scored −∞ or NaN, such as padding, takes no
//!    part anywhere).
//! 2. The **noise** σ_ε √d is the root-mean-square distance of the relevant tokens from their class
//!    mean, pooled over classes with n − K degrees of freedom (unbiased for tr Σ = σ_ε² d whatever
//!    the covariance). The other tokens' spread around their own mean is reported beside it.
//! 3. The **class signal** μ_c is the class mean of the relevant tokens minus the mean of the class
//!    means. ‖m_c − m̄‖² overstates ‖μ_c − μ̄‖² by the noise of the means, which is subtracted
//!    (exactly, from the pooled noise and the class counts), and with K classes whose signals are
//!    orthogonal and of one norm, as in the paper's model, ‖μ_c − μ̄‖² = (1 − 1/K)‖μ‖²: the
//!    estimate is scaled by K / (K − 1) so that it recovers ‖μ‖ there.
//! 4. SNR = RMS over classes of ‖μ_c‖ / (σ_ε √d), and n·SNR² with n the number of samples.

use serde::{Deserialize, Serialize};

/// n samples of T tokens of width d, row-major (n, T, d).
#[derive(Clone, Copy, Debug)]
pub struct Tokens<'a> {
    pub values: &'a [f32],
    pub num_samples: usize,
    pub seq_len: usize,
    pub embed_dim: usize,
}

impl<'a> Tokens<'a> {
    fn token(&self, sample: usize, position: usize) -> &'a [f32] {
        let start = (sample * self.seq_len + position) * self.embed_dim;
        &self.values[start..start + self.embed_dim]
    }
}

/// What the estimate found, with its parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnrEstimate {
    /// Samples used (n in n·SNR²).
    pub samples: usize,
    /// Classes with at least one sample.
    pub classes: usize,
    pub embed_dim: usize,
    /// Mean tokens per sample (padding left out): T of the paper's model, for a synthetic twin.
    pub mean_tokens: f64,
    /// RMS over classes of ‖μ_c‖, the estimate of the paper's ‖μ‖ (step 3 of the rule).
    pub signal_norm: f64,
    /// σ_ε √d from the relevant tokens (step 2).
    pub noise_norm: f64,
    /// The same spread for every other (unpadded) token around their mean, for comparison.
    pub other_noise_norm: f64,
    pub snr: f64,
    pub n_snr2: f64,
    /// The position most often relevant, and the share of samples for which it is.
    pub modal_position: usize,
    pub modal_share: f64,
}

/// The position `class_scores` (one sample's scores of its tokens for its class) rates highest;
/// −∞ and NaN (padding) never, and `None` when every score is one of those.
pub fn relevant_position(class_scores: &[f32]) -> Option<usize> {
    class_scores
        .iter()
        .enumerate()
        .filter(|(_, s)| usable(**s))
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(position, _)| position)
}

fn usable(score: f32) -> bool {
    !score.is_nan() && score != f32::NEG_INFINITY
}

/// What step 2 needs of the tokens that are not relevant, gathered one token at a time.
#[derive(Clone, Debug)]
pub struct OtherTokens {
    count: usize,
    sum: Vec<f64>,
    squared_norms: f64,
}

impl OtherTokens {
    pub fn new(embed_dim: usize) -> Self {
        Self {
            count: 0,
            sum: vec![0.0; embed_dim],
            squared_norms: 0.0,
        }
    }

    pub fn add(&mut self, token: &[f32]) {
        self.count += 1;
        add(&mut self.sum, token);
        self.squared_norms += token.iter().map(|&v| (v as f64).powi(2)).sum::<f64>();
    }

    /// Root-mean-square distance from their mean (n − 1 degrees of freedom).
    fn spread(&self) -> f64 {
        if self.count < 2 {
            return f64::NAN;
        }
        let mean2: f64 = self.sum.iter().map(|s| s * s).sum::<f64>() / self.count as f64;
        ((self.squared_norms - mean2).max(0.0) / (self.count - 1) as f64).sqrt()
    }
}

/// Estimates the SNR of `tokens` with clean `labels` (class indices) and, per sample, the head's
/// score of each token for that sample's class (`class_scores`, n × T).
pub fn estimate(
    tokens: Tokens,
    labels: &[usize],
    class_scores: &[f32],
) -> Result<SnrEstimate, String> {
    let (n, t, d) = (tokens.num_samples, tokens.seq_len, tokens.embed_dim);
    if tokens.values.len() != n * t * d || labels.len() != n || class_scores.len() != n * t {
        return Err(format!(
            "SNR estimate: {} token values, {} labels and {} scores do not fit {n} samples of {t} tokens of width {d}",
            tokens.values.len(),
            labels.len(),
            class_scores.len()
        ));
    }
    let mut relevant = Vec::with_capacity(n * d);
    let mut positions = Vec::with_capacity(n);
    let mut others = OtherTokens::new(d);
    for (i, scores) in class_scores.chunks_exact(t).enumerate() {
        let position = relevant_position(scores)
            .ok_or_else(|| format!("SNR estimate: sample {i} has no token to score"))?;
        relevant.extend_from_slice(tokens.token(i, position));
        positions.push(position);
        for other in (0..t).filter(|&p| p != position && usable(scores[p])) {
            others.add(tokens.token(i, other));
        }
    }
    estimate_from(&relevant, d, labels, &positions, &others)
}

/// Steps 2–4 from each sample's relevant token (`relevant`, n × d), the positions they were at
/// and the other tokens' statistics: what [`estimate`] computes, for callers that stream their
/// tokens instead of holding them all.
pub fn estimate_from(
    relevant: &[f32],
    embed_dim: usize,
    labels: &[usize],
    positions: &[usize],
    others: &OtherTokens,
) -> Result<SnrEstimate, String> {
    let (n, d) = (labels.len(), embed_dim);
    if relevant.len() != n * d || positions.len() != n || others.sum.len() != d {
        return Err(format!(
            "SNR estimate: {} relevant values and {} positions do not fit {n} samples of width {d}",
            relevant.len(),
            positions.len()
        ));
    }
    let token = |i: usize| &relevant[i * d..(i + 1) * d];
    let num_labels = labels.iter().max().map_or(0, |&c| c + 1);
    let mut counts = vec![0usize; num_labels];
    let mut class_sums = vec![vec![0f64; d]; num_labels];
    for (i, &class) in labels.iter().enumerate() {
        counts[class] += 1;
        add(&mut class_sums[class], token(i));
    }
    let present: Vec<usize> = (0..num_labels).filter(|&c| counts[c] > 0).collect();
    let k = present.len();
    if k < 2 || n <= k {
        return Err(format!(
            "SNR estimate: needs two classes and more samples than classes, got {n} samples in {k} classes"
        ));
    }
    let means: Vec<Vec<f64>> = class_sums
        .iter()
        .zip(&counts)
        .map(|(sum, &count)| sum.iter().map(|v| v / count.max(1) as f64).collect())
        .collect();

    // Step 2: pooled spread of the relevant tokens around their class mean.
    let within: f64 = (0..n)
        .map(|i| squared_distance(token(i), &means[labels[i]]))
        .sum();
    let noise2 = within / (n - k) as f64;

    // Step 3: class signals, less the noise of the means, scaled to the paper's ‖μ‖.
    let kf = k as f64;
    let grand: Vec<f64> = (0..d)
        .map(|j| present.iter().map(|&c| means[c][j]).sum::<f64>() / kf)
        .collect();
    let signal2 = present
        .iter()
        .map(|&c| {
            let raw = squared_distance_f64(&means[c], &grand);
            let others: f64 = present
                .iter()
                .filter(|&&o| o != c)
                .map(|&o| 1.0 / counts[o] as f64)
                .sum();
            let bias = noise2 * ((1.0 - 1.0 / kf).powi(2) / counts[c] as f64 + others / (kf * kf));
            raw - bias
        })
        .sum::<f64>()
        / kf
        * kf
        / (kf - 1.0);
    let signal_norm = signal2.max(0.0).sqrt();
    let noise_norm = noise2.sqrt();
    let snr = signal_norm / noise_norm;

    let width = positions.iter().max().map_or(0, |&p| p + 1);
    let mut position_counts = vec![0usize; width];
    for &p in positions {
        position_counts[p] += 1;
    }
    let (modal_position, modal_count) = position_counts
        .iter()
        .enumerate()
        .max_by_key(|&(p, &c)| (c, std::cmp::Reverse(p)))
        .map(|(p, &c)| (p, c))
        .unwrap_or((0, 0));
    Ok(SnrEstimate {
        samples: n,
        classes: k,
        embed_dim: d,
        // Every sample has its relevant token; the rest were gathered as others.
        mean_tokens: (n + others.count) as f64 / n as f64,
        signal_norm,
        noise_norm,
        other_noise_norm: others.spread(),
        snr,
        n_snr2: n as f64 * snr * snr,
        modal_position,
        modal_share: modal_count as f64 / n as f64,
    })
}

fn add(sum: &mut [f64], token: &[f32]) {
    for (s, &v) in sum.iter_mut().zip(token) {
        *s += v as f64;
    }
}

fn squared_distance(token: &[f32], mean: &[f64]) -> f64 {
    token
        .iter()
        .zip(mean)
        .map(|(&v, m)| (v as f64 - m).powi(2))
        .sum()
}

fn squared_distance_f64(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two classes on orthogonal axes, no noise beyond a tiny jitter: ‖μ‖ recovered exactly.
    #[test]
    fn noiseless_orthogonal_signals_give_their_norm() {
        let (n, t, d) = (8, 3, 4);
        let mut values = vec![0f32; n * t * d];
        let labels: Vec<usize> = (0..n).map(|i| i % 2).collect();
        let mut scores = vec![0f32; n * t];
        for i in 0..n {
            // The signal sits on token 1, on coordinate `label`; a small ± jitter on coordinate 3.
            values[(i * t + 1) * d + labels[i]] = 5.0;
            values[(i * t + 1) * d + 3] = if i / 2 % 2 == 0 { 0.1 } else { -0.1 };
            scores[i * t + 1] = 1.0;
        }
        let estimate = estimate(
            Tokens {
                values: &values,
                num_samples: n,
                seq_len: t,
                embed_dim: d,
            },
            &labels,
            &scores,
        )
        .unwrap();
        assert_eq!((estimate.modal_position, estimate.modal_share), (1, 1.0));
        // Pooled spread 0.1 per sample with n − K = 6 degrees of freedom.
        let noise = (8.0 * 0.01f64 / 6.0).sqrt();
        assert!((estimate.noise_norm - noise).abs() < 1e-6);
        assert!((estimate.signal_norm - (25.0 - noise * noise / 4.0).sqrt()).abs() < 1e-5);
    }

    #[test]
    fn padding_takes_no_part_and_a_bad_shape_is_named() {
        let values = vec![1f32; 2 * 2 * 2];
        let err = estimate(
            Tokens {
                values: &values,
                num_samples: 2,
                seq_len: 2,
                embed_dim: 2,
            },
            &[0, 1],
            &[f32::NEG_INFINITY, f32::NAN, 0.0, 1.0],
        )
        .unwrap_err();
        assert!(err.contains("sample 0 has no token"), "{err}");
        let err = estimate(
            Tokens {
                values: &values,
                num_samples: 2,
                seq_len: 2,
                embed_dim: 2,
            },
            &[0],
            &[0.0; 4],
        )
        .unwrap_err();
        assert!(err.contains("do not fit"), "{err}");
    }
}
