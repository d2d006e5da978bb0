//! Hyper-parameters of the synthetic token-selection experiment (PAPER.md §2.4), with the authors'
//! final config (`config/main.yaml`, HEAD c563aae) as defaults.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

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
            noise_ratio: 0.2,
            learning_rate: 5e-3,
            num_steps: 1000,
            seed: 42,
            paper_test_seed: false,
            log_interval: 10,
            locater: 0.0,
        }
    }
}

impl SyntheticConfig {
    /// Reads a TOML file with any subset of the keys above; missing keys keep the paper defaults.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read config", path.display()))?;
        toml::from_str(&text).map_err(|err| {
            let msg = err.message().replace('\n', " ");
            anyhow::anyhow!("{}: invalid synthetic config: {msg}", path.display())
        })
    }

    /// SNR := ‖μ‖ / (σ_ε √d) with σ_ε = 1 (PAPER.md §2.5).
    pub fn snr(&self) -> f64 {
        self.signal_norm / (self.embed_dim as f64).sqrt()
    }

    /// Rejects values outside the model's domain, naming the flag and the expected range.
    pub fn validate(&self) -> Result<()> {
        let unit = |ok: bool, flag: &str, expected: &str, got: String| -> Result<()> {
            if ok {
                Ok(())
            } else {
                bail!("--{flag} must be {expected}, got {got}")
            }
        };
        unit(
            self.seq_len >= 3,
            "seq-len",
            "at least 3 (x_1, x_2, x_3 are fixed roles)",
            self.seq_len.to_string(),
        )?;
        unit(
            self.embed_dim >= 2,
            "embed-dim",
            "at least 2 (μ_{±1} use e_1 and e_2)",
            self.embed_dim.to_string(),
        )?;
        unit(
            self.train_n >= 2,
            "train-n",
            "at least 2 (one sample per class)",
            self.train_n.to_string(),
        )?;
        unit(
            self.test_n >= 1,
            "test-n",
            "at least 1",
            self.test_n.to_string(),
        )?;
        unit(
            self.rho.is_finite() && self.rho >= 0.0,
            "rho",
            "a finite number ≥ 0",
            self.rho.to_string(),
        )?;
        unit(
            self.signal_norm.is_finite() && self.signal_norm > 0.0,
            "signal-norm",
            "a finite number > 0 (the head ν is scaled by 1/‖μ‖)",
            self.signal_norm.to_string(),
        )?;
        unit(
            (0.0..=0.5).contains(&self.noise_ratio),
            "noise-ratio",
            "in [0, 0.5]",
            self.noise_ratio.to_string(),
        )?;
        unit(
            self.learning_rate.is_finite() && self.learning_rate > 0.0,
            "learning-rate",
            "a finite number > 0",
            self.learning_rate.to_string(),
        )?;
        unit(
            self.num_steps >= 1,
            "num-steps",
            "at least 1",
            self.num_steps.to_string(),
        )?;
        unit(
            self.log_interval >= 1,
            "log-interval",
            "at least 1",
            self.log_interval.to_string(),
        )?;
        unit(
            self.locater.is_finite() && self.locater >= 0.0,
            "locater",
            "a finite number ≥ 0",
            self.locater.to_string(),
        )?;
        Ok(())
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
