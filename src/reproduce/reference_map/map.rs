//! The regime map on one dataset's tokens: its ladder, seeds and clock, one run per point, kept
//! runs checked against the tokens they were drawn from.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::judge::{CheckpointReading, MapCall, call};
use super::tokens::{NoiseBasis, SEQ_LEN, plant, relevant_token_ceiling};
use crate::io::{ensure_dir, read_input_text, write_json};
use crate::rng::{Stream, stream};
use crate::synthetic::{EngineKind, SyntheticConfig, Trace, run_on_sets};
use crate::train::progress::Progress;
use crate::train::run::FinetuneJob;
use crate::train::snr_plant::{ModeTokens, mode_tokens};

/// The map's n·SNR² ladder.
pub const LADDER: [f64; 6] = [0.3, 1.0, 3.0, 10.0, 30.0, 100.0];
/// The map's sizes (smaller first).
pub const SIZES: [usize; 2] = [20, 200];
pub const SEEDS: [u64; 3] = [0, 1, 2];
/// Held-out samples in each test set.
pub const TEST_N: usize = 1000;
/// The paper's lr·‖μ‖² and its steps at T 8.
pub const CLOCK: f64 = 5e-3 * 400.0;
pub const CLOCK_STEPS: usize = 1000;
const RHO: f64 = 0.1;
pub(super) const NOISY_ETA: f64 = 0.2;

/// One run of the map.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MapRun {
    pub dataset: String,
    pub backbone: String,
    /// The tokens' mode (the map's own runs: head; absent in files made before it was recorded).
    #[serde(default = "head_mode")]
    pub mode: String,
    pub n: usize,
    pub n_snr2: f64,
    pub seed: u64,
    /// The half-step check: half the step, twice the steps.
    pub half_step: bool,
    /// Digest of the fine-tune and test tokens the noise was drawn from.
    pub tokens_digest: String,
    pub config: SyntheticConfig,
    /// Which computation trained it (absent in files made before it was recorded: subspace).
    #[serde(default = "subspace")]
    pub engine: EngineKind,
    /// Test accuracy of attention entirely on x₁.
    pub ceiling: f64,
    /// At S, 2S and 4S.
    pub checkpoints: Vec<CheckpointReading>,
    pub call: MapCall,
}

pub(super) fn subspace() -> EngineKind {
    EngineKind::Subspace
}

fn head_mode() -> String {
    crate::train::run::Mode::Head.name().to_string()
}

/// A part of the map's stream: 0 the basis, then the draws and the labels.
fn substream(seed: u64, part: u64) -> ChaCha8Rng {
    let mut rng = stream(seed, Stream::ReferenceMap);
    rng.set_word_pos(u128::from(part) << 48);
    rng
}

/// One seed's noise: the fine-tune set's (the largest n's; smaller n take its first samples) and
/// the test set's, in one basis.
pub(super) struct SeedNoise {
    dim: usize,
    train: Vec<f32>,
    test: Vec<f32>,
}

/// One seed's noise for training sets of up to `largest` samples.
pub(super) fn seed_noise(tokens: &ModeTokens, seed: u64, largest: usize) -> Result<SeedNoise> {
    let basis = NoiseBasis::fit(&tokens.test, seed)?;
    // Samples shorter than T are passed over (short questions, in TREC).
    let long_enough = |rows: &crate::encoder::layer_rows::LayerRows| {
        rows.lengths().iter().filter(|&&l| l >= SEQ_LEN).count()
    };
    let test_n = long_enough(&tokens.test).min(TEST_N);
    Ok(SeedNoise {
        dim: tokens.test.dim(),
        train: basis
            .draw(&tokens.finetune, largest, &mut substream(seed, 1))
            .context("the fine-tune tokens")?,
        test: basis
            .draw(&tokens.test, test_n, &mut substream(seed, 2))
            .context("the test tokens")?,
    })
}

/// Doublings past S a run takes first, and at most.
const FIRST_DOUBLINGS: u32 = 2;
const MOST_DOUBLINGS: u32 = 4;

/// The run's config: ‖μ‖ from n·SNR² (SNR = ‖μ‖/√d at tr Σ̂ = d), lr and steps from the clock,
/// checkpoints at S·2^j up to S·2^`doublings`, at label-noise rate `eta` (the map's runs: 0.2;
/// a twin's clean runs: 0).
fn config_at(
    (n, n_snr2, seed): (usize, f64, u64),
    eta: f64,
    (dim, test_n): (usize, usize),
    (half, doublings): (bool, u32),
) -> SyntheticConfig {
    let signal_norm = (n_snr2 * dim as f64 / n as f64).sqrt();
    let scale = if half { 2 } else { 1 };
    SyntheticConfig {
        seq_len: SEQ_LEN,
        embed_dim: dim,
        train_n: n,
        test_n,
        rho: RHO,
        signal_norm,
        noise_ratio: eta,
        learning_rate: CLOCK / (signal_norm * signal_norm) / scale as f64,
        num_steps: (1 << doublings) * CLOCK_STEPS * scale,
        log_interval: CLOCK_STEPS * scale,
        seed,
        ..SyntheticConfig::default()
    }
}

/// Trains one run by `engine` and judges it.
fn run_point(
    noise: &SeedNoise,
    config: &SyntheticConfig,
    engine: EngineKind,
) -> Result<(f64, Vec<CheckpointReading>, MapCall)> {
    let d = noise.dim;
    let n = config.train_n;
    let law = (config.rho, config.signal_norm);
    let train_noise = noise.train[..n * SEQ_LEN * d].to_vec();
    // Labels depend on (seed, n) only: along the ladder only ‖μ‖ changes.
    let train = plant(
        train_noise,
        d,
        law,
        config.noise_ratio,
        &mut substream(config.seed, 10 + n as u64),
    );
    let test = plant(
        noise.test.clone(),
        d,
        law,
        0.0,
        &mut substream(config.seed, 3),
    );
    let ceiling = relevant_token_ceiling(&test);
    let made = run_on_sets(config, engine, Trace::Checkpoints, (train, test))?;
    let checkpoints: Vec<CheckpointReading> = made
        .metrics
        .iter()
        .filter(|m| m.step > 0 && (m.step / config.log_interval).is_power_of_two())
        .map(CheckpointReading::of)
        .collect();
    let said = call(&checkpoints, ceiling, config.test_n);
    Ok((ceiling, checkpoints, said))
}

fn run_file(out: &Path, dataset: &str, n: usize, n_snr2: f64, seed: u64, half: bool) -> PathBuf {
    let tail = if half { "_half" } else { "" };
    out.join("runs")
        .join(format!("{dataset}_n{n}_x{n_snr2}_s{seed}{tail}.json"))
}

/// The kept run at `path` if it is this one (`engine` included).
pub(super) fn kept(
    path: &Path,
    (config, engine): (&SyntheticConfig, EngineKind),
    digest: &str,
) -> Result<Option<MapRun>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = read_input_text(path, crate::io::limits::SMALL_TEXT)?;
    let run: MapRun = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a reference-map run file", path.display()))?;
    let made_under_rule = call(&run.checkpoints, run.ceiling, run.config.test_n) == run.call;
    if run.config != *config
        || run.engine != engine
        || run.tokens_digest != digest
        || !made_under_rule
    {
        bail!(
            "{}: made from another config, other tokens or another rule than this map's (remove \
             it or choose another --out)",
            path.display()
        );
    }
    Ok(Some(run))
}

/// Every run kept in `out`, whatever its dataset (for a report of a map not finished yet).
pub fn kept_runs(out: &Path) -> Result<Vec<MapRun>> {
    let dir = out.join("runs");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("{}: no runs of a reference map", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let text = read_input_text(path, crate::io::limits::SMALL_TEXT)?;
            serde_json::from_str(&text)
                .with_context(|| format!("{}: not a reference-map run file", path.display()))
        })
        .collect()
}

/// What every run of one dataset's map shares.
pub(super) struct MapSource<'a> {
    out: &'a Path,
    dataset: &'a str,
    backbone: &'a str,
    /// Which tokens: the final ones (head) or the last layer's inputs (last-layer).
    mode: &'a str,
    /// Digest of the tokens the noise is drawn from.
    digest: &'a str,
    /// The engine a run's config is trained by.
    engine: fn(&SyntheticConfig) -> EngineKind,
}

/// The map's engine: the subspace one, which its kept runs were made by.
fn map_engine(_: &SyntheticConfig) -> EngineKind {
    EngineKind::Subspace
}

/// The cheaper of the two engines for `config`: the subspace one costs (nT)² a step, the dense
/// one d² + nT·d; they train the same trajectory up to rounding.
pub fn cheaper_engine(config: &SyntheticConfig) -> EngineKind {
    let (m, d) = (config.train_n * config.seq_len, config.embed_dim);
    if d * d + m * d < m * m {
        EngineKind::Dense
    } else {
        EngineKind::Subspace
    }
}

impl MapSource<'_> {
    /// The run at `point`, read back where it is kept, else made (longer where the first try had
    /// not settled) and kept.
    fn run(&self, noise: &SeedNoise, point: (usize, f64, u64), half: bool) -> Result<MapRun> {
        let (n, n_snr2, seed) = point;
        let path = run_file(self.out, self.dataset, n, n_snr2, seed, half);
        self.run_at(noise, (point, NOISY_ETA, half), &path)
    }

    /// The run at (`point`, η, half step) kept at `path`: read back where it is there, else made
    /// and kept.
    pub(super) fn run_at(
        &self,
        noise: &SeedNoise,
        (point, eta, half): ((usize, f64, u64), f64, bool),
        path: &Path,
    ) -> Result<MapRun> {
        let (n, n_snr2, seed) = point;
        let shape = (noise.dim, noise.test.len() / (SEQ_LEN * noise.dim));
        let first = config_at(point, eta, shape, (half, FIRST_DOUBLINGS));
        let longer = config_at(point, eta, shape, (half, MOST_DOUBLINGS));
        let engine = (self.engine)(&first);
        let found = match kept(path, (&first, engine), self.digest) {
            Ok(found) => found,
            Err(_) => kept(path, (&longer, engine), self.digest)?,
        };
        if let Some(run) = found {
            return Ok(run);
        }
        let (mut config, mut made) = (first.clone(), run_point(noise, &first, engine)?);
        if made.2 == MapCall::Unconverged {
            (config, made) = (longer.clone(), run_point(noise, &longer, engine)?);
        }
        let (ceiling, checkpoints, call) = made;
        let run = MapRun {
            dataset: self.dataset.to_string(),
            backbone: self.backbone.to_string(),
            mode: self.mode.to_string(),
            n,
            n_snr2,
            seed,
            half_step: half,
            tokens_digest: self.digest.to_string(),
            config,
            engine,
            ceiling,
            checkpoints,
            call,
        };
        write_json(path, &run)?;
        Ok(run)
    }
}

/// What names a source's runs: its dataset and backbone, and the digest of its tokens.
pub(super) struct SourceNames {
    dataset: String,
    backbone: String,
    digest: String,
}

impl SourceNames {
    pub(super) fn source<'a>(
        &'a self,
        out: &'a Path,
        job: &FinetuneJob,
        engine: fn(&SyntheticConfig) -> EngineKind,
    ) -> MapSource<'a> {
        MapSource {
            out,
            dataset: &self.dataset,
            backbone: &self.backbone,
            mode: job.config.mode.name(),
            digest: &self.digest,
            engine,
        }
    }
}

/// `job`'s tokens (from the feature cache where they are there) and their names; `out`/runs
/// made.
pub(super) fn source_tokens(
    job: &FinetuneJob,
    out: &Path,
    progress: &dyn Progress,
) -> Result<(ModeTokens, SourceNames)> {
    let tokens = mode_tokens(job, TEST_N, progress)?;
    let names = SourceNames {
        dataset: job.config.dataset.to_string(),
        backbone: tokens.backbone.clone(),
        digest: format!(
            "{}+{}",
            tokens.finetune.content_digest(),
            tokens.test.content_digest()
        ),
    };
    ensure_dir(&out.join("runs"))?;
    Ok((tokens, names))
}

/// Every run of one dataset's map, kept ones read back; `on_done` after each.
pub fn dataset_map(
    job: &FinetuneJob,
    out: &Path,
    progress: &dyn Progress,
    on_done: &dyn Fn(&MapRun),
) -> Result<Vec<MapRun>> {
    let (tokens, names) = source_tokens(job, out, progress)?;
    let source = names.source(out, job, map_engine);
    let mut runs = Vec::new();
    for seed in SEEDS {
        let noise = seed_noise(&tokens, seed, SIZES[SIZES.len() - 1])?;
        for n in SIZES {
            for n_snr2 in LADDER {
                // The half-step check on the first seed only.
                for half in [false, true]
                    .into_iter()
                    .filter(|&h| !h || seed == SEEDS[0])
                {
                    crate::interrupt::check()?;
                    let run = source.run(&noise, (n, n_snr2, seed), half)?;
                    on_done(&run);
                    runs.push(run);
                }
            }
        }
    }
    Ok(runs)
}
