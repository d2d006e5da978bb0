//! The grid driver: experiments and budgets, the runs a grid plans, the cache filled once, stacks
//! trained and written, shard folders merged.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::data::{self, DatasetName};
use crate::report::results::{RUNS, collect};
use crate::rng::RngChoice;
use crate::runtime::DeviceKind;
use crate::shard::JobShard;
use crate::train::finetune::finetune_stack;
use crate::train::overrides::RunOverrides;
use crate::train::progress::Progress;
use crate::train::run::{FinetuneJob, HeadClassifier, Mode, Places, RunConfig, RunFolder};
use crate::train::setup::fill_cache;
use crate::train::stack_plan;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Experiment {
    /// Datasets × n × η × seeds (docs/protocol.md §4.1).
    Table2,
    /// η from 0 to 0.2 in steps of 0.01 at n = 200, seed 42.
    Fig8,
    /// Per-epoch max CLS attention, n = 200, η = 0.1 (the code's default noise), seed 42.
    Fig9,
    /// The SNR dose (docs/design.md, "The SNR dose"): datasets × token noise k ({0, 1, 3, 9,
    /// 24}) × n (200, 1000) × η (0, 0.2) × seeds (42, 314, 2718), head mode unless asked.
    Dose,
}

/// The doses of [`Experiment::Dose`] unless `--token-noises` names others: SNR² divided by
/// 1, 2, 4, 10 and 25.
pub const DOSES: [f64; 5] = [0.0, 1.0, 3.0, 9.0, 24.0];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Budget {
    /// The paper's sizes and epochs.
    #[default]
    Paper,
    /// Scaled so that Table 2 of the six datasets runs in about half an hour on two cores.
    Quick,
}

/// What `--budget quick` changes; the report prints what each run used.
pub mod quick {
    pub const PRETRAIN_N: usize = 500;
    pub const TEST_N: usize = 500;
    pub const PRETRAIN_EPOCHS: usize = 300;
    pub const EPOCHS: usize = 50;
    pub const EVAL_EVERY: usize = 10;
}

impl Budget {
    /// What the budget changes of `paper`'s run, whose test set holds `test_len` samples.
    pub fn overrides(self, paper: &RunConfig, test_len: Option<usize>) -> RunOverrides {
        match self {
            Budget::Paper => RunOverrides::default(),
            Budget::Quick => RunOverrides {
                pretrain_n: Some(paper.pretrain_n.min(quick::PRETRAIN_N)),
                test_n: test_len.map(|t| t.min(quick::TEST_N)),
                epochs: Some(quick::EPOCHS),
                pretrain_epochs: Some(quick::PRETRAIN_EPOCHS),
                eval_every: Some(quick::EVAL_EVERY),
                ..RunOverrides::default()
            },
        }
    }
}

/// The AG-news training file is not offline: its runs carve a training pool from the test split
/// (a recorded deviation) with this fraction.
pub const CARVE_FRACTION: f64 = 0.5;

/// The grid of one experiment; `None` fields take the experiment's defaults.
#[derive(Clone, Debug)]
pub struct Grid {
    pub experiment: Experiment,
    pub datasets: Vec<DatasetName>,
    pub seeds: Vec<u64>,
    pub ns: Vec<usize>,
    pub etas: Vec<f64>,
    pub budget: Budget,
    pub mode: Mode,
    /// Head mode's phase-1 classifier (`HeadClassifier::for_mode`); `None` in last-layer mode.
    pub head_classifier: Option<HeadClassifier>,
}

impl Grid {
    pub fn new(
        experiment: Experiment,
        datasets: Option<Vec<DatasetName>>,
        seeds: Option<Vec<u64>>,
        ns: Option<Vec<usize>>,
        etas: Option<Vec<f64>>,
        budget: Budget,
        mode: Mode,
    ) -> Result<Self> {
        let (default_seeds, default_ns, default_etas): (Vec<u64>, Vec<usize>, Vec<f64>) =
            match experiment {
                Experiment::Table2 => (vec![42, 314, 2718], vec![20, 200, 1000], vec![0.0, 0.2]),
                Experiment::Fig8 => (
                    vec![crate::report::reproduce::FIG8_SEED],
                    vec![crate::report::reproduce::FIG8_N],
                    (0..=20).map(|k| f64::from(k) / 100.0).collect(),
                ),
                Experiment::Fig9 => (vec![42], vec![200], vec![0.1]),
                Experiment::Dose => (vec![42, 314, 2718], vec![200, 1000], vec![0.0, 0.2]),
            };
        // A value given twice is one grid point, not two runs in one folder.
        fn distinct<T: PartialEq>(values: Vec<T>) -> Vec<T> {
            values.into_iter().fold(Vec::new(), |mut kept, v| {
                if !kept.contains(&v) {
                    kept.push(v);
                }
                kept
            })
        }
        let grid = Self {
            experiment,
            // Unless named: every dataset the authors fine-tuned on (those without data under the
            // data root are left out, saying so).
            datasets: distinct(datasets.unwrap_or_else(DatasetName::all)),
            seeds: distinct(seeds.unwrap_or(default_seeds)),
            ns: distinct(ns.unwrap_or(default_ns)),
            etas: distinct(etas.unwrap_or(default_etas)),
            budget,
            mode,
            head_classifier: HeadClassifier::for_mode(mode, None),
        };
        if grid.datasets.is_empty()
            || grid.seeds.is_empty()
            || grid.ns.is_empty()
            || grid.etas.is_empty()
        {
            bail!("--datasets, --seeds, --ns and --etas need at least one value each");
        }
        if let Some(why) = grid
            .etas
            .iter()
            .find_map(|&e| data::noise::eta_out_of_range(e))
        {
            bail!("--etas: every η {why}");
        }
        if grid.ns.contains(&0) {
            bail!("--ns: every n must be at least 1");
        }
        Ok(grid)
    }
}

/// One grid point.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub dataset: DatasetName,
    pub n: usize,
    pub eta: f64,
    pub seed: u64,
    /// The SNR dose k ([`RunConfig::token_noise`]); 0 outside [`Experiment::Dose`].
    pub token_noise: f64,
}

/// The grid in order (dataset, dose, η, n, seed), without points the data cannot hold
/// (BreastMNIST has no n = 1000), each with the reason it was left out.
pub fn jobs(
    grid: &Grid,
    doses: &[f64],
    pool: &dyn Fn(&DatasetName) -> Option<usize>,
) -> (Vec<Job>, Vec<String>) {
    let (mut kept, mut left_out) = (Vec::new(), Vec::new());
    for dataset in &grid.datasets {
        for &token_noise in doses {
            for &eta in &grid.etas {
                for &n in &grid.ns {
                    for &seed in &grid.seeds {
                        let job = Job {
                            dataset: dataset.clone(),
                            n,
                            eta,
                            seed,
                            token_noise,
                        };
                        match pool(dataset) {
                            Some(p) if n >= p => left_out.push(format!(
                                "{} n = {n} η = {eta} seed {seed}: n (--ns) does not fit the {p} training samples",
                                dataset.id()
                            )),
                            _ => kept.push(job),
                        }
                    }
                }
            }
        }
    }
    (kept, left_out)
}

#[derive(Clone)]
pub struct DriverOptions {
    pub grid: Grid,
    pub out: PathBuf,
    /// Stacks at once.
    pub jobs: usize,
    /// What one stack's phase 2 may hold beyond its backbone, bytes ([`stacks`]).
    pub stack_memory: f64,
    pub shard: Option<JobShard>,
    pub places: Places,
    pub device: DeviceKind,
    /// Where phases 1 and 2 run, when not on the host.
    pub train_device: Option<DeviceKind>,
    /// What the backbone's products compute in during extraction.
    pub precision: crate::kernels::Precision,
    /// Whose random draws pick each run's split, label noise and batch orders.
    pub rng: RngChoice,
    /// The SNR doses of the grid's runs (`[0]`: none, every experiment but the dose).
    pub token_noises: Vec<f64>,
}

pub struct Outcome {
    pub ran: usize,
    pub skipped: usize,
    pub failed: Vec<(String, String)>,
    pub left_out: Vec<String>,
}

impl DriverOptions {
    /// A digest of what defines the grid (its points, budget, mode, streams and device): the
    /// shards of one grid carry the same.
    pub fn grid_digest(&self) -> Result<String> {
        let mut definition = format!("{:?} {:?} {:?}", self.grid, self.rng, self.device);
        if let Some(train) = self.train_device {
            // Only where set, so that the grids made before it keep their digest.
            definition.push_str(&format!(" {train:?}"));
        }
        if self.token_noises != [0.0] {
            // Likewise: grids without a dose keep their digest.
            definition.push_str(&format!(" doses {:?}", self.token_noises));
        }
        if !self.precision.is_f32() {
            // Likewise: f32 grids keep their digest.
            definition.push_str(&format!(" precision {}", self.precision.name()));
        }
        Ok(crate::io::json_digest(&definition)?[..16].to_string())
    }

    /// The configuration of one grid point: the paper's run with the grid's values.
    pub fn run_config(&self, job: &Job, carve: bool, test_len: Option<usize>) -> Result<RunConfig> {
        let paper = RunConfig::paper(&job.dataset)?;
        let point = RunOverrides {
            mode: Some(self.grid.mode),
            head_classifier: self.grid.head_classifier,
            eta: Some(job.eta),
            seed: Some(job.seed),
            n: Some(job.n),
            carve_train_from_test: carve.then_some(CARVE_FRACTION),
            device: Some(self.device),
            train_device: self.train_device,
            precision: Some(self.precision),
            rng: Some(self.rng),
            token_noise: Some(job.token_noise),
            ..self.grid.budget.overrides(&paper, test_len)
        };
        Ok(paper.overlay(&point))
    }

    /// A grid run in its folder, named after its configuration.
    pub fn finetune_job(&self, config: RunConfig) -> Result<FinetuneJob> {
        let run_dir = RunFolder::among_runs(&self.out, &config)?.0;
        Ok(FinetuneJob {
            // A killed run continues; a fresh one starts without a note about it.
            resume: crate::train::checkpoint::path(&run_dir).exists(),
            out: Some(run_dir),
            // The cores shared among the runs going at once.
            sample_threads: (rayon::current_num_threads() / self.jobs.max(1)).max(1),
            ..FinetuneJob::new(config, self.places.clone())
        })
    }
}

/// The size of each dataset's training pool (None when unreadable: its runs will say why), and
/// whether it must be carved from the test split.
fn pools(options: &DriverOptions) -> Pools {
    let root = data::data_root(options.places.data_dir.as_deref());
    options
        .grid
        .datasets
        .iter()
        .map(|d| match data::load(d, &root) {
            Ok(ds) => match &ds.train {
                Some(train) => (d.clone(), Some(train.len()), false, Some(ds.test.len())),
                None => (
                    d.clone(),
                    Some((CARVE_FRACTION * ds.test.len() as f64).round() as usize),
                    true,
                    Some(ds.test.len()),
                ),
            },
            Err(_) => (d.clone(), None, false, None),
        })
        .collect()
}

/// Each dataset's training pool: its size (None when unreadable: its runs will say why), whether
/// it is carved from the test split, and the test samples a run scores.
type Pools = Vec<(DatasetName, Option<usize>, bool, Option<usize>)>;

/// Runs the grid (or this shard of it) and writes the report into `out`: the runs planned, the
/// shard recorded, the cache filled, the pending runs trained in stacks, then the report.
pub fn run(options: &DriverOptions, progress: &dyn Progress) -> Result<Outcome> {
    let (options, absent) = with_present_datasets(options);
    let options = &options;
    let pools = pools(options);
    let (runs, left_out) = planned_runs(options, &pools, &absent)?;
    // One reproduce per result folder, and an unwritable one refused, before any work, but
    // after the flags are known to make a grid, so a refused grid leaves no folder.
    let _only_writer = super::grid_record::lock(&options.out)?;
    record_shard(options, &runs)?;
    let finished = |run: &FinetuneJob| {
        run.out
            .as_ref()
            .is_some_and(|d| RunFolder(d.clone()).summary().exists())
    };
    let pending: Vec<(String, FinetuneJob)> =
        runs.iter().filter(|(_, r)| !finished(r)).cloned().collect();
    let skipped = runs.len() - pending.len();
    progress.line(&format!(
        "{} runs in this {}, {} already finished",
        runs.len(),
        options.shard.map_or("grid".to_string(), |s| format!(
            "shard {}/{}",
            s.index, s.count
        )),
        skipped
    ));
    fill_caches(&options.grid, &pending, progress);
    let total_pending = pending.len();
    let trained = train_stacks(options, pending, &pools, progress);
    if let Some(stop) = crate::interrupt::requested() {
        let line = format!(
            "{stop} after {} of {} runs; the same command continues the grid (a stopped run from its checkpoint)",
            trained.finished, total_pending
        );
        return Err(anyhow::Error::new(stop).context(line));
    }
    // A grid whose every run failed before writing its folder still gets its (empty) report, so
    // the failures are what the user reads, not a missing folder.
    crate::io::ensure_dir(&options.out)?;
    let runs = collect(std::slice::from_ref(&options.out))?;
    if options.grid.experiment == Experiment::Dose {
        // The dose is judged by its own pre-registered analysis (the Table 2 report's
        // synthetic twins have nothing to say about it); `reproduce report` still makes that one.
        let rows: Vec<_> = runs.into_iter().map(|(row, _)| row).collect();
        if !rows.is_empty() {
            crate::report::dose::write(&options.out, &rows)?;
        }
    } else {
        crate::report::reproduce::write_report(
            &options.out,
            &runs,
            std::slice::from_ref(&options.out),
            &[],
        )?;
    }
    Ok(Outcome {
        ran: total_pending,
        skipped,
        failed: trained.failed,
        left_out,
    })
}

/// The options with only the datasets that have a folder under the data root, and the others:
/// they are left out, said once each, and the grid goes on without them.
fn with_present_datasets(options: &DriverOptions) -> (DriverOptions, Vec<DatasetName>) {
    let root = data::data_root(options.places.data_dir.as_deref());
    let (present, absent): (Vec<DatasetName>, Vec<DatasetName>) = options
        .grid
        .datasets
        .iter()
        .cloned()
        .partition(|d| data::catalog::has_files(d, &root));
    let options = DriverOptions {
        grid: Grid {
            datasets: present,
            ..options.grid.clone()
        },
        ..options.clone()
    };
    (options, absent)
}

/// A grid's runs, each by its folder's name.
type NamedRuns = Vec<(String, FinetuneJob)>;

/// This shard's runs, each with its folder's name, and what the grid leaves out and why.
fn planned_runs(
    options: &DriverOptions,
    pools: &Pools,
    absent: &[DatasetName],
) -> Result<(NamedRuns, Vec<String>)> {
    let root = data::data_root(options.places.data_dir.as_deref());
    let pool_of = |d: &DatasetName| pools.iter().find(|p| p.0 == *d).and_then(|p| p.1);
    let (all, mut left_out) = jobs(&options.grid, &options.token_noises, &pool_of);
    left_out.splice(
        0..0,
        absent.iter().map(|d| {
            let path = data::catalog::dataset_dir(d, &root);
            if d.given_by_files() {
                format!("{d}: no data (nothing at {})", path.display())
            } else {
                format!(
                    "{d}: no data (no folder {}; `benign-attention data fetch {d}` downloads it)",
                    path.display()
                )
            }
        }),
    );
    if all.is_empty() {
        bail!(
            "no run of the grid can be made ({} left out, e.g. {})",
            left_out.len(),
            left_out.first().map_or("none", String::as_str)
        );
    }
    let total = all.len();
    let mine: Vec<Job> = all
        .into_iter()
        .enumerate()
        .filter(|(k, _)| options.shard.is_none_or(|s| s.keeps(*k)))
        .map(|(_, j)| j)
        .collect();
    if let (true, Some(shard)) = (mine.is_empty(), options.shard) {
        bail!(
            "--shard {}/{}: this shard holds none of the grid's {total} runs; use at most {total} shards",
            shard.index,
            shard.count
        );
    }
    let mut runs = Vec::new();
    for job in &mine {
        let pool = pools.iter().find(|p| p.0 == job.dataset);
        let carve = pool.is_some_and(|p| p.2);
        let test_len = pool.and_then(|p| p.3);
        let run = options.finetune_job(options.run_config(job, carve, test_len)?)?;
        runs.push((run.config.run_name()?, run));
    }
    Ok((runs, left_out))
}

/// The shard's record in the result folder: the grid it belongs to and its runs.
fn record_shard(options: &DriverOptions, runs: &[(String, FinetuneJob)]) -> Result<()> {
    super::grid_record::write(
        &options.out,
        &super::grid_record::ShardRecord {
            grid: options.grid_digest()?,
            index: options.shard.map_or(1, |s| s.index),
            count: options.shard.map_or(1, |s| s.count),
            runs: runs.iter().map(|(id, _)| id.clone()).collect(),
        },
    )
}

/// Every pending run's samples through the backbones first, with all cores; a dataset whose
/// cache cannot be filled ahead is said, and its runs say why when they fail.
fn fill_caches(grid: &Grid, pending: &[(String, FinetuneJob)], progress: &dyn Progress) {
    for dataset in &grid.datasets {
        let group: Vec<FinetuneJob> = pending
            .iter()
            .filter(|(_, r)| r.config.dataset == *dataset)
            .map(|(_, r)| r.clone())
            .collect();
        if !group.is_empty()
            && let Err(err) = fill_cache(&group, progress)
        {
            progress.warn(&format!("{dataset}: features not cached ahead: {err:#}"));
        }
    }
}

/// What the stacks' workers did: runs finished, and runs failed with why.
struct Trained {
    finished: usize,
    failed: Vec<(String, String)>,
}

/// The pending runs in stacks that train together, `--jobs` stacks at a time, each run's line
/// said as it ends; stops taking stacks when the user stops the grid.
fn train_stacks(
    options: &DriverOptions,
    pending: Vec<(String, FinetuneJob)>,
    pools: &Pools,
    progress: &dyn Progress,
) -> Trained {
    let models_dir = options.places.models_dir.as_deref();
    let total_pending = pending.len();
    let test_len_of = |d: &DatasetName| pools.iter().find(|p| p.0 == *d).and_then(|p| p.3);
    let mut stacked = stack_plan::stacks(
        pending,
        options.stack_memory,
        options.jobs.max(1),
        &|config| stack_plan::backbone_dims(config, models_dir),
        &|config| test_len_of(&config.dataset).unwrap_or(0),
    );
    let workers = options.jobs.clamp(1, stacked.len().max(1));
    // The cores shared among the stacks going at once.
    let threads = (rayon::current_num_threads() / workers).max(1);
    for (_, run) in stacked.iter_mut().flatten() {
        run.sample_threads = threads;
    }
    progress.line(&format!(
        "{total_pending} runs to make in {} stacks, {workers} at a time",
        stacked.len()
    ));
    let next = AtomicUsize::new(0);
    let failed = Mutex::new(Vec::new());
    let done = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let worker = || {
        while crate::interrupt::requested().is_none() {
            let Some(stack) = stacked.get(next.fetch_add(1, Ordering::SeqCst)) else {
                break;
            };
            for (id, result) in train_stack_and_write(stack) {
                let count = done.fetch_add(1, Ordering::SeqCst) + 1;
                let line = match result {
                    Ok(line) => {
                        finished.fetch_add(1, Ordering::SeqCst);
                        line
                    }
                    Err(err) => {
                        failed
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((id.clone(), format!("{err:#}")));
                        format!("FAILED: {err:#}")
                    }
                };
                progress.line(&format!("[{count}/{total_pending}] {id}: {line}"));
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(worker);
        }
    });
    Trained {
        finished: finished.into_inner(),
        failed: failed.into_inner().unwrap_or_else(|e| e.into_inner()),
    }
}

/// One stack's runs trained together, each one's outputs written: each run's one-line result or
/// error. A stack that panics, or that a signal stops, fails every run it held.
fn train_stack_and_write(stack: &[(String, FinetuneJob)]) -> Vec<(String, Result<String>)> {
    let started = Instant::now();
    let jobs: Vec<FinetuneJob> = stack.iter().map(|(_, job)| job.clone()).collect();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let events = jobs
            .iter()
            .map(|job| {
                let out = job.out.as_deref().context("grid runs have a folder")?;
                Ok(crate::report::tensorboard::TensorBoard::new(out, &()))
            })
            .collect::<Result<Vec<_>>>()?;
        let progress: Vec<&dyn Progress> = events.iter().map(|e| e as &dyn Progress).collect();
        let results = finetune_stack(&jobs, &progress)?;
        Ok(results
            .into_iter()
            .zip(&events)
            .zip(&jobs)
            .map(|((result, events), job)| {
                let run = result?;
                let out = job.out.as_deref().context("grid runs have a folder")?;
                crate::report::finetune::write_run(out, &run, Some(events))?;
                let s = &run.summary;
                Ok(format!(
                    "train loss {:.3}, {}, test {:.3} ({:.0} s, {} runs together)",
                    s.last.train_loss,
                    crate::report::finetune::memorization(s.last.memorization),
                    s.test_acc(),
                    started.elapsed().as_secs_f64(),
                    jobs.len()
                ))
            })
            .collect::<Vec<Result<String>>>())
    }))
    .unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(anyhow::anyhow!("panicked: {what}"))
    });
    match outcome {
        Ok(results) => stack
            .iter()
            .map(|(id, _)| id.clone())
            .zip(results)
            .collect(),
        Err(err) => {
            let line = format!("{err:#}");
            stack
                .iter()
                .map(|(id, _)| (id.clone(), Err(anyhow::anyhow!("{line}"))))
                .collect()
        }
    }
}

/// What a merge of result folders wrote: the runs it reports on, and what it lacks.
pub struct Merged {
    pub runs: usize,
    /// Missing shards and unfinished runs ([`super::grid_record::gaps`]), one line each.
    pub gaps: Vec<String>,
}

/// `reproduce report DIR...`: one report over the runs of many result folders. A merge that lacks
/// a shard of a grid or a run is refused, naming each, unless `allow_partial`.
pub fn merge(dirs: &[PathBuf], out: &Path, allow_partial: bool) -> Result<Merged> {
    let gaps = super::grid_record::gaps(dirs)?;
    if !gaps.is_empty() && !allow_partial {
        bail!(
            "the report would be partial: {}; make the missing runs (the same reproduce command resumes them) or pass --allow-partial",
            gaps.join("; ")
        );
    }
    let runs = collect(dirs)?;
    if runs.is_empty() {
        bail!(
            "no finished runs under {}",
            dirs.iter()
                .map(|d| d.join(RUNS).display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    crate::report::reproduce::write_report(out, &runs, dirs, &gaps)?;
    Ok(Merged {
        runs: runs.len(),
        gaps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Grid {
        Grid::new(
            Experiment::Table2,
            Some(vec![DatasetName::BreastMnist, DatasetName::Trec]),
            None,
            None,
            None,
            Budget::Quick,
            Mode::LastLayer,
        )
        .unwrap()
    }

    #[test]
    fn table2_grid_leaves_out_what_the_data_cannot_hold() {
        let g = grid();
        let pool = |d: &DatasetName| {
            Some(if *d == DatasetName::BreastMnist {
                546
            } else {
                5452
            })
        };
        let (kept, left_out) = jobs(&g, &[0.0], &pool);
        // 2 η × 3 n × 3 seeds per dataset, minus BreastMNIST's n = 1000.
        assert_eq!(kept.len(), 18 + 12);
        assert_eq!(left_out.len(), 6);
        assert!(
            left_out[0].contains("breastmnist n = 1000"),
            "{}",
            left_out[0]
        );
    }

    #[test]
    fn repeated_values_are_one_grid_point() {
        let g = Grid::new(
            Experiment::Table2,
            Some(vec![DatasetName::Trec, DatasetName::Trec]),
            Some(vec![42, 42, 7]),
            Some(vec![20, 20]),
            Some(vec![0.1, 0.1, 0.101]),
            Budget::Quick,
            Mode::LastLayer,
        )
        .unwrap();
        assert_eq!(g.datasets.len(), 1);
        assert_eq!(g.seeds, vec![42, 7]);
        assert_eq!(g.ns, vec![20]);
        assert_eq!(g.etas, vec![0.1, 0.101]);
    }

    #[test]
    fn shards_partition_the_grid() {
        let shards: Vec<JobShard> = (1..=3).map(|k| format!("{k}/3").parse().unwrap()).collect();
        for position in 0..10 {
            assert_eq!(shards.iter().filter(|s| s.keeps(position)).count(), 1);
        }
        for bad in ["0/3", "4/3", "1/0", "x", "1-3"] {
            assert!(bad.parse::<JobShard>().is_err(), "{bad}");
        }
    }

    #[test]
    fn fig8_sweeps_eta_in_hundredths() {
        let g = Grid::new(
            Experiment::Fig8,
            None,
            None,
            None,
            None,
            Budget::Paper,
            Mode::Head,
        )
        .unwrap();
        assert_eq!(g.etas.len(), 21);
        assert_eq!(g.etas[20], 0.2);
        assert_eq!(
            (g.ns.as_slice(), g.seeds.as_slice()),
            (&[200][..], &[42][..])
        );
        assert!(
            Grid::new(
                Experiment::Fig8,
                None,
                None,
                None,
                Some(vec![1.0]),
                Budget::Paper,
                Mode::Head
            )
            .is_err()
        );
    }
}
