//! `finetune`: one run of the paper's real-data protocol.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use super::common_args::{PlaceArgs, once_each};
use crate::data::DatasetName;
use crate::data::noise::NoiseModel;
use crate::report;
use crate::rng::RngChoice;
use crate::train::config_file::ConfigFile;
use crate::train::overrides::RunOverrides;
use crate::train::progress::Progress;
use crate::train::run::{FinetuneJob, HeadClassifier, Mode, RunConfig, RunFolder};

#[derive(Args, Debug)]
pub struct FinetuneArgs {
    /// Settings from a file (TOML, or JSON such as a run folder's config.json): any key a run
    /// records, over the dataset's paper defaults; flags given beside it override it
    /// (docs/usage.md, "Settings in a file")
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Dataset name (mnist, cifar10, pneumoniamnist, breastmnist, ag_news, trec, stl10, sst2, a
    /// MedMNIST 2D task), or your own files: folder:PATH, csv:PATH, jsonl:PATH, hf:PATH or hf:ORG/NAME (docs/data.md)
    /// [default: the --config file's]
    #[arg(long)]
    pub dataset: Option<DatasetName>,
    /// csv:/jsonl: datasets: the column holding the text, by header name or 0-based index (CSV),
    /// or key (JSONL) [default: text]
    #[arg(long, value_name = "COLUMN")]
    pub text_column: Option<String>,
    /// csv:/jsonl: datasets: the column holding the label (integers in numeric order, else
    /// words in byte order, become the classes) [default: label]
    #[arg(long, value_name = "COLUMN")]
    pub label_column: Option<String>,
    /// Label-noise rate η ∈ [0, 1) on the fine-tune set; several, comma-separated, train together
    /// in one pass, one run folder each under --out/runs/ (named as `reproduce` names them)
    /// [default: the --config file's]
    #[arg(long, allow_hyphen_values = true, value_delimiter = ',')]
    pub eta: Vec<f64>,
    /// Fine-tune (noisy) samples [default: configs/<dataset>.toml, 200]
    #[arg(long)]
    pub n: Option<usize>,
    /// Clean phase-1 samples [default: configs/<dataset>.toml; shrunk to fit partial data]
    #[arg(long, value_name = "N")]
    pub pretrain_n: Option<usize>,
    /// Phase-2 epochs [default: 2000]
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Phase-1 epochs [default: 300]
    #[arg(long, value_name = "EPOCHS")]
    pub pretrain_epochs: Option<usize>,
    /// Seed of the split, the label noise, the initialisations and the batch order; several,
    /// comma-separated, train together as several η do (every η at every seed) [default: 42]
    #[arg(long, value_delimiter = ',')]
    pub seed: Vec<u64>,
    /// Whose random draws pick the split, the label noise and both phases' batch orders: `own`
    /// (ChaCha8 streams) or `authors` (numpy and torch draws as the authors' code makes them,
    /// docs/protocol.md §3.1; the initialisations stay ours, recorded as a deviation) [default: own]
    #[arg(long, value_enum)]
    pub rng: Option<RngChoice>,
    /// Backbone hub id or folder [default: the config's preference list, paper's first]
    #[arg(long, value_name = "ID")]
    pub backbone: Option<String>,
    /// `last-layer`: the paper (query/key of the last layer); `head`: the card's token-selection
    /// head [default: last-layer]
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Head mode: what the phase-1 classifier is trained on: `mean` (mean-pooled final tokens),
    /// `cls` (the CLS / position-0 token) or `tokens` (every token, labelled with its sample's
    /// label) [default: tokens; see docs/results.md, head mode]
    #[arg(long, value_enum)]
    pub head_classifier: Option<HeadClassifier>,
    /// symmetric, pair, or cifar10n:aggre|random1|random2|random3|worse [default: symmetric]
    #[arg(long)]
    pub noise: Option<NoiseModel>,
    /// Subsample the test split to this many samples [default: all]
    #[arg(long, value_name = "M")]
    pub test_n: Option<usize>,
    /// Score the test set every K epochs (and after the last) [default: 50]
    #[arg(long, value_name = "K")]
    pub eval_every: Option<usize>,
    /// Split the test file into disjoint train and test pools (for AG-news offline); a deviation
    #[arg(long, value_name = "F")]
    pub carve_train_from_test: Option<f64>,
    /// Write metrics.jsonl, pretrain.jsonl, attention_maps.png, summary.json and the checkpoint
    /// here; with several η or seeds, each run's into DIR/runs/<run>
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub places: PlaceArgs,
    /// Inputs per backbone batch when filling the cache
    #[arg(long, value_name = "N", default_value_t = FinetuneJob::ENCODE_BATCH)]
    pub encode_batch: usize,
    /// Add [CLS]/[SEP] when tokenizing (the authors did not)
    #[arg(long)]
    pub special_tokens: bool,
    /// Write a checkpoint to --out every K phase-2 epochs (and after phase 1 and the last epoch); 0: none
    #[arg(long, value_name = "K", default_value_t = FinetuneJob::CHECKPOINT_EVERY)]
    pub checkpoint_every: usize,
    /// Continue from the checkpoint in --out (bit for bit); starts afresh if there is none. With
    /// several runs, each from its own folder's; runs stopped after different epochs train apart
    #[arg(long, requires = "out")]
    pub resume: bool,
    /// CPU threads for phase 1 and phase 2's autograd route (small ops: one is fastest on few
    /// cores); extraction and the last layer's host pass use every core [default: 1]
    #[arg(long, value_name = "N")]
    pub train_threads: Option<usize>,
    /// λ of the LocAteR penalty on the trained query-key matrix: the variance of the eigenvalues of
    /// its symmetric part, mean over heads (docs/design.md, localization diagnostics) [default: 0, the paper: none]
    #[arg(long, value_name = "LAMBDA", allow_negative_numbers = true)]
    pub locater: Option<f64>,
    /// The SNR dose k: to every fine-tune and test token the mode's phase 2 selects from, noise
    /// of k times the tokens' own covariance, drawn once per sample and seed, so SNR² becomes
    /// SNR² / (1 + k) and nothing else changes (docs/design.md, "The SNR dose") [default: 0]
    #[arg(long, value_name = "K", allow_negative_numbers = true)]
    pub token_noise: Option<f64>,
}

impl FinetuneArgs {
    /// The runs these flags describe: the dataset's paper defaults with the flags on top, one per
    /// seed and η (seed-major, as `reproduce` orders a grid).
    pub(super) fn jobs(&self) -> Result<Vec<FinetuneJob>> {
        let (base, file_sets_eta) = self.base()?;
        let eta = match (&self.eta[..], file_sets_eta) {
            ([], true) => vec![base.eta],
            ([], false) => bail!("--eta: required (or give `eta` in a --config file)"),
            (given, _) => given.to_vec(),
        };
        let seed = match &self.seed[..] {
            [] => vec![base.seed],
            given => given.to_vec(),
        };
        once_each("--eta", &eta)?;
        once_each("--seed", &seed)?;
        let configs: Vec<RunConfig> = seed
            .iter()
            .flat_map(|&seed| eta.iter().map(move |&eta| (eta, seed)))
            .map(|(eta, seed)| self.run_config(&base, eta, seed))
            .collect();
        let several = configs.len() > 1;
        if let Some(out) = &self.out {
            RunFolder::check_layout(out, several)?;
        }
        configs
            .into_iter()
            .map(|config| {
                let out = match (&self.out, several) {
                    (Some(out), true) => Some(RunFolder::among_runs(out, &config)?.0),
                    (out, _) => out.clone(),
                };
                // A run (or a stack) alone: every core of the process's pool
                // (RAYON_NUM_THREADS, else all), as `new` gives.
                let job = FinetuneJob {
                    out,
                    checkpoint_every: self.checkpoint_every,
                    resume: self.resume,
                    encode_batch: self.encode_batch,
                    ..FinetuneJob::new(config, self.places.places())
                };
                job.validate()?;
                Ok(job)
            })
            .collect()
    }

    /// What the flags overlay: the dataset's paper run (configs/<dataset>.toml), overlaid by the
    /// --config file if there is one; and whether that file sets η (the paper's η 0 is no default:
    /// a run's η is always asked for).
    fn base(&self) -> Result<(RunConfig, bool)> {
        let file = self.config.as_deref().map(ConfigFile::read).transpose()?;
        let from_file = file
            .as_ref()
            .map(ConfigFile::dataset)
            .transpose()?
            .flatten();
        let Some(dataset) = self.dataset.clone().or(from_file) else {
            bail!("--dataset: required (or give `dataset` in a --config file)");
        };
        let dataset = dataset
            .with_columns(self.text_column.as_deref(), self.label_column.as_deref())
            .map_err(anyhow::Error::msg)?;
        let paper = RunConfig::paper(&dataset)?;
        match file {
            Some(file) => Ok((file.overlay(&paper)?, file.sets("eta"))),
            None => Ok((paper, false)),
        }
    }

    /// One run's configuration: the flags given, over `base`.
    fn run_config(&self, base: &RunConfig, eta: f64, seed: u64) -> RunConfig {
        let config = base.overlay(&self.overrides(eta, seed));
        RunConfig {
            head_classifier: HeadClassifier::for_mode(config.mode, config.head_classifier),
            ..config
        }
    }

    /// What the flags change of a run (η and the seed are always given: a list's entry).
    fn overrides(&self, eta: f64, seed: u64) -> RunOverrides {
        RunOverrides {
            mode: self.mode,
            head_classifier: self.head_classifier,
            noise: self.noise,
            eta: Some(eta),
            n: self.n,
            pretrain_n: self.pretrain_n,
            test_n: self.test_n,
            seed: Some(seed),
            rng: self.rng,
            epochs: self.epochs,
            pretrain_epochs: self.pretrain_epochs,
            eval_every: self.eval_every,
            carve_train_from_test: self.carve_train_from_test,
            backbones: self.backbone.clone().map(|id| vec![id]),
            // A switch: given, it turns the special tokens on; absent, the base decides.
            special_tokens: self.special_tokens.then_some(true),
            locater: self.locater,
            token_noise: self.token_noise,
            train_threads: self.train_threads,
            device: self.places.device,
            precision: self.places.precision,
            train_device: self.places.train_device,
            // No flag sets the batch, the optimizer or the files' digest: a --config file does.
            ..RunOverrides::default()
        }
    }
}

pub fn run(args: FinetuneArgs) -> Result<()> {
    let jobs = args.jobs()?;
    let stacks = crate::train::stack_plan::fitting(&jobs, None)?;
    let bars = report::finetune::Bars::default();
    if stacks.len() > 1 {
        eprintln!(
            "{} runs in {} stacks, one after another: together they would not fit this process's \
             memory or open files",
            jobs.len(),
            stacks.len()
        );
    }
    let mut failed = 0;
    for stack in &stacks {
        let members: Vec<FinetuneJob> = stack.iter().map(|&k| jobs[k].clone()).collect();
        failed += run_stack(&members, &bars, jobs.len() == 1)?;
    }
    if failed > 0 {
        bail!(
            "{failed} of {} runs failed (each said why above)",
            jobs.len()
        );
    }
    Ok(())
}

/// Trains one stack and writes its runs' files; the number of runs that failed (each named on
/// stderr). A lone run's error is the command's.
fn run_stack(jobs: &[FinetuneJob], bars: &report::finetune::Bars, lone: bool) -> Result<usize> {
    // With --out, each run's TensorBoard events are written as it trains.
    let events: Vec<Option<report::tensorboard::TensorBoard>> = jobs
        .iter()
        .map(|job| {
            job.out
                .as_deref()
                .map(|out| report::tensorboard::TensorBoard::new(out, bars))
        })
        .collect();
    let progress: Vec<&dyn Progress> = events
        .iter()
        .map(|events| match events {
            Some(events) => events as &dyn Progress,
            None => bars as &dyn Progress,
        })
        .collect();
    let results = crate::train::finetune::finetune_stack(jobs, &progress)?;
    if lone && let Some(Err(_)) = results.first() {
        return results.into_iter().next().map_or(Ok(0), |r| r.map(|_| 0));
    }
    let mut failed = 0;
    for ((job, events), result) in jobs.iter().zip(&events).zip(results) {
        match result {
            Ok(run) => finish(job, events.as_ref(), &run)?,
            Err(err) => {
                failed += 1;
                eprintln!(
                    "{}: {}",
                    job.config.run_name()?,
                    crate::errors::one_line(&err)
                );
            }
        }
    }
    Ok(failed)
}

/// A finished run's files, its summary on stdout, and its result line on stderr.
fn finish(
    job: &FinetuneJob,
    events: Option<&report::tensorboard::TensorBoard>,
    run: &crate::train::finetune::FinetuneRun,
) -> Result<()> {
    for deviation in &run.summary.deviations {
        eprintln!("note: {deviation}");
    }
    if let Some(out) = &job.out {
        report::finetune::write_run(out, run, events)?;
    }
    println!("{}", serde_json::to_string(&run.summary)?);
    let s = &run.summary;
    eprintln!(
        "{} {} η {}: baseline {:.3}, train loss {:.3}, {}, test {:.3} ({:.0} s)",
        s.config.dataset,
        s.resolved.backbone,
        s.config.eta,
        s.baseline_test_acc,
        s.last.train_loss,
        report::finetune::memorization(s.last.memorization),
        s.test_acc(),
        s.wall_seconds
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// Every default `finetune --help` states is the one a run takes: the paper's run
    /// (`RunConfig::paper`, configs/<dataset>.toml) and the flags' own; and a run with no flag
    /// beyond --dataset and --eta records exactly that run.
    #[test]
    fn help_defaults_are_the_run_defaults() {
        let mut command = super::super::Cli::command();
        let finetune = command.find_subcommand_mut("finetune").unwrap();
        let paper = RunConfig::paper(&DatasetName::Cifar10).unwrap();
        let help_of = |id: &str| {
            let arg = finetune
                .get_arguments()
                .find(|a| a.get_id() == id)
                .unwrap_or_else(|| panic!("no --{id}"));
            arg.get_help().map(|h| h.to_string()).unwrap_or_default()
        };
        let stated = [
            ("seed", paper.seed.to_string()),
            ("rng", "own".to_string()),
            ("mode", "last-layer".to_string()),
            ("noise", paper.noise.to_string()),
            ("eval_every", paper.eval_every.to_string()),
            ("train_threads", paper.train_threads.to_string()),
            ("locater", paper.locater.to_string()),
            ("device", "cpu".to_string()),
        ];
        for (id, value) in stated {
            let help = help_of(id);
            assert!(
                help.contains(&format!("[default: {value}")),
                "--{id}: {help}"
            );
        }
        assert_eq!(
            (paper.rng, paper.mode, paper.device),
            (
                RngChoice::Own,
                Mode::LastLayer,
                crate::runtime::DeviceKind::Cpu
            )
        );
        let args = super::super::Cli::try_parse_from([
            "benign-attention",
            "finetune",
            "--dataset",
            "cifar10",
            "--eta",
            "0",
        ])
        .unwrap();
        let super::super::Command::Finetune(args) = args.command else {
            panic!("not finetune")
        };
        let jobs = args.jobs().unwrap();
        assert_eq!(jobs[0].config, paper.with_noise_draw());
        // A --config file without `eta` and no --eta: refused, not run at the paper's η 0.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lab.toml");
        std::fs::write(&file, "dataset = \"cifar10\"\nn = 20\n").unwrap();
        let parsed = super::super::Cli::try_parse_from([
            "benign-attention",
            "finetune",
            "--config",
            file.to_str().unwrap(),
        ])
        .unwrap();
        let super::super::Command::Finetune(args) = parsed.command else {
            panic!("not finetune")
        };
        let err = format!("{:#}", args.jobs().unwrap_err());
        assert!(err.contains("--eta: required"), "{err}");
    }
}
