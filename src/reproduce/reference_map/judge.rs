//! What one run of the reference map says (docs/design.md, "The paper's model on real noise"):
//! a regime only where training has settled and the test set can show one, the boundary of each
//! n along the n·SNR² ladder, and the pre-registered answer line.
//!
//! - The call: memorised = every training sample fitted; generalises = test accuracy at least
//!   `0.5 + 0.9·(ceiling − 0.5)`, the ceiling being the test accuracy of attention entirely on x₁
//!   (the paper's 0.95 where the ceiling is 1). Below a ceiling of [`MIN_CEILING`] there is no
//!   signal to judge a regime by.
//! - Settled: over the last two doublings of the checkpoints (S, 2S, 4S, and on to 16S where
//!   those moved), train accuracy and the share of flipped labels fitted move by at most
//!   [`SETTLE_ACCURACY`], test accuracy by at most one binomial standard error at ½ of the test
//!   set (0.5/√m: a test set of 400 moves by 0.011 between two checkpoints with nothing learnt,
//!   which the first rule, 0.01 for all three, called unconverged), and the train loss by at most
//!   [`SETTLE_LOSS`]; else "unconverged at cap", never a regime.
//! - The half-step check (one seed a cell): half the step, twice the steps; another call marks it.
//! - A boundary: where the seed-mean memorisation first crosses 50 % going down the n·SNR² ladder
//!   (log-interpolated); the answer compares the two n's boundaries on the n·SNR² axis and on the
//!   ‖μ‖ axis (‖μ‖ = √(n·SNR²·d/n)).

use serde::{Deserialize, Serialize};

use crate::synthetic::StepMetrics;

/// The ceiling below which no regime is called.
pub const MIN_CEILING: f64 = 0.6;
/// The share of the way from chance to the ceiling that counts as generalising.
pub const GENERALISES: f64 = 0.9;
/// Settled: accuracies move at most this over each doubling …
pub const SETTLE_ACCURACY: f64 = 0.01;
/// … and the train loss at most this (absolute).
pub const SETTLE_LOSS: f64 = 0.01;
/// Boundaries coincide when their ratio is within this factor.
pub const COINCIDE: f64 = 2.0;
/// The memorisation level whose crossing is a boundary.
pub const CROSSING: f64 = 0.5;

/// One run's call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MapCall {
    NotOverfitting,
    Benign,
    Harmful,
    Underfitting,
    /// The relevant token's own test accuracy is below [`MIN_CEILING`].
    NoSignal,
    /// Accuracies or loss still moving at the last checkpoint.
    Unconverged,
}

impl MapCall {
    pub fn name(self) -> &'static str {
        match self {
            MapCall::NotOverfitting => "not overfitting",
            MapCall::Benign => "benign",
            MapCall::Harmful => "harmful",
            MapCall::Underfitting => "underfitting",
            MapCall::NoSignal => "no signal",
            MapCall::Unconverged => "unconverged at cap",
        }
    }
}

/// The numbers of one checkpoint the call reads.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointReading {
    pub step: usize,
    pub train_loss: f64,
    pub train_acc: f64,
    pub test_acc: f64,
    /// Share of the flipped labels fitted (NaN, JSON null, where none were flipped: η 0).
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub memorization: f64,
}

impl CheckpointReading {
    pub fn of(m: &StepMetrics) -> Self {
        Self {
            step: m.step,
            train_loss: m.train_loss,
            train_acc: m.train_acc,
            test_acc: m.test_acc,
            memorization: if m.noisy_total == 0 {
                f64::NAN
            } else {
                m.noisy_fitted as f64 / m.noisy_total as f64
            },
        }
    }
}

/// Whether the last two doublings of `checkpoints` moved nothing that matters, on a test set of
/// `test_n`.
pub fn settled(checkpoints: &[CheckpointReading], test_n: usize) -> bool {
    let [.., a, b, c] = checkpoints else {
        return false;
    };
    let test_tolerance = 0.5 / (test_n.max(1) as f64).sqrt();
    let still = |x: &CheckpointReading, y: &CheckpointReading| {
        (x.train_acc - y.train_acc).abs() <= SETTLE_ACCURACY
            && (x.test_acc - y.test_acc).abs() <= test_tolerance
            && ((x.memorization - y.memorization).abs() <= SETTLE_ACCURACY
                || (x.memorization.is_nan() && y.memorization.is_nan()))
            && (x.train_loss - y.train_loss).abs() <= SETTLE_LOSS
    };
    b.step == 2 * a.step && c.step == 2 * b.step && still(a, b) && still(b, c)
}

/// The call of a run from its checkpoints and the ceiling of its test set of `test_n`.
pub fn call(checkpoints: &[CheckpointReading], ceiling: f64, test_n: usize) -> MapCall {
    if ceiling < MIN_CEILING {
        return MapCall::NoSignal;
    }
    if !settled(checkpoints, test_n) {
        return MapCall::Unconverged;
    }
    let last = checkpoints.last().expect("settled runs have checkpoints");
    let generalises = last.test_acc - 0.5 >= GENERALISES * (ceiling - 0.5);
    match (last.train_acc >= 1.0, generalises) {
        (true, true) => MapCall::Benign,
        (true, false) => MapCall::Harmful,
        (false, true) => MapCall::NotOverfitting,
        (false, false) => MapCall::Underfitting,
    }
}

/// Where `memorisation` (seed means, one per n·SNR² ascending; `None` where a cell has no
/// settled run) first falls below [`CROSSING`] from above as n·SNR² rises, log-interpolated;
/// `None` without such a crossing or with a gap in its interval.
pub fn boundary(n_snr2: &[f64], memorisation: &[Option<f64>]) -> Option<f64> {
    n_snr2
        .windows(2)
        .zip(memorisation.windows(2))
        .find_map(|(x, m)| match (m[0], m[1]) {
            (Some(a), Some(b)) if a >= CROSSING && b < CROSSING => {
                let (lo, hi) = (x[0].ln(), x[1].ln());
                Some((lo + (a - CROSSING) / (a - b) * (hi - lo)).exp())
            }
            _ => None,
        })
}

/// One dataset's comparison of its two boundaries.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// Boundary at the smaller and the larger n, on the n·SNR² axis.
    pub boundaries: [Option<f64>; 2],
    /// Larger n's boundary over the smaller's, on each axis.
    pub n_snr2_ratio: Option<f64>,
    pub signal_norm_ratio: Option<f64>,
    pub answer: &'static str,
}

fn within(ratio: f64) -> bool {
    (1.0 / COINCIDE..=COINCIDE).contains(&ratio)
}

/// The comparison at sizes `ns` (smaller first): Yes where the boundaries coincide within ×2 on
/// the n·SNR² axis and not on the ‖μ‖ axis, No where the reverse, else Undecided.
pub fn compare(ns: [usize; 2], boundaries: [Option<f64>; 2]) -> Comparison {
    let ratios = match boundaries {
        [Some(a), Some(b)] => {
            let r = b / a;
            // ‖μ‖ = √(n·SNR²·d/n): the d cancels in the ratio.
            Some((r, (r * ns[0] as f64 / ns[1] as f64).sqrt()))
        }
        _ => None,
    };
    let answer = match ratios {
        Some((r, m)) if within(r) && !within(m) => "Yes",
        Some((r, m)) if within(m) && !within(r) => "No",
        _ => "Undecided",
    };
    Comparison {
        boundaries,
        n_snr2_ratio: ratios.map(|r| r.0),
        signal_norm_ratio: ratios.map(|r| r.1),
        answer,
    }
}

/// Over datasets: Yes (No) where every dataset says Yes (No), else Undecided.
pub fn overall(answers: &[&str]) -> &'static str {
    if !answers.is_empty() && answers.iter().all(|&a| a == "Yes") {
        "Yes"
    } else if !answers.is_empty() && answers.iter().all(|&a| a == "No") {
        "No"
    } else {
        "Undecided"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(step: usize, train_acc: f64, test_acc: f64, memorization: f64) -> CheckpointReading {
        CheckpointReading {
            step,
            train_loss: 0.3,
            train_acc,
            test_acc,
            memorization,
        }
    }

    #[test]
    fn a_call_needs_settled_training_and_a_visible_signal() {
        let settled_benign = [
            point(100, 1.0, 0.97, 1.0),
            point(200, 1.0, 0.97, 1.0),
            point(400, 1.0, 0.97, 1.0),
        ];
        assert_eq!(call(&settled_benign, 1.0, 1000), MapCall::Benign);
        // The same test accuracy under a ceiling of 0.98 still generalises; under 0.55 nothing.
        assert_eq!(call(&settled_benign, 0.55, 1000), MapCall::NoSignal);
        let moving = [
            point(100, 0.9, 0.97, 0.5),
            point(200, 1.0, 0.97, 1.0),
            point(400, 1.0, 0.97, 1.0),
        ];
        assert_eq!(call(&moving, 1.0, 1000), MapCall::Unconverged);
        // Test accuracy moving by 0.011 is within a test set of 400's noise, not of 10⁴'s.
        let jitter = [
            point(100, 1.0, 0.589, 1.0),
            point(200, 1.0, 0.600, 1.0),
            point(400, 1.0, 0.600, 1.0),
        ];
        assert_eq!(call(&jitter, 1.0, 400), MapCall::Harmful);
        assert_eq!(call(&jitter, 1.0, 10_000), MapCall::Unconverged);
        let harmful = [
            point(100, 1.0, 0.7, 1.0),
            point(200, 1.0, 0.7, 1.0),
            point(400, 1.0, 0.7, 1.0),
        ];
        assert_eq!(call(&harmful, 1.0, 1000), MapCall::Harmful);
        // Relative to a ceiling of 0.72, 0.7 generalises and is benign.
        assert_eq!(call(&harmful, 0.72, 1000), MapCall::Benign);
    }

    #[test]
    fn a_run_with_no_flipped_label_settles_and_reads_back() {
        let clean = [
            point(100, 1.0, 0.97, f64::NAN),
            point(200, 1.0, 0.97, f64::NAN),
            point(400, 1.0, 0.97, f64::NAN),
        ];
        assert_eq!(call(&clean, 1.0, 1000), MapCall::Benign);
        // A NaN beside a number is a change, not a settled run.
        let half = [
            point(100, 1.0, 0.97, 1.0),
            point(200, 1.0, 0.97, f64::NAN),
            point(400, 1.0, 0.97, f64::NAN),
        ];
        assert_eq!(call(&half, 1.0, 1000), MapCall::Unconverged);
        let text = serde_json::to_string(&clean[0]).unwrap();
        assert!(text.contains("\"memorization\":null"), "{text}");
        let back: CheckpointReading = serde_json::from_str(&text).unwrap();
        assert!(back.memorization.is_nan());
    }

    #[test]
    fn boundaries_and_the_answer_can_say_each_thing() {
        let ladder = [0.3, 1.0, 3.0, 10.0, 30.0, 100.0];
        let m = |v: [f64; 6]| v.map(Some);
        let at_3 = boundary(&ladder, &m([1.0, 1.0, 0.6, 0.4, 0.0, 0.0])).unwrap();
        assert!(at_3 > 3.0 && at_3 < 10.0, "{at_3}");
        assert_eq!(boundary(&ladder, &m([0.0; 6])), None);
        // n·SNR² governs: the same boundary at both n.
        assert_eq!(compare([20, 200], [Some(4.0), Some(5.0)]).answer, "Yes");
        // ‖μ‖ governs: the n·SNR² boundary moves ×10 with n.
        assert_eq!(compare([20, 200], [Some(4.0), Some(40.0)]).answer, "No");
        assert_eq!(
            compare([20, 200], [Some(4.0), Some(9.4)]).answer,
            "Undecided"
        );
        assert_eq!(compare([20, 200], [Some(4.0), None]).answer, "Undecided");
        assert_eq!(overall(&["Yes", "Yes"]), "Yes");
        assert_eq!(overall(&["Yes", "No"]), "Undecided");
        assert_eq!(overall(&["No", "No"]), "No");
    }
}
