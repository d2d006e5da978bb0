//! The token-selection model f(X) = Σ_t softmax_t(X W p)_t · ν^T x_t (docs/protocol.md §2.2), its logistic
//! loss and the closed-form gradient of §2.6, from the token logits a = X (W p) onward.
//!
//! Both training engines produce the logits; everything downstream of them (attention, outputs,
//! loss, accuracy, dL/da) is computed here once, in f64.

use serde::{Deserialize, Serialize};

/// The model evaluated on a set of samples.
#[derive(Clone, Debug)]
pub struct Forward {
    pub seq_len: usize,
    /// softmax over the T tokens of each sample, (n × T). For the encoder: the CLS query's
    /// attention to the T data tokens, which leaves out its attention to itself.
    pub attention: Vec<f64>,
    /// The encoder's CLS query's attention to itself, per sample (empty for the token selector):
    /// its entropies are of the whole row, T + 1 positions.
    pub own_attention: Vec<f64>,
    /// f(X_i).
    pub outputs: Vec<f64>,
    /// Mean logistic loss log(1 + exp(−y f)).
    pub loss: f64,
    /// Fraction of samples with y f > 0.
    pub accuracy: f64,
}

impl Forward {
    /// `logits` and `head_values` (ν^T x) are (n × T); `labels` are ±1.
    pub fn new(logits: &[f64], head_values: &[f64], labels: &[f64], seq_len: usize) -> Self {
        debug_assert_eq!(logits.len(), labels.len() * seq_len);
        let mut attention = vec![0.0; logits.len()];
        let mut outputs = Vec::with_capacity(labels.len());
        for ((a, v), s) in logits
            .chunks_exact(seq_len)
            .zip(head_values.chunks_exact(seq_len))
            .zip(attention.chunks_exact_mut(seq_len))
        {
            softmax_into(a, s);
            outputs.push(s.iter().zip(v).map(|(s, v)| s * v).sum());
        }
        let (loss, accuracy) = loss_and_accuracy(&outputs, labels);
        Self {
            seq_len,
            attention,
            own_attention: Vec::new(),
            outputs,
            loss,
            accuracy,
        }
    }

    /// The encoder's outputs: its CLS rows' attention over the T + 1 positions (itself first,
    /// (n × (T + 1))) and its logits f(X_i).
    pub fn of_encoder(cls_rows: &[f32], logits: &[f32], labels: &[f64], seq_len: usize) -> Self {
        let (mut attention, mut own_attention) = (Vec::new(), Vec::new());
        for row in cls_rows.chunks_exact(seq_len + 1) {
            own_attention.push(f64::from(row[0]));
            attention.extend(row[1..].iter().map(|&a| f64::from(a)));
        }
        let outputs: Vec<f64> = logits.iter().map(|&f| f64::from(f)).collect();
        let (loss, accuracy) = loss_and_accuracy(&outputs, labels);
        Self {
            seq_len,
            attention,
            own_attention,
            outputs,
            loss,
            accuracy,
        }
    }

    /// dL/da_{i,t} = g_i s_{i,t} (v_{i,t} − f_i) with g_i = −y_i σ(−y_i f_i) / n (§2.6).
    pub fn logit_grads(&self, head_values: &[f64], labels: &[f64]) -> Vec<f64> {
        let n = labels.len() as f64;
        let mut grads = vec![0.0; self.attention.len()];
        for (i, ((s, v), out)) in self
            .attention
            .chunks_exact(self.seq_len)
            .zip(head_values.chunks_exact(self.seq_len))
            .zip(grads.chunks_exact_mut(self.seq_len))
            .enumerate()
        {
            let (y, f) = (labels[i], self.outputs[i]);
            let g = -y * sigmoid(-y * f) / n;
            for t in 0..self.seq_len {
                out[t] = g * s[t] * (v[t] - f);
            }
        }
        grads
    }

    /// Whether sample i is classified as its label.
    pub fn fits(&self, i: usize, label: f64) -> bool {
        label * self.outputs[i] > 0.0
    }

    /// Index of the most attended token of sample i.
    pub fn selected_token(&self, i: usize) -> usize {
        let row = &self.attention[i * self.seq_len..(i + 1) * self.seq_len];
        (0..self.seq_len).fold(0, |best, t| if row[t] > row[best] { t } else { best })
    }

    /// Mean attention of every token position over the samples where `keep(i)` holds
    /// (empty when none does).
    pub fn mean_attention(&self, keep: impl Fn(usize) -> bool) -> Vec<f64> {
        let mut sum = vec![0.0; self.seq_len];
        let mut count = 0usize;
        for (_, row) in self
            .attention
            .chunks_exact(self.seq_len)
            .enumerate()
            .filter(|(i, _)| keep(*i))
        {
            sum.iter_mut().zip(row).for_each(|(acc, s)| *acc += s);
            count += 1;
        }
        if count == 0 {
            return Vec::new();
        }
        sum.iter().map(|s| s / count as f64).collect()
    }

    /// Mean attention entropy over the samples where `keep(i)` holds (None when none does).
    pub fn mean_entropy(&self, keep: impl Fn(usize) -> bool) -> Option<f64> {
        let entropies: Vec<f64> = self
            .attention
            .chunks_exact(self.seq_len)
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(i, row)| {
                let own = self
                    .own_attention
                    .get(i)
                    .map_or(0.0, |&p| crate::diagnostics::entropy(&[p]));
                crate::diagnostics::entropy(row) + own
            })
            .collect();
        (!entropies.is_empty()).then(|| entropies.iter().sum::<f64>() / entropies.len() as f64)
    }
}

/// The mean logistic loss log(1 + e^(−y f)) and the fraction of samples with y f > 0.
fn loss_and_accuracy(outputs: &[f64], labels: &[f64]) -> (f64, f64) {
    let n = labels.len() as f64;
    let loss = outputs
        .iter()
        .zip(labels)
        .map(|(f, y)| softplus(-y * f))
        .sum::<f64>()
        / n;
    let correct = outputs
        .iter()
        .zip(labels)
        .filter(|(f, y)| *y * **f > 0.0)
        .count();
    (loss, correct as f64 / n)
}

fn softmax_into(logits: &[f64], out: &mut [f64]) {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0.0;
    for (o, a) in out.iter_mut().zip(logits) {
        *o = (a - max).exp();
        total += *o;
    }
    out.iter_mut().for_each(|o| *o /= total);
}

/// log(1 + e^z) without overflow.
pub fn softplus(z: f64) -> f64 {
    z.max(0.0) + (-z.abs()).exp().ln_1p()
}

fn sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        z.exp() / (1.0 + z.exp())
    }
}

/// Test accuracy at or above which an interpolating run counts as benign (and a non-interpolating
/// one as "not overfitting"). The harmful setting of the paper sits at 0.867, the benign at ≥ 0.99.
pub const BENIGN_TEST_ACCURACY: f64 = 0.95;

/// Operational regimes of docs/protocol.md §2.5.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Regime {
    /// Some training sample (typically a noisy one) is not fitted, and the test accuracy is high.
    #[serde(rename = "not overfitting")]
    NotOverfitting,
    /// Every training sample, noisy ones included, is fitted, and the test accuracy is high.
    #[serde(rename = "benign")]
    Benign,
    /// Every training sample is fitted, and the test accuracy is low.
    #[serde(rename = "harmful")]
    Harmful,
    /// Neither fits the training set nor generalises (outside the paper's three regimes).
    #[serde(rename = "underfitting")]
    Underfitting,
    /// η = 0: there is nothing to overfit.
    #[serde(rename = "no label noise")]
    NoLabelNoise,
}

impl Regime {
    pub fn classify(noisy_total: usize, train_accuracy: f64, test_accuracy: f64) -> Self {
        let generalises = test_accuracy >= BENIGN_TEST_ACCURACY;
        match (noisy_total, train_accuracy >= 1.0, generalises) {
            (0, _, _) => Regime::NoLabelNoise,
            (_, true, true) => Regime::Benign,
            (_, true, false) => Regime::Harmful,
            (_, false, true) => Regime::NotOverfitting,
            (_, false, false) => Regime::Underfitting,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Regime::NotOverfitting => "not overfitting",
            Regime::Benign => "benign",
            Regime::Harmful => "harmful",
            Regime::Underfitting => "underfitting",
            Regime::NoLabelNoise => "no label noise",
        }
    }

    pub const ALL: [Regime; 5] = [
        Regime::NotOverfitting,
        Regime::Benign,
        Regime::Harmful,
        Regime::Underfitting,
        Regime::NoLabelNoise,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_attention_at_zero_logits() {
        let fwd = Forward::new(
            &[0.0; 8],
            &[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
            &[1.0],
            8,
        );
        assert!(fwd.attention.iter().all(|s| (s - 0.125).abs() < 1e-15));
        assert!((fwd.outputs[0] - 0.25).abs() < 1e-15);
        assert!((fwd.loss - softplus(-0.25)).abs() < 1e-15);
        assert_eq!(fwd.accuracy, 1.0);
    }

    #[test]
    fn logit_grads_match_finite_differences() {
        let logits = [0.3, -1.2, 2.0, 0.1, 0.5, 0.5];
        let values = [0.7, -0.2, 0.1, -0.9, 0.4, 0.2];
        let labels = [1.0, -1.0];
        let grads = Forward::new(&logits, &values, &labels, 3).logit_grads(&values, &labels);
        for k in 0..logits.len() {
            let mut plus = logits;
            let mut minus = logits;
            plus[k] += 1e-6;
            minus[k] -= 1e-6;
            let fd = (Forward::new(&plus, &values, &labels, 3).loss
                - Forward::new(&minus, &values, &labels, 3).loss)
                / 2e-6;
            assert!(
                (fd - grads[k]).abs() < 1e-8,
                "k={k}: fd {fd} vs {}",
                grads[k]
            );
        }
    }

    #[test]
    fn softplus_is_stable() {
        assert_eq!(softplus(1000.0), 1000.0);
        assert!(softplus(-1000.0) >= 0.0 && softplus(-1000.0) < 1e-300);
        assert!((softplus(0.0) - 2f64.ln()).abs() < 1e-15);
    }

    #[test]
    fn regimes_follow_the_operational_definitions() {
        assert_eq!(Regime::classify(4, 1.0, 1.0), Regime::Benign);
        assert_eq!(Regime::classify(4, 1.0, 0.867), Regime::Harmful);
        assert_eq!(Regime::classify(4, 0.8, 1.0), Regime::NotOverfitting);
        assert_eq!(Regime::classify(4, 0.8, 0.6), Regime::Underfitting);
        assert_eq!(Regime::classify(0, 1.0, 1.0), Regime::NoLabelNoise);
        assert_eq!(
            serde_json::to_string(&Regime::NotOverfitting).unwrap(),
            "\"not overfitting\""
        );
    }
}
