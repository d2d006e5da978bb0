//! Label noise on the fine-tune set (docs/protocol.md §3): per sample, independently, with probability η
//! the label becomes a uniformly random *different* class (symmetric, as the authors) or the next
//! class (pair, y → y+1 mod C). Beyond the paper, CIFAR-10N replaces each label with a real human
//! annotation. The clean labels and the `noisy_mask` are kept for memorization metrics; nothing is
//! changed in place. With `--rng authors`, symmetric noise is the authors' own draw (torch's CPU
//! generator, docs/protocol.md §3.1); the other models are not theirs and are refused.

use std::fmt;
use std::str::FromStr;

use rand::RngExt;
use serde::Serialize;

use super::cifar10n::{Annotations, HumanLabels};
use super::files::{DataError, Result};
use crate::rng::{RngChoice, Stream, stream, torch};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoiseModel {
    Symmetric,
    Pair,
    /// CIFAR-10N annotations; η is then realised, not chosen.
    Cifar10n(HumanLabels),
}

impl fmt::Display for NoiseModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoiseModel::Symmetric => f.write_str("symmetric"),
            NoiseModel::Pair => f.write_str("pair"),
            NoiseModel::Cifar10n(kind) => write!(f, "cifar10n:{}", kind.name()),
        }
    }
}

impl FromStr for NoiseModel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "symmetric" => Ok(NoiseModel::Symmetric),
            "pair" => Ok(NoiseModel::Pair),
            _ => match s.strip_prefix("cifar10n:") {
                Some(kind) => kind.parse().map(NoiseModel::Cifar10n),
                None => Err(format!(
                    "unknown noise {s:?}: expected symmetric, pair or cifar10n:aggre|random1|random2|random3|worse"
                )),
            },
        }
    }
}

/// Labels after noise, beside the clean ones.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NoisyLabels {
    pub labels: Vec<u32>,
    pub clean_labels: Vec<u32>,
    /// labels[i] ≠ clean_labels[i].
    pub noisy_mask: Vec<bool>,
}

impl NoisyLabels {
    fn new(labels: Vec<u32>, clean_labels: Vec<u32>) -> Self {
        let noisy_mask = labels
            .iter()
            .zip(&clean_labels)
            .map(|(a, b)| a != b)
            .collect();
        Self {
            labels,
            clean_labels,
            noisy_mask,
        }
    }

    pub fn noisy_count(&self) -> usize {
        self.noisy_mask.iter().filter(|&&m| m).count()
    }

    /// The realised noise rate.
    pub fn rate(&self) -> f64 {
        self.noisy_count() as f64 / self.labels.len().max(1) as f64
    }
}

/// Why `eta` is no label-noise rate (the one check of η's range: [0, 1)), or `None`.
pub fn eta_out_of_range(eta: f64) -> Option<String> {
    (!(0.0..1.0).contains(&eta)).then(|| format!("must be in [0, 1), got {eta}"))
}

/// Symmetric or pair noise at rate `eta` ∈ [0, 1), from the label-noise stream of `seed`; with
/// `RngChoice::Authors`, symmetric noise as the authors drew it: torch's CPU generator seeded
/// `seed`, the rows in order, both draws made for every row ([`torch::label_noise`]).
pub fn corrupt(
    clean: &[u32],
    num_classes: usize,
    model: NoiseModel,
    eta: f64,
    seed: u64,
    rng: RngChoice,
) -> Result<NoisyLabels> {
    let bad = |problem: String| DataError::Unavailable {
        dataset: "label noise".into(),
        problem,
    };
    if let Some(why) = eta_out_of_range(eta) {
        return Err(bad(format!("--eta {why}")));
    }
    if num_classes < 2 {
        return Err(bad(format!(
            "{num_classes} class(es): label noise needs at least 2"
        )));
    }
    let pair = match model {
        NoiseModel::Symmetric => false,
        NoiseModel::Pair => true,
        NoiseModel::Cifar10n(_) => {
            return Err(bad(
                "CIFAR-10N labels come from annotations, not from a rate".into(),
            ));
        }
    };
    let classes = u32::try_from(num_classes)
        .map_err(|_| bad(format!("{num_classes} classes: too many for label noise")))?;
    if rng == RngChoice::Authors {
        if pair {
            return Err(bad(authors_only_symmetric(model)));
        }
        let labels = torch::label_noise(clean, classes, eta, seed).map_err(bad)?;
        return Ok(NoisyLabels::new(labels, clean.to_vec()));
    }
    let mut rng = stream(seed, Stream::LabelNoise);
    let labels = clean
        .iter()
        .map(|&y| {
            // The same two draws per sample whatever η and model: the flipped set grows
            // monotonically with η and is shared by both models.
            let flip = rng.random::<f64>() < eta;
            let offset = rng.random_range(1..classes);
            match (flip, pair) {
                (false, _) => y,
                (true, false) => (y + offset) % classes,
                (true, true) => (y + 1) % classes,
            }
        })
        .collect();
    Ok(NoisyLabels::new(labels, clean.to_vec()))
}

/// Why `--rng authors` refuses a noise model other than symmetric, naming the flag.
pub fn authors_only_symmetric(model: NoiseModel) -> String {
    format!(
        "--noise {model} is not the authors' procedure: --rng authors draws symmetric noise only \
         (use --noise symmetric, or --rng own)"
    )
}

/// CIFAR-10N: each image's label is its human annotation, found by its release index.
pub fn human(
    clean: &[u32],
    release_index: &[usize],
    annotations: &Annotations,
) -> Result<NoisyLabels> {
    let bad = |problem: String| DataError::Unavailable {
        dataset: "cifar10n".into(),
        problem,
    };
    let mut labels = Vec::with_capacity(clean.len());
    for (&y, &k) in clean.iter().zip(release_index) {
        if k >= annotations.clean.len() {
            return Err(bad(format!(
                "train image {k} has no annotation (CIFAR-10N covers the 50000 training images)"
            )));
        }
        if annotations.clean[k] != y {
            return Err(bad(format!(
                "clean_label[{k}] = {} but the CIFAR-10 file says {y}: the annotations are not in this release order",
                annotations.clean[k]
            )));
        }
        labels.push(annotations.human[k]);
    }
    Ok(NoisyLabels::new(labels, clean.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(n: usize) -> Vec<u32> {
        (0..n as u32).map(|k| k % 10).collect()
    }

    #[test]
    fn symmetric_rate_is_within_binomial_tolerance() {
        let n = 10_000;
        let eta = 0.2;
        let noisy = corrupt(
            &clean(n),
            10,
            NoiseModel::Symmetric,
            eta,
            42,
            RngChoice::Own,
        )
        .unwrap();
        // 4 standard deviations of Binomial(n, η)/n.
        let tolerance = 4.0 * (eta * (1.0 - eta) / n as f64).sqrt();
        assert!(
            (noisy.rate() - eta).abs() < tolerance,
            "rate {} vs {eta} ± {tolerance}",
            noisy.rate()
        );
        for ((y, c), m) in noisy
            .labels
            .iter()
            .zip(&noisy.clean_labels)
            .zip(&noisy.noisy_mask)
        {
            assert_eq!(*m, y != c);
            assert!(*y < 10);
        }
        // Every corrupted label differs from its clean label: the count of changes is the mask.
        assert_eq!(
            noisy.noisy_count(),
            noisy
                .labels
                .iter()
                .zip(&noisy.clean_labels)
                .filter(|(a, b)| a != b)
                .count()
        );
        // Symmetric: the wrong classes are spread out, not all y + 1.
        let shifts: std::collections::HashSet<u32> = noisy
            .labels
            .iter()
            .zip(&noisy.clean_labels)
            .filter(|(a, b)| a != b)
            .map(|(a, b)| (a + 10 - b) % 10)
            .collect();
        assert_eq!(shifts.len(), 9);
    }

    #[test]
    fn seeds_and_zero_rate() {
        let c = clean(10_000);
        let a = corrupt(&c, 10, NoiseModel::Symmetric, 0.2, 1, RngChoice::Own).unwrap();
        let b = corrupt(&c, 10, NoiseModel::Symmetric, 0.2, 1, RngChoice::Own).unwrap();
        let other = corrupt(&c, 10, NoiseModel::Symmetric, 0.2, 2, RngChoice::Own).unwrap();
        assert_eq!(a.noisy_mask, b.noisy_mask);
        assert_ne!(a.noisy_mask, other.noisy_mask);
        let none = corrupt(&c, 10, NoiseModel::Symmetric, 0.0, 1, RngChoice::Own).unwrap();
        assert_eq!(none.noisy_count(), 0);
        assert_eq!(none.labels, c);
    }

    #[test]
    fn pair_noise_moves_to_the_next_class_and_binary_flips() {
        let noisy = corrupt(&clean(5000), 10, NoiseModel::Pair, 0.3, 3, RngChoice::Own).unwrap();
        for (y, c) in noisy
            .labels
            .iter()
            .zip(&noisy.clean_labels)
            .filter(|(a, b)| a != b)
        {
            assert_eq!(*y, (c + 1) % 10);
        }
        let binary: Vec<u32> = (0..2000).map(|k| k % 2).collect();
        let flipped = corrupt(&binary, 2, NoiseModel::Symmetric, 0.5, 3, RngChoice::Own).unwrap();
        for (y, c) in flipped
            .labels
            .iter()
            .zip(&flipped.clean_labels)
            .filter(|(a, b)| a != b)
        {
            assert_eq!(*y, 1 - c);
        }
    }

    #[test]
    fn bad_rates_and_names_are_refused() {
        assert!(
            corrupt(
                &clean(10),
                10,
                NoiseModel::Symmetric,
                1.0,
                0,
                RngChoice::Own
            )
            .unwrap_err()
            .to_string()
            .contains("--eta")
        );
        assert!(
            corrupt(
                &clean(10),
                10,
                NoiseModel::Symmetric,
                -0.1,
                0,
                RngChoice::Own
            )
            .is_err()
        );
        assert_eq!(
            "cifar10n:worse".parse::<NoiseModel>().unwrap(),
            NoiseModel::Cifar10n(HumanLabels::Worse)
        );
        assert!(
            "gaussian"
                .parse::<NoiseModel>()
                .unwrap_err()
                .contains("symmetric")
        );
    }

    #[test]
    fn authors_symmetric_noise_is_the_torch_draw_and_pair_is_refused() {
        let c = clean(1000);
        let noisy = corrupt(&c, 10, NoiseModel::Symmetric, 0.2, 7, RngChoice::Authors).unwrap();
        assert_eq!(noisy.labels, torch::label_noise(&c, 10, 0.2, 7).unwrap());
        assert_eq!(noisy.clean_labels, c);
        assert!(noisy.noisy_count() > 0);
        let own = corrupt(&c, 10, NoiseModel::Symmetric, 0.2, 7, RngChoice::Own).unwrap();
        assert_ne!(noisy.noisy_mask, own.noisy_mask);
        let err = corrupt(&c, 10, NoiseModel::Pair, 0.2, 7, RngChoice::Authors)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--noise pair") && err.contains("--rng authors"),
            "{err}"
        );
    }

    #[test]
    fn human_labels_follow_release_indices() {
        let annotations = Annotations {
            kind: HumanLabels::Aggre,
            clean: vec![0, 1, 2, 3],
            human: vec![0, 5, 2, 9],
        };
        let noisy = human(&[3, 1], &[3, 1], &annotations).unwrap();
        assert_eq!(noisy.labels, vec![9, 5]);
        assert_eq!(noisy.noisy_mask, vec![true, true]);
        let err = human(&[2], &[1], &annotations).unwrap_err().to_string();
        assert!(err.contains("release order"), "{err}");
    }
}
