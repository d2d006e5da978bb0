//! The synthetic token distribution of docs/protocol.md §2.1, generated in the authors' order: first the
//! whole noise tensor ε ~ N(0, I_d) in (n, T, d) C order, then the signals, then the label flips.

use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use rand_distr::{StandardNormal, Uniform};

use super::config::SyntheticConfig;
use crate::rng::{Stream, stream};

/// Samples X ∈ R^{T×d} with ±1 labels; tokens are f32 as in the authors' code.
#[derive(Clone, Debug)]
pub struct TokenSet {
    pub num_samples: usize,
    pub seq_len: usize,
    pub embed_dim: usize,
    /// (num_samples, seq_len, embed_dim), row-major.
    pub tokens: Vec<f32>,
    /// Observed labels (±1), after the flips.
    pub labels: Vec<f64>,
    /// Labels the tokens were generated from (±1).
    pub clean_labels: Vec<f64>,
    /// True where the observed label was flipped.
    pub noisy_mask: Vec<bool>,
}

impl TokenSet {
    /// A set whose observed labels are the clean ones with the `noisy_mask` samples flipped.
    pub fn flipped(
        tokens: Vec<f32>,
        (seq_len, embed_dim): (usize, usize),
        clean_labels: Vec<f64>,
        noisy_mask: Vec<bool>,
    ) -> Self {
        let labels = clean_labels
            .iter()
            .zip(&noisy_mask)
            .map(|(&y, &flip)| if flip { -y } else { y })
            .collect();
        Self {
            num_samples: clean_labels.len(),
            seq_len,
            embed_dim,
            tokens,
            labels,
            clean_labels,
            noisy_mask,
        }
    }

    /// The d-vector of token t of sample i.
    pub fn token(&self, i: usize, t: usize) -> &[f32] {
        let start = (i * self.seq_len + t) * self.embed_dim;
        &self.tokens[start..start + self.embed_dim]
    }

    /// ν^T x for every token, (num_samples × seq_len): the value each token contributes when
    /// selected. ν = (μ_{+1} − μ_{−1}) / (‖μ_{+1} − μ_{−1}‖ ‖μ‖) = (e_1 − e_2) / (√2 ‖μ‖).
    pub fn head_values(&self, signal_norm: f64) -> Vec<f64> {
        let scale = 1.0 / (std::f64::consts::SQRT_2 * signal_norm);
        self.tokens
            .chunks_exact(self.embed_dim)
            .map(|x| (x[0] as f64 - x[1] as f64) * scale)
            .collect()
    }

    /// Indices of the flipped samples.
    pub fn noisy_indices(&self) -> Vec<usize> {
        (0..self.num_samples)
            .filter(|&i| self.noisy_mask[i])
            .collect()
    }
}

/// Number of flipped labels: ⌈nη⌉ rounded down to even, half from each class (§2.1).
pub fn flips_per_class(num_samples: usize, noise_ratio: f64) -> usize {
    let k = (num_samples as f64 * noise_ratio).ceil() as usize;
    k / 2
}

/// The distribution a set's samples are drawn from: shapes, signals and the noise's scale.
#[derive(Clone, Copy, Debug)]
pub struct TokenLaw {
    pub seq_len: usize,
    pub embed_dim: usize,
    pub rho: f64,
    pub signal_norm: f64,
    /// σ_ε; the paper's is 1.
    pub noise_std: f64,
}

impl TokenLaw {
    pub fn of(config: &SyntheticConfig) -> Self {
        Self {
            seq_len: config.seq_len,
            embed_dim: config.embed_dim,
            rho: config.rho,
            signal_norm: config.signal_norm,
            noise_std: config.noise_std,
        }
    }
}

/// `CustomDataset` of the authors' `main.py` at σ_ε = 1 (see [`generate_from`]).
pub fn generate(
    num_samples: usize,
    seq_len: usize,
    embed_dim: usize,
    rho: f64,
    signal_norm: f64,
    noise_ratio: f64,
    rng: &mut ChaCha8Rng,
) -> TokenSet {
    let law = TokenLaw {
        seq_len,
        embed_dim,
        rho,
        signal_norm,
        noise_std: 1.0,
    };
    generate_from(&law, num_samples, noise_ratio, rng)
}

/// `CustomDataset` of the authors' `main.py`: balanced labels (first half +1), signals added to
/// x_1 (μ_y), x_2 (ρμ_y) and x_3 (ρμ_{−y}), then the first k/2 samples of each class flipped.
/// The noise is σ_ε times the same N(0, I) draws, so σ_ε = 1 gives [`generate`]'s set exactly.
pub fn generate_from(
    law: &TokenLaw,
    num_samples: usize,
    noise_ratio: f64,
    rng: &mut ChaCha8Rng,
) -> TokenSet {
    let TokenLaw {
        seq_len,
        embed_dim,
        noise_std,
        ..
    } = *law;
    let mut tokens: Vec<f32> = Vec::with_capacity(num_samples * seq_len * embed_dim);
    tokens.extend(
        (0..num_samples * seq_len * embed_dim).map(|_| rng.sample::<f32, _>(StandardNormal)),
    );
    if noise_std != 1.0 {
        let scale = noise_std as f32;
        tokens.iter_mut().for_each(|v| *v *= scale);
    }

    let positives = num_samples / 2;
    let clean_labels: Vec<f64> = (0..num_samples)
        .map(|i| if i < positives { 1.0 } else { -1.0 })
        .collect();
    add_signals(&mut tokens, &clean_labels, law);

    let flips = flips_per_class(num_samples, noise_ratio);
    let noisy_mask: Vec<bool> = (0..num_samples)
        .map(|i| i < flips || (i >= positives && i < positives + flips))
        .collect();
    TokenSet::flipped(tokens, (seq_len, embed_dim), clean_labels, noisy_mask)
}

/// The paper's signal on tokens (n, T, d) row-major: μ_y on x_1, ρμ_y on x_2, ρμ_{−y} on x_3, with
/// μ_{+1} = ‖μ‖e_1 and μ_{−1} = ‖μ‖e_2, y the clean label of each sample.
pub fn add_signals(tokens: &mut [f32], clean_labels: &[f64], law: &TokenLaw) {
    let (t, d) = (law.seq_len, law.embed_dim);
    let coordinate = |label: f64| if label > 0.0 { 0 } else { 1 };
    let (signal, weak) = (law.signal_norm as f32, (law.rho * law.signal_norm) as f32);
    for (i, &y) in clean_labels.iter().enumerate() {
        let base = i * t * d;
        tokens[base + coordinate(y)] += signal;
        tokens[base + d + coordinate(y)] += weak;
        tokens[base + 2 * d + coordinate(-y)] += weak;
    }
}

/// The training set (noisy labels) and the clean test set of one config.
pub fn train_and_test(config: &SyntheticConfig) -> (TokenSet, TokenSet) {
    let c = config;
    let law = TokenLaw::of(c);
    let train = generate_from(
        &law,
        c.train_n,
        c.noise_ratio,
        &mut stream(c.seed, Stream::SyntheticTrain),
    );
    // The authors call the same generator with the same seed, so the test noise starts with the
    // training noise (§2.1 quirk); by default the test set comes from its own stream instead.
    let test_stream = if c.paper_test_seed {
        Stream::SyntheticTrain
    } else {
        Stream::SyntheticTest
    };
    let test = generate_from(&law, c.test_n, 0.0, &mut stream(c.seed, test_stream));
    (train, test)
}

/// Initial key-query matrix W ~ U(±1/√d), (d, d) row-major: torch's kaiming_uniform_(a=√5) of a
/// d×d Linear weight, drawn from its own stream.
pub fn initial_key_query(embed_dim: usize, seed: u64) -> Vec<f32> {
    let bound = 1.0 / (embed_dim as f32).sqrt();
    let uniform = Uniform::new(-bound, bound).expect("bound is finite and positive");
    let mut rng = stream(seed, Stream::SyntheticInit);
    (0..embed_dim * embed_dim)
        .map(|_| rng.sample(uniform))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> SyntheticConfig {
        SyntheticConfig {
            embed_dim: 50,
            test_n: 40,
            ..Default::default()
        }
    }

    #[test]
    fn flips_are_deterministic_and_balanced() {
        assert_eq!(flips_per_class(20, 0.2), 2);
        assert_eq!(flips_per_class(20, 0.0), 0);
        assert_eq!(flips_per_class(20, 0.25), 2); // ⌈5⌉ = 5 → 2 per class
        let (train, test) = train_and_test(&small());
        assert_eq!(train.noisy_indices(), vec![0, 1, 10, 11]);
        assert!(test.noisy_mask.iter().all(|&m| !m));
        for i in 0..20 {
            let expected = if i < 10 { 1.0 } else { -1.0 };
            assert_eq!(train.clean_labels[i], expected);
            let flipped = train.noisy_mask[i];
            assert_eq!(train.labels[i], if flipped { -expected } else { expected });
        }
    }

    #[test]
    fn noise_std_scales_the_noise_and_nothing_else() {
        let law = |noise_std| TokenLaw {
            seq_len: 4,
            embed_dim: 6,
            rho: 0.1,
            signal_norm: 3.0,
            noise_std,
        };
        let draw = |noise_std| {
            generate_from(
                &law(noise_std),
                10,
                0.2,
                &mut stream(5, Stream::SyntheticTrain),
            )
        };
        let (unit, double) = (draw(1.0), draw(2.0));
        let zero = generate_from(&law(1e-30), 10, 0.2, &mut stream(5, Stream::SyntheticTrain));
        for ((a, b), s) in unit.tokens.iter().zip(&double.tokens).zip(&zero.tokens) {
            assert!(((b - s) - 2.0 * (a - s)).abs() < 1e-4, "{a} {b} {s}");
        }
        assert_eq!(unit.labels, double.labels);
        // σ_ε = 1 is `generate`'s set exactly.
        let authors = generate(
            10,
            4,
            6,
            0.1,
            3.0,
            0.2,
            &mut stream(5, Stream::SyntheticTrain),
        );
        assert_eq!(authors.tokens, unit.tokens);
    }

    #[test]
    fn signals_sit_on_the_right_tokens() {
        let config = SyntheticConfig {
            embed_dim: 4000,
            ..small()
        };
        let (train, _) = train_and_test(&config);
        // Average over samples of each class: noise averages out, signals remain.
        let mean = |cls: f64, t: usize, k: usize| {
            let idx: Vec<usize> = (0..20).filter(|&i| train.clean_labels[i] == cls).collect();
            idx.iter()
                .map(|&i| train.token(i, t)[k] as f64)
                .sum::<f64>()
                / idx.len() as f64
        };
        assert!((mean(1.0, 0, 0) - 20.0).abs() < 1.5);
        assert!((mean(-1.0, 0, 1) - 20.0).abs() < 1.5);
        assert!((mean(1.0, 1, 0) - 2.0).abs() < 1.5);
        assert!((mean(1.0, 2, 1) - 2.0).abs() < 1.5);
        assert!(mean(1.0, 3, 0).abs() < 1.5);
        // Noise is standard normal.
        let all: Vec<f64> = train
            .tokens
            .iter()
            .skip(2)
            .step_by(7)
            .map(|&v| v as f64)
            .collect();
        let m = all.iter().sum::<f64>() / all.len() as f64;
        let var = all.iter().map(|v| (v - m).powi(2)).sum::<f64>() / all.len() as f64;
        assert!(
            m.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "mean {m} var {var}"
        );
    }

    #[test]
    fn paper_test_seed_reproduces_the_shared_noise_quirk() {
        let leaky = SyntheticConfig {
            paper_test_seed: true,
            ..small()
        };
        let (train, test) = train_and_test(&leaky);
        // Test sample i < n has training sample i's noise; the labels (balanced over test_n) and
        // so the signals differ, hence compare an irrelevant token, which carries no signal.
        for i in 0..train.num_samples {
            assert_eq!(train.token(i, 5), test.token(i, 5));
        }
        let (train, test) = train_and_test(&small());
        assert_ne!(train.token(0, 5), test.token(0, 5));
    }

    #[test]
    fn same_seed_same_data_other_seed_other_data() {
        let (a, _) = train_and_test(&small());
        let (b, _) = train_and_test(&small());
        let (c, _) = train_and_test(&SyntheticConfig { seed: 7, ..small() });
        assert_eq!(a.tokens, b.tokens);
        assert_ne!(a.tokens, c.tokens);
        assert_eq!(initial_key_query(10, 1), initial_key_query(10, 1));
        let w = initial_key_query(100, 1);
        assert!(w.iter().all(|v| v.abs() <= 0.1));
    }
}
