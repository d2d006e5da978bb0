//! `extract`: a dataset through a frozen backbone into the feature cache.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::common_args::DataDirArg;
use crate::data::{self, DatasetName};
use crate::encoder::{
    self,
    cache::{Contents, FeatureCache, cache_root},
};
use crate::kernels::Precision;
use crate::runtime::DeviceKind;

#[derive(Args, Debug)]
pub struct BackboneArgs {
    /// Hub id (org/name) or a checkpoint folder in Hugging Face layout
    #[arg(long, value_name = "ID")]
    pub backbone: String,
    /// Folder holding checkpoints as <org>/<name>/ [default: $BENIGN_MODELS_DIR]
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// Feature cache [default: $BENIGN_CACHE_DIR, else the platform cache folder/benign-attention]
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Add [CLS]/[SEP] when tokenizing (the authors did not)
    #[arg(long)]
    pub special_tokens: bool,
    /// Inputs per backbone batch
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub batch_size: usize,
    /// Where the backbone computes (cuda needs a build with `--features cuda`); image resizing
    /// and tokenization stay on the CPU. GPU features are cached apart from CPU ones
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// What the backbone's products compute in: f32, or bf16 on the CPU's bf16 units
    /// (AMX or AVX512-BF16); bf16 features are cached apart from f32 ones
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    pub precision: Precision,
}

impl BackboneArgs {
    fn load(&self) -> Result<encoder::Backbone> {
        if self.batch_size == 0 {
            anyhow::bail!("--batch-size must be at least 1, got 0");
        }
        self.precision.check_supported()?;
        let device = self.device.device()?;
        let files = encoder::resolve(&self.backbone, self.models_dir.as_deref())?;
        let text = encoder::TextOptions {
            special_tokens: self.special_tokens,
            ..Default::default()
        };
        encoder::Backbone::load(files, &device, text)?.in_precision(self.precision)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SplitChoice {
    Train,
    Test,
    All,
}

#[derive(Args, Debug)]
pub struct ExtractArgs {
    #[command(flatten)]
    pub root: DataDirArg,
    #[command(flatten)]
    pub backbone: BackboneArgs,
    /// Dataset name, or your own files (folder:PATH, csv:PATH#text=COL#label=COL, jsonl:PATH,
    /// hf:ORG/NAME; docs/data.md)
    #[arg(long)]
    pub dataset: DatasetName,
    /// Which split(s)
    #[arg(long, value_enum, default_value_t = SplitChoice::All)]
    pub split: SplitChoice,
    /// `cls`: the final CLS/position-0 feature only (phase 1); `full`: also the last layer's
    /// input hidden states (phase 2; about T·D·4 bytes per sample)
    #[arg(long, value_enum, default_value_t = Contents::Cls)]
    pub contents: Contents,
    /// Only the first N samples of each split
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

pub fn run(args: ExtractArgs) -> Result<()> {
    let root = data::data_root(args.root.data_dir.as_deref());
    if args.limit == Some(0) {
        anyhow::bail!("--limit must be at least 1, got 0");
    }
    // An unwritable cache is found before any backbone work.
    let cache = FeatureCache::open(cache_root(args.backbone.cache_dir.as_deref()))?;
    let dataset = data::fetch::load_or_fetch(&args.dataset, &root, args.root.mirror().as_deref())?;
    for warning in &dataset.warnings {
        eprintln!("warning: {warning}");
    }
    let backbone = args.backbone.load()?;
    if !backbone.device.is_cpu() {
        eprintln!("note: --device cuda: image resizing and tokenization run on the host");
    }
    let mut splits = Vec::new();
    if args.split != SplitChoice::Test {
        match &dataset.train {
            Some(train) => splits.push(("train", train)),
            None => anyhow::bail!(
                "{}: the training split is absent; use --split test",
                dataset.name
            ),
        }
    }
    if args.split != SplitChoice::Train {
        splits.push(("test", &dataset.test));
    }
    for (name, split) in splits {
        let count = args.limit.map_or(split.len(), |l| l.min(split.len()));
        let positions: Vec<usize> = (0..count).collect();
        let bar = crate::progress_bar::bar(count as u64, "samples");
        let started = std::time::Instant::now();
        let (_, stats) = cache.features(
            &backbone,
            dataset.name.id(),
            name,
            split,
            &positions,
            args.contents,
            args.backbone.batch_size,
            &mut |k| bar.inc(k as u64),
        )?;
        bar.finish_and_clear();
        for warning in &stats.warnings {
            eprintln!("warning: {warning}");
        }
        println!(
            "{} {name}: {count} samples, {} computed, {} from cache ({:.1} s)",
            dataset.name,
            stats.computed,
            stats.from_cache,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
