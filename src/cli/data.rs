//! `data list|verify|fetch|split`: the real datasets.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};

use super::common_args::DataDirArg;
use crate::data::noise::NoiseModel;
use crate::data::prepare::{NoiseSpec, prepare};
use crate::data::split::SplitPlan;
use crate::data::{self, DatasetName};
use crate::report;
use crate::rng::RngChoice;

#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// What each dataset folder holds against the official release ("cifar10: 8068/50000 train, …"),
    /// and what datasets you bring hold.
    List(ListArgs),
    /// Checksums of the files against the official releases (datasets/*.toml); exit 1 if a present
    /// file differs.
    Verify(DatasetsArgs),
    /// Download the canonical release files, checking their checksums.
    Fetch(DatasetsArgs),
    /// Draw the paper's split and label noise and print its summary as JSON.
    Split(Box<SplitArgs>),
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub root: DataDirArg,
    /// Datasets you bring, listed after the data root's (folder:PATH, csv:PATH, jsonl:PATH, hf:PATH or hf:ORG/NAME)
    pub datasets: Vec<DatasetName>,
}

#[derive(Args, Debug)]
pub struct DatasetsArgs {
    #[command(flatten)]
    pub root: DataDirArg,
    /// Datasets (mnist, cifar10, pneumoniamnist, breastmnist, ag_news, trec, cifar10n, or a task of
    /// the MedMNIST 2D family such as dermamnist_224; `verify` also takes datasets you bring,
    /// folder:PATH, csv:PATH, jsonl:PATH, hf:ORG/NAME, and reads every sample; `fetch` downloads
    /// an hf: source's Parquet files) [default: all]
    pub datasets: Vec<String>,
}

#[derive(Args, Debug)]
pub struct SplitArgs {
    #[command(flatten)]
    pub root: DataDirArg,
    /// Dataset name (mnist, cifar10, pneumoniamnist, breastmnist, ag_news, trec, or a task of the
    /// MedMNIST 2D family such as dermamnist_224), or your own files: folder:PATH, csv:PATH, jsonl:PATH, hf:PATH or hf:ORG/NAME
    #[arg(long)]
    pub dataset: DatasetName,
    /// csv:/jsonl: datasets: the text column [default: text]
    #[arg(long, value_name = "COLUMN")]
    pub text_column: Option<String>,
    /// csv:/jsonl: datasets: the label column [default: label]
    #[arg(long, value_name = "COLUMN")]
    pub label_column: Option<String>,
    /// Clean phase-1 samples
    #[arg(long, value_name = "N")]
    pub pretrain_n: usize,
    /// Noisy phase-2 (fine-tune) samples
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub n: usize,
    /// Subsample the test split to this many samples [default: all]
    #[arg(long, value_name = "M")]
    pub test_n: Option<usize>,
    /// Seed of the split
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// symmetric, pair, or cifar10n:aggre|random1|random2|random3|worse (real human labels)
    #[arg(long, default_value = "symmetric")]
    pub noise: NoiseModel,
    /// Label-noise rate η ∈ [0, 1) (ignored for cifar10n, whose rate is realised)
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    pub eta: f64,
    /// Seed of the label noise [default: --seed; a separate stream either way]
    #[arg(long)]
    pub noise_seed: Option<u64>,
    /// Split the test file into disjoint train (this fraction) and test pools, for datasets whose
    /// training split is absent; recorded as a deviation
    #[arg(long, value_name = "F")]
    pub carve_train_from_test: Option<f64>,
    /// Whose random draws pick the split and the label noise: `own` (ChaCha8 streams) or
    /// `authors` (numpy's choice over the official training rows and torch's noise loop,
    /// docs/protocol.md §3.1; refused on partial data unless every drawn row is present)
    #[arg(long, value_enum, default_value_t = RngChoice::Own)]
    pub rng: RngChoice,
    /// Also write the drawn rows as JSON: pretrain_indices and finetune_indices (release indices,
    /// in draw order for --rng authors), finetune_labels (after noise) and noisy_mask
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// The manifests named on the command line, or all of them, by name.
fn manifests(requested: &[String]) -> Result<Vec<(String, data::catalog::Manifest)>> {
    let names: Vec<String> = if requested.is_empty() {
        data::catalog::manifest_names().map(String::from).collect()
    } else {
        requested.to_vec()
    };
    names
        .iter()
        .map(|name| {
            let (id, manifest) = if name == "cifar10n" {
                (name.clone(), data::catalog::manifest(name))
            } else {
                let dataset = name.parse::<DatasetName>().map_err(anyhow::Error::msg)?;
                (dataset.id().to_string(), dataset.manifest())
            };
            match manifest {
                Some(manifest) => Ok((id, manifest)),
                None => anyhow::bail!(
                    "{name}: no manifest in datasets/ (known: {})",
                    data::catalog::manifest_names()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        })
        .collect()
}

pub fn run(command: DataCommand) -> Result<ExitCode> {
    match command {
        DataCommand::List(args) => list(args),
        DataCommand::Verify(args) => verify(args),
        DataCommand::Fetch(args) => fetch(args),
        DataCommand::Split(args) => split(args),
    }
}

/// `data list`: every dataset's completeness under the data root.
fn list(args: ListArgs) -> Result<ExitCode> {
    let root = data::data_root(args.root.data_dir.as_deref());
    println!("data root: {}", root.display());
    for name in DatasetName::all().into_iter().chain(other_medmnist(&root)) {
        match data::load(&name, &root) {
            Ok(dataset) => println!("{}", data::catalog::Completeness::of(&dataset).line()),
            Err(err) => println!("{name}: unavailable: {err}"),
        }
    }

    let annotations = root.join("cifar10n").join(data::cifar10n::FILE_NAME);
    match data::cifar10n::load(&annotations, data::cifar10n::HumanLabels::Aggre) {
        Ok(a) => println!(
            "cifar10n: {}/{} annotations, complete",
            a.human.len(),
            data::cifar10n::TRAIN_IMAGES
        ),
        Err(err) => println!("cifar10n: unavailable: {err}"),
    }
    for name in &args.datasets {
        match own_line(name, &root) {
            Ok(line) => println!("{line}"),
            Err(err) => println!("{name}: unavailable: {err}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The files of the MedMNIST family beyond the paper's two under `root`'s medmnist/, by name.
fn other_medmnist(root: &std::path::Path) -> Vec<DatasetName> {
    let Ok(entries) = std::fs::read_dir(root.join("medmnist")) else {
        return Vec::new();
    };
    let mut names: Vec<DatasetName> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry
                .file_name()
                .to_str()?
                .strip_suffix(".npz")?
                .to_string();
            data::medmnist_family::release(&name).ok()?;
            let name: DatasetName = name.parse().ok()?;
            name.is_other_medmnist().then_some(name)
        })
        .collect();
    names.sort_by(|a, b| a.id().cmp(b.id()));
    names
}

/// A dataset's samples per split, its classes in label order and, for files you bring, their
/// content digest: "folder:pets: 400 train, 100 test, complete; 2 classes (cat, dog); digest …".
fn own_line(name: &DatasetName, root: &std::path::Path) -> Result<String> {
    let dataset = data::load(name, root)?;
    let digest = match name.content_digest()? {
        Some(digest) => format!("; digest {digest}"),
        None => String::new(),
    };
    Ok(format!(
        "{}; {} classes ({}){digest}",
        data::catalog::Completeness::of(&dataset).line(),
        dataset.num_classes(),
        dataset.class_names.join(", ")
    ))
}

/// The names given, sources you bring (`folder:…`, `hf:…`) apart from released datasets.
fn sources_apart(names: &[String]) -> (Vec<String>, Vec<String>) {
    names
        .iter()
        .cloned()
        .partition(|name| data::own::OwnSource::parse(name).is_some())
}

/// `data verify`: every file of the datasets against the official releases' digests; a dataset
/// you bring is read whole (every image decoded, every row parsed).
fn verify(args: DatasetsArgs) -> Result<ExitCode> {
    let root = data::data_root(args.root.data_dir.as_deref());
    let mut failures = 0;
    let (own, released) = sources_apart(&args.datasets);
    for spec in &own {
        let checked = spec
            .parse::<DatasetName>()
            .map_err(anyhow::Error::msg)
            .and_then(|name| own_line(&name, &root));
        match checked {
            Ok(line) => println!("{line}: ok"),
            Err(err) => {
                let line = crate::errors::one_line(&err);
                match line.starts_with(spec.as_str()) {
                    true => println!("{line}"),
                    false => println!("{spec}: {line}"),
                }
                failures += 1;
            }
        }
    }
    if released.is_empty() && !own.is_empty() {
        return Ok(if failures > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    for (name, manifest) in manifests(&released)? {
        for (path, status) in data::catalog::verify(&manifest, &root)? {
            let shown = path.strip_prefix(&root).unwrap_or(&path);
            println!("{name}: {}: {status}", shown.display());
            // A missing file is not the official release either.
            failures += usize::from(!status.is_ok());
        }
    }
    if failures > 0 {
        println!("{failures} file(s) missing or differing from the official releases");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `data fetch`: the datasets' missing files downloaded.
fn fetch(args: DatasetsArgs) -> Result<ExitCode> {
    let root = data::data_root(args.root.data_dir.as_deref());
    let (own, released) = sources_apart(&args.datasets);
    for spec in &own {
        // An hf: source's Parquet files into the hub cache; the other kinds are files already.
        let name = spec.parse::<DatasetName>().map_err(anyhow::Error::msg)?;
        let Some(source) = name.hub_source() else {
            anyhow::bail!("{spec}: nothing to fetch: the source is your own files");
        };
        let files = source.files()?;
        println!("{spec}: {} Parquet files present", files.len());
    }
    // No name at all means every released dataset; sources alone mean none of them.
    if released.is_empty() && !own.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for (name, manifest) in manifests(&released)? {
        let report = data::fetch::fetch(&manifest, &root, args.root.mirror().as_deref())?;
        println!(
            "{name}: {} downloaded, {} already present",
            report.downloaded.len(),
            report.already_present.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `data split`: one run's split and labels, summarised (and written with --out).
fn split(args: Box<SplitArgs>) -> Result<ExitCode> {
    let root = data::data_root(args.root.data_dir.as_deref());
    let name = (args.dataset.clone())
        .with_columns(args.text_column.as_deref(), args.label_column.as_deref())
        .map_err(anyhow::Error::msg)?;
    let dataset = data::load(&name, &root)?;
    for warning in &dataset.warnings {
        eprintln!("warning: {warning}");
    }
    let plan = SplitPlan {
        pretrain_n: args.pretrain_n,
        n: args.n,
        test_n: args.test_n,
        seed: args.seed,
        carve_train_from_test: args.carve_train_from_test,
        rng: args.rng,
    };
    let noise = NoiseSpec {
        model: args.noise,
        eta: args.eta,
        seed: args.noise_seed.unwrap_or(args.seed),
    };
    let prepared = prepare(&dataset, &plan, &noise, &root)?;
    if let Some(out) = &args.out {
        crate::io::write_json(out, &report::data::drawn_rows(&dataset, &plan, &prepared))?;
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&report::data::split_summary(
            &dataset, &prepared, &plan, &noise
        ))?
    );
    Ok(ExitCode::SUCCESS)
}
