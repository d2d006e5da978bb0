//! Hyper-parameters of the synthetic token-selection experiment (docs/protocol.md §2.4), with the authors'
//! final config (`config/main.yaml`, HEAD c563aae) as defaults.

use std::path::Path;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::engine::EngineKind;
pub use crate::limits::Available;

/// The largest ‖μ‖ a run takes: tokens are f32, and ‖μ‖² summed over tokens and dimensions must
/// stay far from f32's 3.4e38 (at ‖μ‖ 1e30 a run already reads test accuracy 0, at 1e40 NaN).
pub const MAX_SIGNAL_NORM: f64 = 1e12;

/// The most steps a run takes: 1e5 times the paper's 1000, already days for one large cell.
pub const MAX_STEPS: usize = 100_000_000;

fn is_unit(value: &f64) -> bool {
    *value == 1.0
}

/// One synthetic run. Field names are the authors' config keys; the CLI flags are their kebab-case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyntheticConfig {
    /// T: tokens per sample (x_1 relevant, x_2 and x_3 weakly relevant, the rest irrelevant).
    pub seq_len: usize,
    /// d: token dimension.
    pub embed_dim: usize,
    /// n: training samples.
    pub train_n: usize,
    /// Test samples (clean labels).
    pub test_n: usize,
    /// ρ: strength of the weakly relevant tokens.
    pub rho: f64,
    /// ‖μ‖: norm of the class signals μ_{+1} = ‖μ‖e_1 and μ_{-1} = ‖μ‖e_2.
    pub signal_norm: f64,
    /// σ_ε: the noise is σ_ε·N(0, I_d). Not one of the authors' keys (theirs is 1, and a config
    /// at 1 is keyed as theirs); the SNR dose's synthetic check raises it (docs/design.md).
    #[serde(skip_serializing_if = "is_unit")]
    pub noise_std: f64,
    /// η: label-flip ratio; 2·⌊⌈nη⌉/2⌋ labels are flipped, deterministically (§2.1).
    pub noise_ratio: f64,
    /// Step size of full-batch gradient descent.
    pub learning_rate: f64,
    /// Number of gradient-descent updates.
    pub num_steps: usize,
    /// Seed of the training data and of the initialisation of W.
    pub seed: u64,
    /// Build the test set from the training seed as the authors did: its first n samples then
    /// share their noise with the training samples (§2.1 quirk). Off: an independent stream.
    pub paper_test_seed: bool,
    /// Evaluate and log every this many steps.
    pub log_interval: usize,
    /// λ of the LocAteR penalty λ·v_sym(W) (`diagnostics::locater`); 0, the paper's setting: none.
    /// Not one of the authors' keys; needs the dense engine.
    pub locater: f64,
    /// Train the one-layer Transformer encoder of Figs. 6/7 (the authors' `main_one_layer.py`)
    /// instead of the token selector; absent: the token selector.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoder: Option<EncoderSettings>,
}

/// The encoder's own hyper-parameters (`config/main_one_layer.yaml`; the other keys are shared).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EncoderSettings {
    /// Width of the FFN's hidden layer.
    pub mlp_dim: usize,
    /// Seed of the parameters' initialisation. The authors seed the data but not the model
    /// (their runs vary from one to the next); here it is a seed of its own, so that a spread
    /// over initialisations can be measured on the same data.
    pub init_seed: u64,
}

impl Default for EncoderSettings {
    fn default() -> Self {
        Self {
            mlp_dim: 2000,
            init_seed: 0,
        }
    }
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        Self {
            seq_len: 8,
            embed_dim: 2000,
            train_n: 20,
            test_n: 1000,
            rho: 0.1,
            signal_norm: 20.0,
            noise_std: 1.0,
            noise_ratio: 0.2,
            learning_rate: 5e-3,
            num_steps: 1000,
            seed: 42,
            paper_test_seed: false,
            log_interval: 10,
            locater: 0.0,
            encoder: None,
        }
    }
}

impl SyntheticConfig {
    /// Reads a TOML file with any subset of the keys above; missing keys keep the paper defaults.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = crate::io::read_input_text(path, crate::io::limits::SMALL_TEXT)?;
        toml::from_str(&text).map_err(|err| {
            let msg = err.message().replace('\n', " ");
            anyhow::anyhow!("{}: invalid synthetic config: {msg}", path.display())
        })
    }

    /// SNR := ‖μ‖ / (σ_ε √d) (docs/protocol.md §2.5; the paper's σ_ε is 1).
    pub fn snr(&self) -> f64 {
        self.signal_norm / (self.noise_std * (self.embed_dim as f64).sqrt())
    }

    /// Rejects values outside the model's domain, naming the flag and the expected range.
    pub fn validate(&self) -> Result<()> {
        self.check_shapes()?;
        self.check_training()?;
        if let Some(encoder) = &self.encoder {
            require(
                encoder.mlp_dim >= 1,
                "mlp-dim",
                "at least 1",
                encoder.mlp_dim.to_string(),
            )?;
            require(
                self.locater == 0.0,
                "locater",
                "0 with --model encoder (the penalty is the token selector's)",
                self.locater.to_string(),
            )?;
        }
        // Before knowing the engine: even the cheaper one must fit.
        self.check_memory(None, false, &Available::now())
    }

    /// The sequence, the width and the sample counts.
    fn check_shapes(&self) -> Result<()> {
        require(
            self.seq_len >= 3,
            "seq-len",
            "at least 3 (x_1, x_2, x_3 are fixed roles)",
            self.seq_len.to_string(),
        )?;
        require(
            self.embed_dim >= 2,
            "embed-dim",
            "at least 2 (μ_{±1} use e_1 and e_2)",
            self.embed_dim.to_string(),
        )?;
        require(
            self.train_n >= 2,
            "train-n",
            "at least 2 (one sample per class)",
            self.train_n.to_string(),
        )?;
        require(
            self.test_n >= 1,
            "test-n",
            "at least 1",
            self.test_n.to_string(),
        )?;
        Ok(())
    }

    /// The data's signal and noise, and the training's step, length and penalty.
    fn check_training(&self) -> Result<()> {
        require(
            self.rho.is_finite() && self.rho >= 0.0,
            "rho",
            "a finite number ≥ 0",
            self.rho.to_string(),
        )?;
        require(
            self.signal_norm > 0.0 && self.signal_norm <= MAX_SIGNAL_NORM,
            "signal-norm",
            "a number in (0, 1e12] (the head ν is scaled by 1/‖μ‖; beyond, the tokens' f32 \
             products overflow)",
            self.signal_norm.to_string(),
        )?;
        require(
            self.noise_std.is_finite() && self.noise_std > 0.0 && self.noise_std <= 1e6,
            "noise-std",
            "a number in (0, 1e6] (σ_ε of the noise tokens)",
            self.noise_std.to_string(),
        )?;
        require(
            (0.0..=0.5).contains(&self.noise_ratio),
            "noise-ratio",
            "in [0, 0.5]",
            self.noise_ratio.to_string(),
        )?;
        require(
            self.learning_rate.is_finite() && self.learning_rate > 0.0,
            "learning-rate",
            "a finite number > 0",
            self.learning_rate.to_string(),
        )?;
        require(
            (1..=MAX_STEPS).contains(&self.num_steps),
            "num-steps",
            "in 1..=100000000 (the paper runs 1000)",
            self.num_steps.to_string(),
        )?;
        require(
            self.log_interval >= 1,
            "log-interval",
            "at least 1",
            self.log_interval.to_string(),
        )?;
        require(
            self.locater.is_finite() && self.locater >= 0.0,
            "locater",
            "a finite number ≥ 0",
            self.locater.to_string(),
        )?;
        Ok(())
    }

    /// [`validate`](Self::validate), and the memory `engine` needs must fit.
    pub fn validate_for(&self, engine: EngineKind) -> Result<()> {
        self.validate()?;
        self.check_memory(Some(engine), false, &Available::now())
    }

    /// [`validate_for`](Self::validate_for), counting the per-step attention trace of every
    /// training sample too when `attention_trace` (what `Trace::Full` keeps for the plots).
    pub fn validate_run(&self, engine: EngineKind, attention_trace: bool) -> Result<()> {
        self.validate()?;
        self.check_memory(Some(engine), attention_trace, &Available::now())
    }

    /// The large allocations of a run with `engine`, in bytes (an estimate, not a bound).
    pub fn memory_estimate(&self, engine: EngineKind, attention_trace: bool) -> MemoryEstimate {
        // f64 throughout: the products overflow usize for absurd flags.
        let (d, t) = (self.embed_dim as f64, self.seq_len as f64);
        let (n, m) = (self.train_n as f64, self.test_n as f64);
        if let Some(encoder) = &self.encoder {
            let mlp = encoder.mlp_dim as f64;
            return MemoryEstimate {
                // The weights (f32), and the three d × d products of the final spectrum.
                key_query: 4.0 * (3.0 * d * d + 2.0 * mlp * d) + 12.0 * d * d,
                // Train and test tokens, the normalised training tokens and one evaluation
                // chunk's, and the per-part sums of the backward products.
                tokens: 4.0 * ((n + m) * t * d + n * t * d + 256.0 * t * d)
                    + 4.0 * n * d * (d / 256.0 + 1.0),
                attention_trace: if attention_trace {
                    4.0 * (self.num_steps as f64 + 1.0) * n * (t + 1.0)
                } else {
                    0.0
                },
            };
        }
        let rank = n * t; // M = n·T training tokens
        let (per_entry, engine_tokens, reduced) = match engine {
            // W₀ as drawn (f32), W, ∇W and the update's temporaries (f32), and the f64 copies the
            // spectrum traces read; the engine's own f32 copy of the training tokens.
            EngineKind::Dense => (24.0, 4.0 * rank * d, 0.0),
            // W₀ as drawn (f32) and in f64, and the f64 copy the traces read; A, B = W₀ᵀA and the
            // product BᵀW₀ in f64 (d × nT each, plus the f32 copy A comes from); seven nT × nT
            // f64 matrices (G_A, G_B, Q and the trace terms).
            EngineKind::Subspace => (20.0, 28.0 * rank * d, 56.0 * rank * rank),
        };
        MemoryEstimate {
            key_query: per_entry * d * d,
            tokens: 4.0 * (n + m) * t * d + engine_tokens + reduced,
            attention_trace: if attention_trace {
                4.0 * (self.num_steps as f64 + 1.0) * rank
            } else {
                0.0
            },
        }
    }

    /// Refuses a run whose memory estimate exceeds `available`; `engine` `None`: the cheaper one.
    fn check_memory(
        &self,
        engine: Option<EngineKind>,
        attention_trace: bool,
        available: &Available,
    ) -> Result<()> {
        let estimate = |e| self.memory_estimate(e, attention_trace);
        let (engine_flag, estimate) = match engine {
            _ if self.encoder.is_some() => (
                "--model encoder".to_string(),
                estimate(EngineKind::Subspace),
            ),
            Some(e) => (format!("--engine {}", engine_name(e)), estimate(e)),
            None => {
                let (dense, subspace) =
                    (estimate(EngineKind::Dense), estimate(EngineKind::Subspace));
                let cheaper = if dense.total() < subspace.total() {
                    dense
                } else {
                    subspace
                };
                ("whichever --engine".to_string(), cheaper)
            }
        };
        if estimate.total() <= available.bytes {
            return Ok(());
        }
        let gib = |bytes: f64| {
            let g = bytes / GIB;
            if g < 100.0 {
                format!("{g:.1} GiB")
            } else {
                format!("{g:.0} GiB")
            }
        };
        let trace = if attention_trace {
            format!(
                ", attention trace of --num-steps {} {}",
                self.num_steps,
                gib(estimate.attention_trace)
            )
        } else {
            String::new()
        };
        // The flags whose values the estimate grows with.
        let (width, lower) = match &self.encoder {
            Some(encoder) => (
                format!(", --mlp-dim {}", encoder.mlp_dim),
                "--embed-dim, --mlp-dim, --train-n or --test-n",
            ),
            None => (String::new(), "--embed-dim, --train-n or --test-n"),
        };
        bail!(
            "--embed-dim {} (with --seq-len {}, --train-n {}, --test-n {}{width}, {engine_flag}) needs \
             about {} of memory (d × d matrices {}, tokens {}{trace}), more than the {} available \
             ({}); lower {lower}",
            self.embed_dim,
            self.seq_len,
            self.train_n,
            self.test_n,
            gib(estimate.total()),
            gib(estimate.key_query),
            gib(estimate.tokens),
            gib(available.bytes),
            available.source,
        )
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// Bytes of a run's large allocations, by what holds them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryEstimate {
    /// The d × d key-query matrix W₀/W and the engine's copies of it.
    pub key_query: f64,
    /// Train and test tokens (n·T·d and test_n·T·d f32) and the engine's own token matrices.
    pub tokens: f64,
    /// The attention of every training sample at every step.
    pub attention_trace: f64,
}

impl MemoryEstimate {
    pub fn total(&self) -> f64 {
        self.key_query + self.tokens + self.attention_trace
    }
}

fn engine_name(engine: EngineKind) -> String {
    use clap::ValueEnum;
    engine
        .to_possible_value()
        .map_or_else(|| format!("{engine:?}"), |v| v.get_name().to_string())
}

/// `Ok` where `ok`, else the flag's one-line error: what it must be, and what it got.
fn require(ok: bool, flag: &str, expected: &str, got: String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        bail!("--{flag} must be {expected}, got {got}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_authors_final_config() {
        let c = SyntheticConfig::default();
        assert_eq!(
            (c.seq_len, c.embed_dim, c.train_n, c.test_n),
            (8, 2000, 20, 1000)
        );
        assert_eq!((c.rho, c.signal_norm, c.noise_ratio), (0.1, 20.0, 0.2));
        assert_eq!(
            (c.learning_rate, c.num_steps, c.seed, c.log_interval),
            (5e-3, 1000, 42, 10)
        );
        assert!((c.snr() - 0.4472).abs() < 1e-4);
        c.validate().unwrap();
    }

    #[test]
    fn validation_names_the_flag() {
        let bad = SyntheticConfig {
            noise_ratio: 0.7,
            ..Default::default()
        };
        let msg = bad.validate().unwrap_err().to_string();
        assert!(
            msg.contains("--noise-ratio") && msg.contains("0.7"),
            "{msg}"
        );
        let bad = SyntheticConfig {
            seq_len: 2,
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("--seq-len")
        );
        let bad = SyntheticConfig {
            learning_rate: 0.0,
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("--learning-rate")
        );
    }

    #[test]
    fn memory_implausible_configs_are_refused_with_the_estimate() {
        let small = Available {
            bytes: 4.0 * GIB,
            source: "test".into(),
        };
        let paper = SyntheticConfig::default();
        paper.check_memory(None, false, &small).unwrap();
        for engine in [EngineKind::Dense, EngineKind::Subspace] {
            paper.check_memory(Some(engine), true, &small).unwrap();
        }
        // d = 20000: W in f32 alone is 1.5 GiB; the engines' copies take it past 4 GiB.
        let wide = SyntheticConfig {
            embed_dim: 20_000,
            ..Default::default()
        };
        let msg = wide
            .check_memory(Some(EngineKind::Dense), false, &small)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("--embed-dim 20000 (with")
                && msg.contains("--engine dense) needs about 9.") // 24·d² = 8.9 GiB + tokens
                && msg.contains("4.0 GiB available (test)"),
            "{msg}"
        );
        let estimate = wide.memory_estimate(EngineKind::Dense, false);
        assert_eq!(estimate.key_query, 24.0 * 4e8);
        // Absurd flags do not overflow.
        let absurd = SyntheticConfig {
            embed_dim: usize::MAX,
            ..Default::default()
        };
        let msg = absurd.validate().unwrap_err().to_string();
        assert!(
            msg.contains("--embed-dim") && msg.contains("whichever --engine"),
            "{msg}"
        );
        // The attention trace counts only when asked for.
        let long = SyntheticConfig {
            num_steps: 1 << 30,
            ..Default::default()
        };
        long.check_memory(Some(EngineKind::Subspace), false, &small)
            .unwrap();
        let msg = long
            .check_memory(Some(EngineKind::Subspace), true, &small)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("attention trace of --num-steps 1073741824"),
            "{msg}"
        );
    }

    #[test]
    fn committed_presets_parse_and_validate() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/synthetic");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let config = SyntheticConfig::from_toml_file(&path).unwrap();
            config.validate().unwrap();
            seen += 1;
        }
        assert!(
            seen >= 4,
            "expected the four named settings in {}",
            dir.display()
        );
        let paper = SyntheticConfig::from_toml_file(&dir.join("paper-final.toml")).unwrap();
        assert_eq!(paper, SyntheticConfig::default());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "embed_dimm = 3\n").unwrap();
        let msg = SyntheticConfig::from_toml_file(&path)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("bad.toml") && msg.contains("embed_dimm"),
            "{msg}"
        );
    }
}
