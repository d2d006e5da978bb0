//! `reproduce table2|fig8|fig9|report|slurm`: the paper's grids.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use super::common_args::PlaceArgs;
use crate::data::DatasetName;
use crate::report;
use crate::reproduce as library;
use crate::rng::RngChoice;
use crate::train::run::{HeadClassifier, Mode};

#[derive(Subcommand, Debug)]
pub enum ReproduceCommand {
    /// Table 2: datasets × n (20, 200, 1000) × η (0, 0.2) × seeds (42, 314, 2718).
    Table2(GridArgs),
    /// Fig. 8: η from 0 to 0.2 in steps of 0.01 at n = 200, seed 42.
    Fig8(GridArgs),
    /// Fig. 9: per-epoch max CLS attention, n = 200, η = 0.1, seed 42.
    Fig9(GridArgs),
    /// The SNR dose: datasets × token noise k (0, 1, 3, 9, 24) × n (200, 1000) × η (0, 0.2) ×
    /// seeds (42, 314, 2718), head mode unless --mode says otherwise; SNR² is divided by 1 + k
    /// while everything else stays (see finetune --token-noise; docs/design.md, "The SNR dose").
    Dose(GridArgs),
    /// Merge the result folders of many shards (or runs) into one report.
    Report(ReportArgs),
    /// The SNR dose's analysis of `dose` result folders: the pre-registered predictions P1–P4,
    /// their tests and the answer line, then the same analysis with the doses shuffled (dose.md,
    /// dose.png in --out; docs/design.md, "The SNR dose").
    DoseReport(DoseReportArgs),
    /// The SNR dose's analysis on the paper's synthetic model, where the theorem holds: six (d,
    /// ‖μ‖) settings × σ_ε² = 1 + k × n (20, 100) × η (0, 0.2) × 3 seeds, then P1–P4 and the
    /// answer line as dose-report prints them (dose_check.md, dose_check.png; resumes)
    DoseCheck(DoseCheckArgs),
    /// The paper's token selector on each dataset's real tokens (head mode's final tokens) as its
    /// noise, its three-token signal planted: a regime map over n (20, 200) × n·SNR² (0.3 … 100)
    /// × 3 seeds on the paper's clock, and the answer line (map.md; resumes; docs/design.md)
    ReferenceMap(ReferenceMapArgs),
    /// Each verdict cell of a Table 2 result folder beside its twin: the reference map's model
    /// on the cell's own tokens at its n and pooled n·SNR², η 0 and 0.2 × 3 seeds, judged by the
    /// real cells' rule (twins.md; resumes; docs/design.md, "The paper's model on real noise")
    Twins(TwinsArgs),
    /// Add the n·SNR² estimate (see `diagnose snr`) to every finished run of a result folder
    /// whose summary.json lacks one, from the runs' cached features and phase 1; then run
    /// `reproduce report` to see it in the table and the figures.
    Snr(SnrBackfillArgs),
    /// Write a Slurm job-array script whose tasks run one shard each.
    Slurm(SlurmArgs),
}

#[derive(Args, Debug, Clone)]
pub struct GridArgs {
    /// Datasets, comma-separated, your own files among them (folder:PATH, csv:PATH#text=COL, …;
    /// docs/data.md) [default: all eight the toolkit loads: Table 2's six, STL-10 and SST-2]
    #[arg(long, value_delimiter = ',')]
    pub datasets: Option<Vec<DatasetName>>,
    /// Seeds, comma-separated [default: the experiment's]
    #[arg(long, value_delimiter = ',')]
    pub seeds: Option<Vec<u64>>,
    /// Fine-tune sizes n, comma-separated [default: the experiment's]
    #[arg(long, value_delimiter = ',')]
    pub ns: Option<Vec<usize>>,
    /// Label-noise rates η, comma-separated [default: the experiment's]
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub etas: Option<Vec<f64>>,
    /// SNR doses k, comma-separated (see finetune --token-noise) [default: `dose`: 0,1,3,9,24;
    /// the others: 0]
    #[arg(
        long,
        value_delimiter = ',',
        allow_negative_numbers = true,
        value_name = "K"
    )]
    pub token_noises: Option<Vec<f64>>,
    /// The grid's settings from a TOML file whose keys are these flags (`head_classifier` and
    /// `stack_memory` with underscores); flags given beside it override it (docs/usage.md)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// paper: the paper's sizes and epochs; quick: pretrain_n ≤ 500, test_n ≤ 500, 300/50 epochs [default: paper]
    #[arg(long, value_enum)]
    pub budget: Option<library::Budget>,
    /// What phase 2 trains (see finetune --mode) [default: last-layer]
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Head mode: what the phase-1 classifier is trained on (see finetune --head-classifier)
    #[arg(long, value_enum)]
    pub head_classifier: Option<HeadClassifier>,
    /// Whose random draws pick each run's split, label noise and batch orders (see finetune --rng) [default: own]
    #[arg(long, value_enum)]
    pub rng: Option<RngChoice>,
    /// Result folder: runs/<run>/ and the report [default: results/<experiment>]
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Stacks of runs at once, sharing the cores [default: the number of cores]. Runs that
    /// differ only in η and the seed train together in stacks (docs/usage.md, reproduce)
    #[arg(long, value_name = "J")]
    pub jobs: Option<usize>,
    /// Memory a stack's phase 2 may hold beyond its backbone, in GiB: runs that differ only in
    /// η and the seed train together in stacks as large as this allows [default: 4]
    #[arg(long, value_name = "GIB")]
    pub stack_memory: Option<f64>,
    /// Run only the K-th of N interleaved parts of the grid (1 ≤ K ≤ N)
    #[arg(long, value_name = "K/N")]
    pub shard: Option<crate::shard::JobShard>,
    #[command(flatten)]
    pub places: PlaceArgs,
}

impl GridArgs {
    /// The flags with `--config`'s file under them: each flag not given takes the file's key.
    fn with_file(self) -> Result<Self> {
        let Some(path) = &self.config else {
            return Ok(self);
        };
        let file = library::grid_file::GridFile::read(path)?;
        Ok(Self {
            datasets: self.datasets.or(file.datasets),
            seeds: self.seeds.or(file.seeds),
            ns: self.ns.or(file.ns),
            etas: self.etas.or(file.etas),
            token_noises: self.token_noises.or(file.token_noises),
            budget: self.budget.or(file.budget),
            mode: self.mode.or(file.mode),
            head_classifier: self.head_classifier.or(file.head_classifier),
            rng: self.rng.or(file.rng),
            out: self.out.or(file.out),
            jobs: self.jobs.or(file.jobs),
            stack_memory: self.stack_memory.or(file.stack_memory),
            ..self
        })
    }

    fn budget(&self) -> library::Budget {
        self.budget.unwrap_or_default()
    }

    fn mode(&self) -> Mode {
        self.mode.unwrap_or_default()
    }

    fn rng(&self) -> RngChoice {
        self.rng.unwrap_or_default()
    }

    fn stack_memory(&self) -> f64 {
        self.stack_memory
            .unwrap_or(crate::train::stack_plan::STACK_MEMORY_GIB)
    }

    /// The flags that define the grid, as a shard task would repeat them (`--config`'s settings
    /// among them, resolved).
    fn grid_flags(&self) -> Vec<String> {
        fn list<T: ToString>(flag: &str, values: &Option<Vec<T>>) -> Vec<String> {
            values.as_ref().map_or(Vec::new(), |v| {
                vec![
                    flag.to_string(),
                    v.iter().map(T::to_string).collect::<Vec<_>>().join(","),
                ]
            })
        }
        let mut flags = Vec::new();
        flags.extend(list("--datasets", &self.datasets));
        flags.extend(list("--seeds", &self.seeds));
        flags.extend(list("--ns", &self.ns));
        flags.extend(list("--etas", &self.etas));
        flags.extend(list("--token-noises", &self.token_noises));
        fn value(v: &impl clap::ValueEnum) -> String {
            v.to_possible_value()
                .map_or(String::new(), |p| p.get_name().to_string())
        }
        flags.extend(["--budget".into(), value(&self.budget())]);
        flags.extend(["--mode".into(), value(&self.mode())]);
        if let Some(h) = &self.head_classifier {
            flags.extend(["--head-classifier".into(), value(h)]);
        }
        flags.extend(["--rng".into(), value(&self.rng())]);
        if let Some(j) = self.jobs {
            flags.extend(["--jobs".into(), j.to_string()]);
        }
        flags.extend(["--stack-memory".into(), self.stack_memory().to_string()]);
        if let Some(device) = &self.places.device {
            flags.extend(["--device".into(), value(device)]);
        }
        if let Some(device) = &self.places.train_device {
            flags.extend(["--train-device".into(), value(device)]);
        }
        if let Some(precision) = &self.places.precision {
            flags.extend(["--precision".into(), value(precision)]);
        }
        flags
    }
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Result folders (each holding runs/)
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Where to write results.csv, report.md and the figures
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Write the report even when a shard of a grid is missing or a run has not finished (each
    /// is named on stderr); without it such a merge is refused
    #[arg(long)]
    pub allow_partial: bool,
}

#[derive(Args, Debug)]
pub struct DoseReportArgs {
    /// Result folders of `reproduce dose` (each holding runs/)
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Where to write dose.md and dose.png
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct DoseCheckArgs {
    /// Where the runs (runs/), dose_check.md and dose_check.png go
    #[arg(long, value_name = "DIR", default_value = "results/dose-check")]
    pub out: PathBuf,
    /// Runs at once
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub jobs: usize,
}

#[derive(Args, Debug)]
pub struct ReferenceMapArgs {
    /// Datasets, comma-separated (one image and one text backbone for the answer)
    #[arg(long, value_delimiter = ',', required_unless_present = "report_only")]
    pub datasets: Vec<DatasetName>,
    /// Where the runs (runs/) and map.md go
    #[arg(long, value_name = "DIR", default_value = "results/reference-map")]
    pub out: PathBuf,
    /// Write map.md from the runs kept in --out and make none (a map not finished yet)
    #[arg(long)]
    pub report_only: bool,
    #[command(flatten)]
    pub places: PlaceArgs,
}

#[derive(Args, Debug)]
pub struct TwinsArgs {
    /// The Table 2 result folder (holding runs/) whose cells are twinned
    #[arg(long, value_name = "DIR", default_value = "results/table2-offline")]
    pub from: PathBuf,
    /// Where the twin runs (runs/) and twins.md go
    #[arg(long, value_name = "DIR", default_value = "results/reference-twins")]
    pub out: PathBuf,
    /// Only the cells of these sizes, comma-separated [default: every size]
    #[arg(long, value_delimiter = ',')]
    pub ns: Vec<usize>,
    /// Only the cells of these datasets, comma-separated [default: every dataset]
    #[arg(long, value_delimiter = ',')]
    pub datasets: Vec<DatasetName>,
    /// Write twins.md from the runs kept in --out and make none
    #[arg(long)]
    pub report_only: bool,
    #[command(flatten)]
    pub places: PlaceArgs,
}

#[derive(Args, Debug)]
pub struct SnrBackfillArgs {
    /// Result folder (holding runs/)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub places: PlaceArgs,
}

#[derive(Args, Debug)]
pub struct SlurmArgs {
    /// Which grid
    #[arg(value_enum)]
    pub experiment: library::Experiment,
    /// Array tasks (shards)
    #[arg(long, value_name = "N")]
    pub shards: usize,
    #[command(flatten)]
    pub grid: GridArgs,
    /// Wall-time limit per task
    #[arg(long, default_value = "24:00:00")]
    pub time: String,
    /// Cores per task
    #[arg(long, default_value_t = 8)]
    pub cpus_per_task: usize,
    /// Memory per task
    #[arg(long, default_value = "32G")]
    pub mem: String,
    /// Slurm partition
    #[arg(long)]
    pub partition: Option<String>,
}

fn experiment_name(e: library::Experiment) -> &'static str {
    match e {
        library::Experiment::Table2 => "table2",
        library::Experiment::Fig8 => "fig8",
        library::Experiment::Fig9 => "fig9",
        library::Experiment::Dose => "dose",
    }
}

fn grid_of(experiment: library::Experiment, args: &GridArgs) -> Result<library::Grid> {
    // As finetune: a value given twice is refused, not merged without a word.
    use super::common_args::once_each;
    if let Some(v) = &args.seeds {
        once_each("--seeds", v)?;
    }
    if let Some(v) = &args.ns {
        once_each("--ns", v)?;
    }
    if let Some(v) = &args.etas {
        once_each("--etas", v)?;
    }
    if let Some(v) = &args.datasets {
        once_each("--datasets", v)?;
    }
    Ok(library::Grid {
        head_classifier: HeadClassifier::for_mode(args.mode(), args.head_classifier),
        ..library::Grid::new(
            experiment,
            args.datasets.clone(),
            args.seeds.clone(),
            args.ns.clone(),
            args.etas.clone(),
            args.budget(),
            args.mode(),
        )?
    })
}

pub fn run(command: ReproduceCommand) -> Result<ExitCode> {
    match command {
        ReproduceCommand::Table2(args) => run_grid(library::Experiment::Table2, args),
        ReproduceCommand::Fig8(args) => run_grid(library::Experiment::Fig8, args),
        ReproduceCommand::Fig9(args) => run_grid(library::Experiment::Fig9, args),
        ReproduceCommand::Dose(args) => run_grid(library::Experiment::Dose, args),
        ReproduceCommand::Report(args) => report_folders(args),
        ReproduceCommand::DoseReport(args) => dose_report(args),
        ReproduceCommand::DoseCheck(args) => dose_check(args),
        ReproduceCommand::ReferenceMap(args) => reference_map(args),
        ReproduceCommand::Twins(args) => twins(args),
        ReproduceCommand::Snr(args) => snr_backfill(args),
        ReproduceCommand::Slurm(args) => slurm_script(args),
    }
}

/// `reproduce report`: result folders merged into one report.
fn report_folders(args: ReportArgs) -> Result<ExitCode> {
    let merged = library::merge(&args.dirs, &args.out, args.allow_partial)?;
    for gap in &merged.gaps {
        eprintln!("warning: partial report: {gap}");
    }
    println!(
        "{} runs → {}",
        merged.runs,
        args.out.join("report.md").display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `reproduce dose-report`: the dose's pre-registered analysis of result folders.
fn dose_report(args: DoseReportArgs) -> Result<ExitCode> {
    let rows: Vec<_> = crate::report::results::collect(&args.dirs)?
        .into_iter()
        .map(|(row, _)| row)
        .collect();
    if rows.is_empty() {
        anyhow::bail!("no finished run in {} folder(s)", args.dirs.len());
    }
    let answer = crate::report::dose::write(&args.out, &rows)?;
    println!(
        "{} runs: answer {answer} → {}",
        rows.len(),
        args.out.join("dose.md").display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `reproduce dose-check`: the dose analysis on the synthetic model.
fn dose_check(args: DoseCheckArgs) -> Result<ExitCode> {
    let total = library::dose_check::grid().points().len();
    let bar = crate::progress_bar::bar(total as u64, "runs");
    let answer = library::dose_check::run(&args.out, args.jobs, &|| bar.inc(1))?;
    bar.finish_and_clear();
    println!(
        "{total} runs: answer {answer} → {}",
        args.out.join("dose_check.md").display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `reproduce reference-map`: each dataset's map, then map.md over all of them.
fn reference_map(args: ReferenceMapArgs) -> Result<ExitCode> {
    use crate::reproduce::reference_map as map;
    if args.report_only {
        let runs = map::kept_runs(&args.out)?;
        let answer = map::table::write(&args.out, &runs)?;
        println!(
            "{} kept runs: answer {answer} → {}",
            runs.len(),
            args.out.join("map.md").display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let bars = report::finetune::Bars::default();
    let per_dataset = 2 * map::LADDER.len() * map::SEEDS.len() + 2 * map::LADDER.len();
    let mut runs = Vec::new();
    for dataset in &args.datasets {
        let config = crate::train::run::RunConfig {
            mode: Mode::Head,
            head_classifier: HeadClassifier::for_mode(Mode::Head, None),
            // Twice the largest n: samples shorter than T are passed over.
            n: 2 * map::SIZES[map::SIZES.len() - 1],
            eta: 0.0,
            ..crate::train::run::RunConfig::paper(dataset)?
        };
        let job = crate::train::run::FinetuneJob {
            checkpoint_every: 0,
            ..crate::train::run::FinetuneJob::new(config, args.places.places())
        };
        let bar = crate::progress_bar::bar(per_dataset as u64, "runs");
        runs.extend(map::dataset_map(&job, &args.out, &bars, &|run| {
            bar.inc(1);
            eprintln!(
                "{} n {} n·SNR² {} seed {}{}: {}",
                run.dataset,
                run.n,
                run.n_snr2,
                run.seed,
                if run.half_step { " (½ step)" } else { "" },
                run.call.name()
            );
        })?);
        bar.finish_and_clear();
    }
    let answer = map::table::write(&args.out, &runs)?;
    println!(
        "{} runs: answer {answer} → {}",
        runs.len(),
        args.out.join("map.md").display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `reproduce twins`: the chosen cells' twins made (unless --report-only), then twins.md over
/// every cell.
fn twins(args: TwinsArgs) -> Result<ExitCode> {
    use crate::reproduce::reference_map as map;
    let rows: Vec<report::results::ResultRow> =
        report::results::collect(std::slice::from_ref(&args.from))?
            .into_iter()
            .map(|(row, _)| row)
            .collect();
    let targets = report::theory::twin_targets(&rows)?;
    if !args.report_only {
        let chosen: Vec<&report::theory::TwinTarget> = targets
            .iter()
            .filter(|t| args.ns.is_empty() || args.ns.contains(&t.n))
            .filter(|t| args.datasets.is_empty() || args.datasets.contains(&t.config.dataset))
            .collect();
        let bar = crate::progress_bar::bar((2 * 3 * chosen.len()) as u64, "runs");
        let bars = report::finetune::Bars::default();
        let places = args.places.places();
        map::twins::all_twins(&chosen, (&args.out, &places), &bars, &|run| {
            bar.inc(1);
            eprintln!(
                "{} {} n {} n·SNR² {:.2} η {} seed {}: {}",
                run.dataset,
                run.mode,
                run.n,
                run.n_snr2,
                run.config.noise_ratio,
                run.seed,
                run.call.name()
            );
        })?;
        bar.finish_and_clear();
    }
    let runs = if args.out.join("runs").is_dir() {
        map::kept_runs(&args.out)?
    } else {
        Vec::new()
    };
    let summary = map::twin_table::write(&args.out, &targets, &runs)?;
    println!("{summary} → {}", args.out.join("twins.md").display());
    Ok(ExitCode::SUCCESS)
}

/// `reproduce snr`: the n·SNR² estimate given to every finished run of a result folder.
fn snr_backfill(args: SnrBackfillArgs) -> Result<ExitCode> {
    if !args.dir.is_dir() {
        anyhow::bail!("{}: no such result folder", args.dir.display());
    }
    let bars = report::finetune::Bars::default();
    let done = library::snr_backfill::backfill(&args.dir, &args.places.places(), &bars)?;
    println!(
        "{} runs given their estimate ({} estimates), {} had one, {} left without",
        done.filled,
        done.estimates,
        done.present,
        done.refused.len()
    );
    for why in &done.refused {
        eprintln!("error: {why}");
    }
    Ok(if done.refused.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `reproduce slurm`: a job-array script whose tasks run one shard each.
fn slurm_script(args: SlurmArgs) -> Result<ExitCode> {
    // The tasks get the file's settings as flags: they need not find the file.
    let args = SlurmArgs {
        grid: args.grid.with_file()?,
        ..args
    };
    if args.shards == 0 {
        anyhow::bail!("--shards must be at least 1");
    }
    if args.grid.shard.is_some() {
        anyhow::bail!("--shard: the script gives each task its own shard; drop the flag");
    }
    grid_of(args.experiment, &args.grid)?;
    let name = experiment_name(args.experiment);
    let out = args
        .grid
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(name));
    let out = std::path::absolute(&out).unwrap_or(out);
    let env = [
        ("BENIGN_DATA_DIR", args.grid.places.root.data_dir.clone()),
        ("BENIGN_MODELS_DIR", args.grid.places.models_dir.clone()),
        ("BENIGN_CACHE_DIR", args.grid.places.cache_dir.clone()),
        (
            crate::data::fetch::MIRROR_ENV,
            args.grid.places.root.data_mirror.clone().map(PathBuf::from),
        ),
    ]
    .into_iter()
    .filter_map(|(k, flag)| {
        flag.map(|p| p.display().to_string())
            .or_else(|| std::env::var(k).ok())
            .map(|v| (k.to_string(), v))
    })
    .collect();
    let script = library::slurm::SlurmScript {
        experiment: name.into(),
        grid_args: args.grid.grid_flags(),
        shards: args.shards,
        out: out.clone(),
        binary: std::env::current_exe().context("locating this binary")?,
        time: args.time,
        cpus_per_task: args.cpus_per_task,
        mem: args.mem,
        partition: args.partition,
        env,
    };
    let path = out.join(format!("reproduce-{name}.sbatch"));
    crate::io::ensure_dir(&out.join("logs"))?;
    crate::io::write_atomic(&path, |w| Ok(w.write_all(script.render().as_bytes())?))?;
    println!("{}", path.display());
    eprintln!("{}", script.hint(&path));
    Ok(ExitCode::SUCCESS)
}

/// The flags with what an experiment defaults to beyond the grid's axes: the dose's head mode.
fn with_experiment_defaults(experiment: library::Experiment, args: GridArgs) -> GridArgs {
    match (experiment, args.mode) {
        (library::Experiment::Dose, None) => GridArgs {
            mode: Some(Mode::Head),
            ..args
        },
        _ => args,
    }
}

/// The grid's SNR doses: `--token-noises`, each once and each a dose, else the experiment's.
fn doses(experiment: library::Experiment, args: &GridArgs) -> Result<Vec<f64>> {
    let given = match (&args.token_noises, experiment) {
        (Some(given), _) => given.clone(),
        (None, library::Experiment::Dose) => library::DOSES.to_vec(),
        (None, _) => vec![0.0],
    };
    let mut kept: Vec<f64> = Vec::new();
    for k in given {
        if let Some(why) = crate::train::run::token_noise_out_of_range(k) {
            anyhow::bail!("--token-noises: every k {why}");
        }
        if !kept.contains(&(k + 0.0)) {
            kept.push(k + 0.0);
        }
    }
    if kept.is_empty() {
        anyhow::bail!("--token-noises needs at least one value");
    }
    Ok(kept)
}

/// `reproduce table2|fig8|fig9|dose`: the grid (or a shard of it), then its report.
fn run_grid(experiment: library::Experiment, args: GridArgs) -> Result<ExitCode> {
    let args = with_experiment_defaults(experiment, args.with_file()?);
    super::common_args::check_jobs(args.jobs)?;
    let token_noises = doses(experiment, &args)?;
    let stack_memory = args.stack_memory();
    if !(stack_memory.is_finite() && stack_memory > 0.0) {
        anyhow::bail!("--stack-memory must be a positive number of GiB, got {stack_memory}");
    }
    let grid = grid_of(experiment, &args)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(experiment_name(experiment)));
    let options = library::DriverOptions {
        grid,
        out: out.clone(),
        jobs: args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        stack_memory: stack_memory * f64::from(1u32 << 30),
        shard: args.shard,
        places: args.places.places(),
        device: args
            .places
            .device
            .unwrap_or(crate::runtime::DeviceKind::Cpu),
        train_device: args.places.train_device,
        precision: args.places.precision.unwrap_or_default(),
        rng: args.rng(),
        token_noises,
    };
    let placement = crate::runtime::Placement::of(options.device, options.train_device);
    if placement != crate::runtime::Placement::of(crate::runtime::DeviceKind::Cpu, None) {
        // A missing GPU or CUDA build is one line now, not a failure of every run.
        placement.backbone.device()?;
        placement.phases().device_of("--train-device")?;
        // Said once here: the runs of the grid report no progress of their own.
        eprintln!(
            "note: {}; {}",
            placement.describe(),
            crate::train::progress::HOST_STEPS
        );
    }
    let started = std::time::Instant::now();
    let outcome = {
        let bars = report::finetune::Bars::default();
        library::run(&options, &bars)?
    };
    for note in &outcome.left_out {
        eprintln!("left out: {note}");
    }
    eprintln!(
        "{} runs done, {} were already finished, {} failed ({:.0} s); report: {}",
        outcome.ran - outcome.failed.len(),
        outcome.skipped,
        outcome.failed.len(),
        started.elapsed().as_secs_f64(),
        out.join(match experiment {
            library::Experiment::Dose => "dose.md",
            _ => "report.md",
        })
        .display()
    );
    if outcome.failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for (id, err) in &outcome.failed {
            eprintln!("failed: {id}: {err}");
        }
        Ok(ExitCode::from(1))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::ReproduceCommand;
    use crate::cli::{Cli, Command};

    fn table2(args: &[&str]) -> super::GridArgs {
        let mut all = vec!["benign-attention", "reproduce", "table2"];
        all.extend_from_slice(args);
        let cli = Cli::try_parse_from(all).unwrap();
        let Command::Reproduce(ReproduceCommand::Table2(args)) = cli.command else {
            panic!("table2 expected")
        };
        args
    }

    /// The defaults the help states are those a grid without the flags runs with.
    #[test]
    fn help_defaults_are_the_grid_defaults() {
        use clap::{CommandFactory, ValueEnum};
        let mut command = Cli::command();
        let grid = command
            .find_subcommand_mut("reproduce")
            .and_then(|r| r.find_subcommand_mut("table2"))
            .unwrap();
        let help_of = |id: &str| {
            let arg = grid.get_arguments().find(|a| a.get_id() == id).unwrap();
            arg.get_help().map(|h| h.to_string()).unwrap_or_default()
        };
        let bare = table2(&[]);
        let name = |v: &dyn Fn() -> Option<clap::builder::PossibleValue>| {
            v().unwrap().get_name().to_string()
        };
        let stated = [
            ("budget", name(&|| bare.budget().to_possible_value())),
            ("mode", name(&|| bare.mode().to_possible_value())),
            ("rng", name(&|| bare.rng().to_possible_value())),
            ("stack_memory", bare.stack_memory().to_string()),
        ];
        for (id, value) in stated {
            let help = help_of(id);
            assert!(
                help.contains(&format!("[default: {value}]")),
                "--{id}: {help}"
            );
        }
    }

    /// `--config`'s keys fill the flags not given; a flag beside the file wins.
    #[test]
    fn a_grid_file_is_overridden_by_flags_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("grid.toml");
        std::fs::write(
            &path,
            "datasets = [\"trec\"]\nseeds = [42, 314]\nbudget = \"quick\"\nrng = \"authors\"\n",
        )
        .unwrap();
        let path = path.to_str().unwrap();
        let args = table2(&["--config", path, "--seeds", "7", "--rng", "own"])
            .with_file()
            .unwrap();
        assert_eq!(args.datasets, Some(vec![crate::data::DatasetName::Trec]));
        assert_eq!(args.seeds, Some(vec![7]));
        let flags = args.grid_flags();
        let value = |flag: &str| {
            let at = flags.iter().position(|f| f == flag).unwrap();
            flags[at + 1].clone()
        };
        assert_eq!(
            (value("--budget"), value("--rng")),
            ("quick".into(), "own".into())
        );
        assert!(!flags.iter().any(|f| f == "--config"), "{flags:?}");
        let missing = table2(&["--config", "no-such-grid.toml"])
            .with_file()
            .unwrap_err();
        assert!(
            format!("{missing:#}").contains("no-such-grid.toml"),
            "{missing:#}"
        );
    }

    /// A Slurm task repeats the grid's flags, --rng included.
    #[test]
    fn grid_flags_repeat_the_rng() {
        let cli = Cli::try_parse_from([
            "benign-attention",
            "reproduce",
            "table2",
            "--rng",
            "authors",
        ])
        .unwrap();
        let Command::Reproduce(ReproduceCommand::Table2(args)) = cli.command else {
            panic!("table2 expected")
        };
        let flags = args.grid_flags();
        let at = flags.iter().position(|f| f == "--rng").unwrap();
        assert_eq!(flags[at + 1], "authors");
    }
}
