//! The signal-to-noise ratio of a set of tokens, as the paper's theorem uses it (docs/protocol.md §2):
//! SNR = ‖μ‖ / (σ_ε √d), and the regime is set by n·SNR². On the synthetic data μ and σ_ε are
//! known; on real tokens they are estimated here from the set's own tokens and clean labels, and
//! held to what the same tokens give when the labels carry nothing.
//!
//! The rule (docs/design.md, "The SNR of real tokens"):
//! 1. Each sample's **relevant token** is the one the classifier is most confident about, whatever
//!    the class: the highest log-softmax of any class. The sample's label takes no part in the
//!    choice, so the choice cannot make the classes differ where the tokens do not: chosen by the
//!    label's own score, tokens of pure noise read an SNR of 0.2 at ViT-Ti's shapes. A token whose
//!    scores are −∞ or NaN (padding) takes no part anywhere.
//! 2. The **noise** σ_ε √d is the root-mean-square distance of the relevant tokens from their class
//!    mean, pooled over classes with n − K degrees of freedom (unbiased for tr Σ = σ_ε² d whatever
//!    the covariance). The other tokens' spread around their own mean is reported beside it.
//! 3. The **class signal** is the between-class scatter of the relevant tokens, Σ_c n_c ‖m_c − m̄‖²
//!    (m̄ the mean of all), less what the noise alone gives it, (K − 1) tr Σ (from step 2). With K
//!    classes whose signals are orthogonal and of one norm, as in the paper's model, the scatter
//!    of the signals is n (1 − Σ_c w_c²) ‖μ‖² (w_c = n_c / n, 1 − 1/K when balanced): dividing by
//!    that recovers ‖μ‖². Each class weighs by its size, so a class of two samples adds two
//!    samples' worth of noise, not a K-th of the estimate's. This is the **raw** n·SNR².
//! 4. The **floor**: the same estimate with the labels permuted ([`PERMUTATIONS`] times, the
//!    relevant tokens unchanged since their choice did not use the labels). Its mean is what the
//!    estimate reads where the labels carry nothing; the **calibrated** n·SNR² is raw − floor (at
//!    least 0), with a percentile interval over [`RESAMPLES`] bootstrap draws of the samples, and
//!    the permutation p-value says whether the raw value rises above the floor at all; where it
//!    does not (p > 0.01), the calibrated value is 0 and the interval's upper end is what could
//!    hide below the floor.
//! 5. The **effective dimension** of the noise, (tr Σ)² / tr Σ² of the other tokens' scatter
//!    around their position's mean (each trace estimated without bias), is reported beside d: it
//!    is d for isotropic noise and less where the variance sits in a few directions. The other
//!    tokens, not the relevant ones: choosing a token for the classifier's confidence picks
//!    tokens that stand out along its directions, which would narrow the relevant ones' scatter.

use nalgebra::DMatrix;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The version of the rule above. Estimates without it (1) chose each token by its label's score;
/// 2 weighed every class alike in step 3. Both are read as absent.
pub const ESTIMATOR: u32 = 3;

/// Label permutations behind the floor and the p-value.
pub const PERMUTATIONS: usize = 1000;

/// Bootstrap draws of the samples behind the calibrated value's interval.
pub const RESAMPLES: usize = 200;

/// A p-value at or below this says the signal rises above the floor. Strict, because a set that
/// passes by chance would print a value of at least the floor's 99th percentile as if it were
/// signal (n·SNR² ≈ 3–4 at T 197, d 192, whatever n).
pub const SIGNIFICANCE: f64 = 0.01;

/// The permutations' and resamples' stream: fixed, so an estimate is a function of its tokens.
const CALIBRATION_SEED: u64 = 0x5eed_5a12;

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

/// No estimate from tokens of a real backbone comes near this: larger is an edit, not a measure
/// (and would overflow the report's spread over seeds).
pub const MAX_N_SNR2: f64 = 1e12;

/// What the labels permuted give: the estimate's reading where there is no signal.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Floor {
    /// Mean n·SNR² over the permutations.
    pub mean: f64,
    /// Its 95th percentile.
    pub q95: f64,
    pub permutations: usize,
}

/// What the estimate found, with its parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnrEstimate {
    /// The rule's version ([`ESTIMATOR`]); 1 for estimates written before it was recorded.
    #[serde(default = "first_rule")]
    pub estimator: u32,
    /// Samples used (n in n·SNR²).
    pub samples: usize,
    /// Classes with at least one sample.
    pub classes: usize,
    pub embed_dim: usize,
    /// (tr Σ)² / tr Σ² of the relevant tokens' within-class noise (step 5); JSON writes NaN (too
    /// few samples) as null.
    #[serde(default, deserialize_with = "crate::io::nan_if_null")]
    pub effective_dim: f64,
    /// Mean tokens per sample (padding left out): T of the paper's model, for a synthetic twin.
    pub mean_tokens: f64,
    /// The calibrated ‖μ‖: √(n·SNR² / n) · σ_ε √d.
    pub signal_norm: f64,
    /// σ_ε √d from the relevant tokens (step 2).
    pub noise_norm: f64,
    /// The same spread for every other (unpadded) token around their mean, for comparison.
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub other_noise_norm: f64,
    /// √tr Σ̂ of the other tokens around their *position's* mean: the noise without what every
    /// token of a position shares (a position embedding, the CLS token's own offset), which the
    /// relevant tokens' spread holds wherever the relevant position varies between samples.
    /// `signal_norm / position_noise_norm` is the SNR on this σ (docs/design.md, "Which σ");
    /// absent (null) in estimates made before it was recorded.
    #[serde(default = "not_recorded", deserialize_with = "crate::io::nan_if_null")]
    pub position_noise_norm: f64,
    /// Cohen's κ of the classes the classifier is confident of at the chosen tokens against the
    /// labels ([`selection_kappa`]): the share of relevant tokens found, as the data tell it.
    #[serde(default = "not_recorded", deserialize_with = "crate::io::nan_if_null")]
    pub selection_kappa: f64,
    /// The calibrated SNR, √(n·SNR² / n).
    pub snr: f64,
    /// The calibrated n·SNR²: raw less the floor's mean, at least 0; 0 where the raw value does
    /// not rise above the floor (p > [`SIGNIFICANCE`]).
    pub n_snr2: f64,
    /// The 2.5–97.5 % bootstrap interval of raw less the floor's mean, the draws centred on the
    /// raw value (each end at least 0).
    #[serde(default)]
    pub n_snr2_interval: [f64; 2],
    /// Step 3's value on the real labels, before the floor is taken off (may be below 0).
    #[serde(default)]
    pub raw_n_snr2: f64,
    #[serde(default)]
    pub floor: Floor,
    /// Share of permutations whose n·SNR² reaches the raw value (with the real labels counted
    /// as one of them).
    #[serde(default = "one")]
    pub p_value: f64,
    /// The position most often relevant, and the share of samples for which it is.
    pub modal_position: usize,
    pub modal_share: f64,
}

fn not_recorded() -> f64 {
    f64::NAN
}

fn first_rule() -> u32 {
    1
}

fn one() -> f64 {
    1.0
}

/// How many selection limits above the limit the estimate is validated: on the committed
/// planted-signal curve (results/snr-plant, every Table 2 dataset in both modes at n 200 and
/// 1000) every point at S ≥ 2·S* reads S back within ±20 % (worst −19 %), and points between S*
/// and 2·S* miss by up to −100 %.
pub const VALIDATED_FROM_LIMITS: f64 = 2.0;

/// The **selection limit** S* = √(2 ln(T − 1) / d) of tokens T per sample and width d: the SNR
/// below which a class signal in one token of T is not the sample's most prominent token, so
/// that no rule choosing one token per sample (this estimate's step 1, a phase 2 that attends to
/// one token) can find it reliably. Along a direction u the noise of a token has variance uᵀΣu,
/// tr Σ / d on average over directions, and the largest of T − 1 such projections approaches
/// √(2 ln(T − 1))·√(tr Σ / d) from below (0.8 of it at T 197); the relevant token's
/// ‖μ‖ = S·√tr Σ must stand above it. ViT-Ti's 197
/// tokens of width 192: 0.234; MiniLM's ~50 of width 384: 0.14. NaN below two tokens.
pub fn selection_limit(mean_tokens: f64, embed_dim: usize) -> f64 {
    if mean_tokens < 2.0 || embed_dim == 0 {
        return f64::NAN;
    }
    (2.0 * (mean_tokens - 1.0).ln() / embed_dim as f64).sqrt()
}

impl SnrEstimate {
    /// Made by today's rule (older estimates are read as absent).
    pub fn is_current(&self) -> bool {
        self.estimator == ESTIMATOR
    }

    /// [`selection_limit`] at this estimate's T and d.
    pub fn selection_limit(&self) -> f64 {
        selection_limit(self.mean_tokens, self.embed_dim)
    }

    /// Why this cannot be an estimate the rule made (a summary edited by hand), if it cannot:
    /// every number finite, the calibrated value raw less the floor where p ≤
    /// [`SIGNIFICANCE`] and 0 elsewhere, its interval ordered and non-negative, the SNR the
    /// calibrated value's root over n, p a share of permutations.
    pub fn contradiction(&self) -> Option<String> {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
        let numbers = [
            self.n_snr2,
            self.n_snr2_interval[0],
            self.n_snr2_interval[1],
            self.raw_n_snr2,
            self.floor.mean,
            self.floor.q95,
            self.snr,
        ];
        let calibrated = if self.above_floor() {
            (self.raw_n_snr2 - self.floor.mean).max(0.0)
        } else {
            0.0
        };
        let [low, high] = self.n_snr2_interval;
        let checks = [
            (
                numbers
                    .iter()
                    .all(|v| v.is_finite() && v.abs() <= MAX_N_SNR2),
                format!("a value that is not finite or beyond ±{MAX_N_SNR2:e}"),
            ),
            (self.samples >= 2, "samples below 2".to_string()),
            (
                close(self.n_snr2, calibrated),
                format!(
                    "n_snr2 {} is not the raw value less the floor's mean ({calibrated}, 0 when p > {SIGNIFICANCE})",
                    self.n_snr2
                ),
            ),
            (
                0.0 <= low && low <= high,
                "n_snr2_interval is not an ordered pair of non-negative ends".to_string(),
            ),
            (
                close(self.snr, (self.n_snr2 / self.samples as f64).sqrt()),
                "snr is not √(n_snr2 / samples)".to_string(),
            ),
            (
                self.p_value > 0.0 && self.p_value <= 1.0,
                "p_value outside (0, 1]".to_string(),
            ),
        ];
        checks
            .into_iter()
            .find(|(holds, _)| !holds)
            .map(|(_, why)| why)
    }

    /// Whether the signal rises above the floor (p ≤ [`SIGNIFICANCE`]).
    pub fn above_floor(&self) -> bool {
        self.p_value <= SIGNIFICANCE
    }

    /// The calibrated value as a reader should take it: a number with its interval where the
    /// signal rises above the floor, else that it does not and the most it could be.
    pub fn headline(&self) -> String {
        let [low, high] = self.n_snr2_interval;
        let parts = format!(
            "raw {:.3}, floor {:.3}, q95 {:.3}, p {:.3}",
            self.raw_n_snr2, self.floor.mean, self.floor.q95, self.p_value
        );
        if self.above_floor() {
            format!("n·SNR² {:.3} [{low:.3}, {high:.3}] ({parts})", self.n_snr2)
        } else {
            format!("n·SNR² not above its floor, at most {high:.3} ({parts})")
        }
    }
}

/// The position whose logits (`token_logits`, T × K row-major for one sample) give the highest
/// softmax probability of any class: the token the classifier is most confident about. Rows with a
/// non-finite logit (padding) never, and `None` when every row has one.
pub fn confident_position(token_logits: &[f32], classes: usize) -> Option<usize> {
    confident_choice(token_logits, classes).map(|(position, _)| position)
}

/// [`confident_position`] with the class the classifier is confident of there.
pub fn confident_choice(token_logits: &[f32], classes: usize) -> Option<(usize, usize)> {
    token_logits
        .chunks_exact(classes)
        .enumerate()
        .filter_map(|(position, logits)| confidence(logits).map(|c| (position, c, logits)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(position, _, logits)| {
            let class = logits
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(c, _)| c);
            (position, class)
        })
}

/// Cohen's κ between the classes the classifier is confident of at the chosen tokens and the
/// labels: the share of samples whose chosen token carries their class beyond what chance
/// agreement gives. Under the paper's model (one relevant token, the others label-free noise) a
/// missed sample's chosen token agrees with its label by chance only, so κ estimates the share
/// of relevant tokens found, which scales the class means and so the SNR read (docs/design.md,
/// "A planted signal"). NaN without predictions.
pub fn selection_kappa(predicted: &[usize], labels: &[usize]) -> f64 {
    let n = labels.len();
    if predicted.len() != n || n == 0 {
        return f64::NAN;
    }
    let classes = labels.iter().chain(predicted).max().map_or(0, |&c| c + 1);
    let (mut label_counts, mut predicted_counts) = (vec![0f64; classes], vec![0f64; classes]);
    let mut agree = 0usize;
    for (&p, &y) in predicted.iter().zip(labels) {
        label_counts[y] += 1.0;
        predicted_counts[p] += 1.0;
        agree += usize::from(p == y);
    }
    let chance: f64 = label_counts
        .iter()
        .zip(&predicted_counts)
        .map(|(a, b)| a * b)
        .sum::<f64>()
        / (n * n) as f64;
    if chance >= 1.0 {
        return f64::NAN;
    }
    (agree as f64 / n as f64 - chance) / (1.0 - chance)
}

/// How sure the classifier is of its top class, as the log-odds log p_top − log(1 − p_top) =
/// top logit − logsumexp of the others: the same order as the top softmax probability, without
/// the probability's rounding to 1 (which would tie every clear token); `None` for a row with a
/// non-finite logit.
fn confidence(logits: &[f32]) -> Option<f64> {
    if logits.iter().any(|v| !v.is_finite()) || logits.is_empty() {
        return None;
    }
    let (top_index, &top) = logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))?;
    let others = logits
        .iter()
        .enumerate()
        .filter(|&(c, _)| c != top_index)
        .map(|(_, &v)| v as f64);
    let largest = others.clone().fold(f64::NEG_INFINITY, f64::max);
    if largest == f64::NEG_INFINITY {
        return Some(0.0);
    }
    let rest = largest + others.map(|v| (v - largest).exp()).sum::<f64>().ln();
    Some(top as f64 - rest)
}

/// What the estimate needs of the tokens that are not relevant, gathered one token at a time:
/// their spread around their mean (step 2's comparison) and their scatter around their position's
/// mean (step 5).
#[derive(Clone, Debug)]
pub struct OtherTokens {
    count: usize,
    sum: Vec<f64>,
    squared_norms: f64,
    /// Per position: how many tokens and their sum (position p at p·d).
    position_counts: Vec<usize>,
    position_sums: Vec<f64>,
    /// Σ x xᵀ (d × d) of the tokens folded in so far, and the rows waiting to be folded.
    second_moment: DMatrix<f64>,
    pending: Vec<f64>,
}

/// Tokens gathered before they are folded into the second moment in one product.
const FOLD_ROWS: usize = 512;

impl OtherTokens {
    pub fn new(embed_dim: usize) -> Self {
        Self {
            count: 0,
            sum: vec![0.0; embed_dim],
            squared_norms: 0.0,
            position_counts: Vec::new(),
            position_sums: Vec::new(),
            second_moment: DMatrix::zeros(embed_dim, embed_dim),
            pending: Vec::with_capacity(FOLD_ROWS * embed_dim),
        }
    }

    /// Adds the token at `position` of its sample.
    pub fn add(&mut self, position: usize, token: &[f32]) {
        let d = self.sum.len();
        self.count += 1;
        add(&mut self.sum, token);
        self.squared_norms += token.iter().map(|&v| (v as f64).powi(2)).sum::<f64>();
        if self.position_counts.len() <= position {
            self.position_counts.resize(position + 1, 0);
            self.position_sums.resize((position + 1) * d, 0.0);
        }
        self.position_counts[position] += 1;
        add(
            &mut self.position_sums[position * d..(position + 1) * d],
            token,
        );
        self.pending.extend(token.iter().map(|&v| v as f64));
        if self.pending.len() >= FOLD_ROWS * d {
            self.fold();
        }
    }

    fn fold(&mut self) {
        let d = self.sum.len();
        if self.pending.is_empty() {
            return;
        }
        // Row-major rows read as the columns of a d × rows matrix B: Σ x xᵀ += B Bᵀ.
        let rows = DMatrix::from_column_slice(d, self.pending.len() / d, &self.pending);
        self.second_moment += &rows * rows.transpose();
        self.pending.clear();
    }

    /// Root-mean-square distance from their mean (n − 1 degrees of freedom).
    fn spread(&self) -> f64 {
        if self.count < 2 {
            return f64::NAN;
        }
        let mean2: f64 = self.sum.iter().map(|s| s * s).sum::<f64>() / self.count as f64;
        ((self.squared_norms - mean2).max(0.0) / (self.count - 1) as f64).sqrt()
    }

    /// Step 5: (tr Σ)² / tr Σ² of the tokens' scatter around their position's mean (what every
    /// token of a position shares is not noise), each trace estimated without bias for Gaussian
    /// noise (tr S² overstates tr Σ² by about (tr Σ)² / m at m degrees of freedom); between 1
    /// and d, NaN with too few tokens.
    pub fn effective_dim(&mut self) -> f64 {
        match self.position_covariance() {
            Some((covariance, m)) => unbiased_effective_dim(&covariance, m),
            None => f64::NAN,
        }
    }

    /// The tokens' covariance around their position's mean (d × d), with its degrees of freedom
    /// (tokens less positions); `None` with too few tokens. What [`Self::effective_dim`] reads,
    /// and the Σ̂ of a token-noise dose or a planted signal.
    pub fn position_covariance(&mut self) -> Option<(DMatrix<f64>, f64)> {
        self.fold();
        let d = self.sum.len();
        let positions = self.position_counts.iter().filter(|&&c| c > 0).count();
        if self.count <= positions + 1 {
            return None;
        }
        let mut scatter = self.second_moment.clone();
        for (p, &count) in self.position_counts.iter().enumerate() {
            if count > 0 {
                let sum = DMatrix::from_column_slice(d, 1, &self.position_sums[p * d..(p + 1) * d]);
                scatter -= &sum * sum.transpose() / count as f64;
            }
        }
        let m = (self.count - positions) as f64;
        scatter /= m;
        Some((scatter, m))
    }
}

/// (tr Σ)² / tr Σ² from a scatter matrix S with m degrees of freedom, tr Σ² estimated as
/// m² / ((m − 1)(m + 2)) · (tr S² − (tr S)² / m); clamped to [1, d].
fn unbiased_effective_dim(scatter: &DMatrix<f64>, m: f64) -> f64 {
    let d = scatter.nrows() as f64;
    let trace = scatter.trace();
    let trace_square = scatter.iter().map(|v| v * v).sum::<f64>();
    let unbiased_square = m * m / ((m - 1.0) * (m + 2.0)) * (trace_square - trace * trace / m);
    if unbiased_square <= 0.0 {
        return d;
    }
    (trace * trace / unbiased_square).clamp(1.0, d)
}

/// Estimates the SNR of `tokens` with clean `labels` (class indices) and the classifier's logits
/// of every token (`token_logits`, n × T × `classes`).
pub fn estimate(
    tokens: Tokens,
    labels: &[usize],
    token_logits: &[f32],
    classes: usize,
) -> Result<SnrEstimate, String> {
    let (n, t, d) = (tokens.num_samples, tokens.seq_len, tokens.embed_dim);
    if tokens.values.len() != n * t * d
        || labels.len() != n
        || classes == 0
        || token_logits.len() != n * t * classes
    {
        return Err(format!(
            "SNR estimate: {} token values, {} labels and {} logits do not fit {n} samples of {t} tokens of width {d} and {classes} classes",
            tokens.values.len(),
            labels.len(),
            token_logits.len()
        ));
    }
    let mut relevant = Vec::with_capacity(n * d);
    let mut positions = Vec::with_capacity(n);
    let mut predicted = Vec::with_capacity(n);
    let mut others = OtherTokens::new(d);
    for (i, logits) in token_logits.chunks_exact(t * classes).enumerate() {
        let (position, class) = confident_choice(logits, classes)
            .ok_or_else(|| format!("SNR estimate: sample {i} has no token to score"))?;
        relevant.extend_from_slice(tokens.token(i, position));
        positions.push(position);
        predicted.push(class);
        let usable = |p: usize| confidence(&logits[p * classes..(p + 1) * classes]).is_some();
        for other in (0..t).filter(|&p| p != position && usable(p)) {
            others.add(other, tokens.token(i, other));
        }
    }
    estimate_from(&relevant, d, labels, (&positions, &predicted), &mut others)
}

/// Steps 2–5 from each sample's relevant token (`relevant`, n × d), the positions they were at
/// and the other tokens' statistics: what [`estimate`] computes, for callers that stream their
/// tokens instead of holding them all.
pub fn estimate_from(
    relevant: &[f32],
    embed_dim: usize,
    labels: &[usize],
    (positions, predicted): (&[usize], &[usize]),
    others: &mut OtherTokens,
) -> Result<SnrEstimate, String> {
    let (n, d) = (labels.len(), embed_dim);
    if relevant.len() != n * d || positions.len() != n || others.sum.len() != d {
        return Err(format!(
            "SNR estimate: {} relevant values and {} positions do not fit {n} samples of width {d}",
            relevant.len(),
            positions.len()
        ));
    }
    let set = Relevant::new(relevant, d);
    let all: Vec<usize> = (0..n).collect();
    let raw = set.moments(&all, labels).ok_or_else(|| {
        let k = count_classes(labels);
        format!(
            "SNR estimate: needs two classes and more samples than classes, got {n} samples in {k} classes"
        )
    })?;
    let raw_n_snr2 = raw.n_snr2(n);
    let mut rng = ChaCha8Rng::seed_from_u64(CALIBRATION_SEED);
    let floor_values = permutation_floor(&set, labels, &mut rng);
    let floor_mean = mean(&floor_values);
    let reaching = floor_values.iter().filter(|&&v| v >= raw_n_snr2).count();
    let p_value = (1 + reaching) as f64 / (1 + floor_values.len()) as f64;
    // Below the floor's reach the number would be the floor's own scatter: it reads 0, and the
    // interval's upper end says how much signal could hide there.
    let calibrated = if p_value <= SIGNIFICANCE {
        (raw_n_snr2 - floor_mean).max(0.0)
    } else {
        0.0
    };
    let resampled = bootstrap(&set, labels, &mut rng);
    // A draw with replacement repeats samples, which the correction for the noise of the means
    // does not see: the draws sit above the raw value by about that noise (n·SNR² ≈ K). Their
    // spread is kept and their centre moved to the raw value. A set so small that no draw keeps
    // two classes has no interval but its point.
    let interval = if resampled.is_empty() {
        [calibrated, calibrated]
    } else {
        let centre = quantile(&resampled, 0.5);
        let end = |q: f64| (raw_n_snr2 + quantile(&resampled, q) - centre - floor_mean).max(0.0);
        [end(0.025), end(0.975)]
    };
    let snr = (calibrated / n as f64).sqrt();
    let noise_norm = raw.noise2.sqrt();
    let (effective_dim, position_noise_norm) = position_noise(others);
    let selection_kappa = selection_kappa(predicted, labels);
    let (modal_position, modal_share) = modal(positions);
    Ok(SnrEstimate {
        estimator: ESTIMATOR,
        samples: n,
        classes: raw.classes,
        embed_dim: d,
        effective_dim,
        // Every sample has its relevant token; the rest were gathered as others.
        mean_tokens: (n + others.count) as f64 / n as f64,
        signal_norm: snr * noise_norm,
        noise_norm,
        other_noise_norm: others.spread(),
        position_noise_norm,
        selection_kappa,
        snr,
        n_snr2: calibrated,
        n_snr2_interval: interval,
        raw_n_snr2,
        floor: Floor {
            mean: floor_mean,
            q95: quantile(&floor_values, 0.95),
            permutations: floor_values.len(),
        },
        p_value,
        modal_position,
        modal_share,
    })
}

/// Step 6's effective dimension and √tr Σ̂ of the other tokens around their position's mean
/// (NaN both with too few tokens).
fn position_noise(others: &mut OtherTokens) -> (f64, f64) {
    match others.position_covariance() {
        Some((covariance, m)) => (
            unbiased_effective_dim(&covariance, m),
            covariance.trace().max(0.0).sqrt(),
        ),
        None => (f64::NAN, f64::NAN),
    }
}

/// n·SNR² with the labels shuffled, [`PERMUTATIONS`] times.
fn permutation_floor(set: &Relevant, labels: &[usize], rng: &mut ChaCha8Rng) -> Vec<f64> {
    let all: Vec<usize> = (0..labels.len()).collect();
    let mut shuffled = labels.to_vec();
    (0..PERMUTATIONS)
        .filter_map(|_| {
            shuffled.shuffle(rng);
            set.moments(&all, &shuffled).map(|m| m.n_snr2(labels.len()))
        })
        .collect()
}

/// Raw n·SNR² over [`RESAMPLES`] draws of n samples with replacement (draws left with fewer than
/// two classes are skipped).
fn bootstrap(set: &Relevant, labels: &[usize], rng: &mut ChaCha8Rng) -> Vec<f64> {
    let n = labels.len();
    (0..RESAMPLES)
        .filter_map(|_| {
            let draw: Vec<usize> = (0..n).map(|_| rng.random_range(0..n)).collect();
            set.moments(&draw, labels).map(|m| m.n_snr2(n))
        })
        .collect()
}

/// The relevant tokens, n × d, with each one's squared norm.
struct Relevant<'a> {
    values: &'a [f32],
    dim: usize,
    squared_norms: Vec<f64>,
}

/// Steps 2 and 3 on one labelling of a set of samples.
struct LabellingMoments {
    classes: usize,
    signal2: f64,
    noise2: f64,
}

impl LabellingMoments {
    fn n_snr2(&self, n: usize) -> f64 {
        n as f64 * self.signal2 / self.noise2
    }
}

impl<'a> Relevant<'a> {
    fn new(values: &'a [f32], dim: usize) -> Self {
        let squared_norms = values
            .chunks_exact(dim)
            .map(|t| t.iter().map(|&v| (v as f64).powi(2)).sum())
            .collect();
        Self {
            values,
            dim,
            squared_norms,
        }
    }

    fn token(&self, i: usize) -> &'a [f32] {
        &self.values[i * self.dim..(i + 1) * self.dim]
    }

    /// Steps 2 and 3 over the samples `draw` (indices, repeats allowed) labelled by `labels`;
    /// `None` with fewer than two classes or no more samples than classes.
    fn moments(&self, draw: &[usize], labels: &[usize]) -> Option<LabellingMoments> {
        let d = self.dim;
        let num_labels = labels.iter().max().map_or(0, |&c| c + 1);
        let mut counts = vec![0usize; num_labels];
        let mut sums = vec![0f64; num_labels * d];
        let mut squared = 0.0;
        for &i in draw {
            let class = labels[i];
            counts[class] += 1;
            add(&mut sums[class * d..(class + 1) * d], self.token(i));
            squared += self.squared_norms[i];
        }
        let present: Vec<usize> = (0..num_labels).filter(|&c| counts[c] > 0).collect();
        let (n, k) = (draw.len(), present.len());
        if k < 2 || n <= k {
            return None;
        }
        // Step 2: Σ‖x − m_c‖² = Σ‖x‖² − Σ_c ‖S_c‖² / n_c.
        let class_norms: f64 = present
            .iter()
            .map(|&c| norm2(&sums[c * d..(c + 1) * d]) / counts[c] as f64)
            .sum();
        let noise2 = (squared - class_norms).max(0.0) / (n - k) as f64;

        // Step 3: the between-class scatter Σ_c n_c ‖m_c − m̄‖² = Σ_c ‖S_c‖² / n_c − ‖S‖² / n,
        // less its expectation without signal, (K − 1) tr Σ; divided by n (1 − Σ_c w_c²), w_c =
        // n_c / n, which is what the scatter of orthogonal signals of norm ‖μ‖ comes to.
        let mut total = vec![0f64; d];
        for &c in &present {
            for (t, s) in total.iter_mut().zip(&sums[c * d..(c + 1) * d]) {
                *t += s;
            }
        }
        let between = class_norms - norm2(&total) / n as f64;
        let nf = n as f64;
        let concentration: f64 = present
            .iter()
            .map(|&c| (counts[c] as f64 / nf).powi(2))
            .sum();
        let signal2 = (between - (k as f64 - 1.0) * noise2) / (nf * (1.0 - concentration));
        Some(LabellingMoments {
            classes: k,
            signal2,
            noise2,
        })
    }
}

fn count_classes(labels: &[usize]) -> usize {
    let mut seen: Vec<usize> = labels.to_vec();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

fn modal(positions: &[usize]) -> (usize, f64) {
    let width = positions.iter().max().map_or(0, |&p| p + 1);
    let mut position_counts = vec![0usize; width];
    for &p in positions {
        position_counts[p] += 1;
    }
    let (position, count) = position_counts
        .iter()
        .enumerate()
        .max_by_key(|&(p, &c)| (c, std::cmp::Reverse(p)))
        .map(|(p, &c)| (p, c))
        .unwrap_or((0, 0));
    (position, count as f64 / positions.len().max(1) as f64)
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The q-quantile by linear interpolation between order statistics (numpy's default); NaN when
/// there are none.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let position = q * (sorted.len() - 1) as f64;
    let (low, high) = (position.floor() as usize, position.ceil() as usize);
    sorted[low] + (sorted[high] - sorted[low]) * (position - low as f64)
}

fn add(sum: &mut [f64], token: &[f32]) {
    for (s, &v) in sum.iter_mut().zip(token) {
        *s += v as f64;
    }
}

fn norm2(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(values: &[f32], n: usize, t: usize, d: usize) -> Tokens<'_> {
        Tokens {
            values,
            num_samples: n,
            seq_len: t,
            embed_dim: d,
        }
    }

    /// The limit at the two backbones' shapes, and what it stands for: in isotropic Gaussian
    /// noise of width d, the largest of T − 1 tokens' projections on a unit direction sits just
    /// under S*·√tr Σ (√(2 ln m) is the envelope the largest of m normals approaches from
    /// below: its median over draws is 0.75–1 of it at T 197), so a relevant token below the
    /// limit is seldom the most prominent one.
    #[test]
    fn the_selection_limit_is_where_the_largest_noise_token_sits() {
        assert!((selection_limit(197.0, 192) - 0.2340).abs() < 1e-3);
        assert!((selection_limit(50.0, 384) - 0.1423).abs() < 1e-3);
        assert!(selection_limit(1.0, 192).is_nan() && selection_limit(10.0, 0).is_nan());
        use rand_distr::{Distribution, StandardNormal};
        let (t, d) = (197usize, 192usize);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut ratios: Vec<f64> = (0..201)
            .map(|_| {
                // tr Σ = d: the direction's projection of each noise token is N(0, 1).
                let largest = (0..t - 1)
                    .map(|_| StandardNormal.sample(&mut rng))
                    .fold(f64::MIN, f64::max);
                largest / (d as f64).sqrt()
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len() / 2];
        let limit = selection_limit(t as f64, d);
        assert!(
            (0.75..1.0).contains(&(median / limit)),
            "{median} against {limit}"
        );
    }

    /// Two classes on orthogonal axes, no noise beyond a small jitter: ‖μ‖ recovered, far above
    /// the floor.
    #[test]
    fn noiseless_orthogonal_signals_give_their_norm() {
        let (n, t, d) = (40, 3, 4);
        let mut values = vec![0f32; n * t * d];
        let labels: Vec<usize> = (0..n).map(|i| i % 2).collect();
        let mut logits = vec![0f32; n * t * 2];
        for i in 0..n {
            // The signal sits on token 1, on coordinate `label`; a small ± jitter on coordinate 3.
            values[(i * t + 1) * d + labels[i]] = 5.0;
            values[(i * t + 1) * d + 3] = if i / 2 % 2 == 0 { 0.1 } else { -0.1 };
            logits[(i * t + 1) * 2 + labels[i]] = 3.0;
        }
        let estimate = estimate(tokens(&values, n, t, d), &labels, &logits, 2).unwrap();
        assert_eq!((estimate.modal_position, estimate.modal_share), (1, 1.0));
        // Pooled spread 0.1 per sample with n − K degrees of freedom.
        let noise = (n as f64 * 0.01 / (n - 2) as f64).sqrt();
        assert!((estimate.noise_norm - noise).abs() < 1e-6);
        let raw_signal2 = estimate.raw_n_snr2 / n as f64 * noise * noise;
        assert!((raw_signal2 - 25.0).abs() < 0.01, "{raw_signal2}");
        assert!(estimate.p_value < 0.01 && estimate.above_floor());
        assert!(estimate.n_snr2 > 0.9 * estimate.raw_n_snr2);
        assert!(estimate.n_snr2_interval[0] <= estimate.n_snr2);
        assert!(estimate.n_snr2 <= estimate.n_snr2_interval[1]);
        // The other tokens are all zero: no scatter, so no dimension to speak of (clamped to 1..d).
        assert!(estimate.effective_dim >= 1.0 && estimate.effective_dim <= d as f64);
    }

    /// The choice ignores the label: a sample's most confident token is the same whichever class
    /// it is labelled.
    #[test]
    fn the_relevant_token_is_chosen_without_the_label() {
        // Token 0 leans to class 1, token 1 to class 0 more strongly, token 2 is padding.
        let logits = [0.0, 1.0, 2.5, 0.0, f32::NAN, 0.0];
        assert_eq!(confident_position(&logits, 2), Some(1));
        assert_eq!(confident_position(&[f32::NEG_INFINITY, 0.0], 2), None);
        // A common shift of a token's logits changes nothing.
        assert_eq!(confident_position(&[10.0, 11.0, 2.5, 0.0], 2), Some(1));
    }

    #[test]
    fn padding_takes_no_part_and_a_bad_shape_is_named() {
        let values = vec![1f32; 2 * 2 * 2];
        let padded = [f32::NEG_INFINITY, 0.0, f32::NAN, 0.0, 0.0, 1.0, 1.0, 0.0];
        let err = estimate(tokens(&values, 2, 2, 2), &[0, 1], &padded, 2).unwrap_err();
        assert!(err.contains("sample 0 has no token"), "{err}");
        let err = estimate(tokens(&values, 2, 2, 2), &[0], &[0.0; 8], 2).unwrap_err();
        assert!(err.contains("do not fit"), "{err}");
    }

    #[test]
    fn quantiles_interpolate_as_numpy_does() {
        // numpy.quantile([3, 1, 4, 1, 5], [0, 0.25, 0.95, 1]) = 1, 1, 4.8, 5.
        let values = [3.0, 1.0, 4.0, 1.0, 5.0];
        let q = |p| quantile(&values, p);
        assert_eq!((q(0.0), q(0.25), q(1.0)), (1.0, 1.0, 5.0));
        assert!((q(0.95) - 4.8).abs() < 1e-12);
    }

    /// Classes as unequal as TREC's at n 200 (two samples of one, over fifty of another): pure
    /// noise keeps a floor of n·SNR² about 1, not one swollen by the smallest class's mean (each
    /// class weighed alike, the two-sample class alone spread it to ±4).
    #[test]
    fn a_tiny_class_does_not_swell_the_floor() {
        let (d, sizes) = (50, [2usize, 5, 40, 50, 50, 53]);
        let labels: Vec<usize> = sizes
            .iter()
            .enumerate()
            .flat_map(|(c, &size)| std::iter::repeat_n(c, size))
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let relevant: Vec<f32> = (0..labels.len() * d)
            .map(|_| rng.sample::<f32, _>(rand_distr::StandardNormal))
            .collect();
        let positions = vec![0; labels.len()];
        let found = estimate_from(
            &relevant,
            d,
            &labels,
            (&positions, &[]),
            &mut OtherTokens::new(d),
        )
        .unwrap();
        assert!(
            found.floor.q95 < 2.0 && found.floor.mean.abs() < 0.3,
            "{found:?}"
        );
        assert_eq!(found.n_snr2, 0.0, "{found:?}");
    }

    /// The unbiased trace of Σ² gives d for isotropic noise, where the plain one gives about
    /// d / (1 + d/m); a mean per position is not counted as noise.
    #[test]
    fn isotropic_noise_has_its_full_effective_dimension() {
        let (tokens, positions, d) = (400, 4, 50);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut others = OtherTokens::new(d);
        for i in 0..tokens {
            let position = i % positions;
            let token: Vec<f32> = (0..d)
                .map(|j| {
                    let u: f64 = rng.random();
                    let v: f64 = rng.random();
                    let normal = (-2.0 * (1.0 - u).ln()).sqrt() * (std::f64::consts::TAU * v).cos();
                    // Each position's own offset on coordinate `position`.
                    (normal + if j == position { 30.0 } else { 0.0 }) as f32
                })
                .collect();
            others.add(position, &token);
        }
        let effective = others.effective_dim();
        assert!((effective / d as f64 - 1.0).abs() < 0.1, "{effective}");
    }
}
