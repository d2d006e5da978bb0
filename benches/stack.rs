//! Runs trained together against the same runs made alone, one after another: Fig. 8's five η
//! at n = 200, one seed, last-layer mode, through the trainee and loop `finetune` uses.
//!
//!   ViT-Ti/16 (its real weights, $BENIGN_MODELS_DIR) on CIFAR-10 ($BENIGN_DATA_DIR): the
//!   fine-tune set of seed 42 and the 1017 test images, their last-layer inputs through the
//!   feature cache ($BENIGN_CACHE_DIR, filled here if empty: the README's main command fills
//!   the same entries);
//!   ViT-B/16 size with RANDOM weights (seeded; speed and memory only) and random layer inputs:
//!   200 fine-tune and 200 test samples.
//!
//! Each workload runs in child processes, so that each one's peak RSS is its own: one child
//! trains the five runs alone one after another, another trains them as one stack (the host
//! pass), a third as one stack on the resident route (phase 2's generic route, docs/design.md
//! "Two routes", on `BENIGN_BENCH_DEVICE`: the CPU by default, `cuda` in a `--features cuda`
//! build, as scripts/gpu-bench.sh runs it), in turn, three times each; every epoch evaluates the fine-tune set (as `finetune` does) and the last
//! scores the test set. The classifiers are freshly initialised, not trained (the cost does not
//! depend on their values). Reported: each way's epochs of all five runs per second (median of
//! the children), the ratio, the share of the large product's rate timed in the same child after
//! the epochs, and each child's peak RSS.
//!
//! `cargo bench --bench stack` (`BENIGN_STACK_ONLY=vit-ti` or `vit-b` times one workload).

mod common;

use std::path::Path;
use std::time::Instant;

use benign_attention::train::phase2::runs::Route;
use common::median;
use common::random_checkpoint::{Size, write_checkpoint};
use common::stack::{Sets, train_stack};

use benign_attention::data::split::{SplitPlan, partition};
use benign_attention::data::{self, DatasetName};
use benign_attention::encoder::cache::{Contents, FeatureCache, cache_root};
use benign_attention::encoder::layer_rows::LayerRows;
use benign_attention::encoder::{Backbone, TextOptions, resolve};
use benign_attention::model::Classifier;
use benign_attention::rng::RngChoice;
use benign_attention::train::run::RunConfig;
use candle_core::{Device, Tensor};
use rand::{RngExt, SeedableRng};

const N: usize = 200;
const RUNS: usize = 5;
const CHILD: &str = "BENIGN_STACK_CHILD";
/// Children of each kind per workload.
const CHILDREN: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    VitTi,
    VitB,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Self::VitTi => "vit-ti",
            Self::VitB => "vit-b",
        }
    }

    fn parse(name: &str) -> Self {
        match name {
            "vit-ti" => Self::VitTi,
            _ => Self::VitB,
        }
    }

    /// Epochs each run trains in a child (`BENIGN_STACK_EPOCHS` sets it, for a profiler).
    fn epochs(self) -> usize {
        if let Some(epochs) = std::env::var("BENIGN_STACK_EPOCHS")
            .ok()
            .and_then(|e| e.parse().ok())
        {
            return epochs;
        }
        match self {
            Self::VitTi => 30,
            Self::VitB => 6,
        }
    }

    /// (width, MLP width, heads, tokens).
    fn shape(self) -> (usize, usize, usize, usize) {
        match self {
            Self::VitTi => (192, 768, 3, 197),
            Self::VitB => (768, 3072, 12, 197),
        }
    }
}

/// How a child trains the five runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// One after another, each alone (the host pass).
    Alone,
    /// As one stack through the host pass.
    Stack,
    /// As one stack on the resident route, on `BENIGN_BENCH_DEVICE`.
    Resident,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Alone => "alone",
            Self::Stack => "stack",
            Self::Resident => "resident",
        }
    }

    fn parse(name: &str) -> Self {
        match name {
            "alone" => Self::Alone,
            "stack" => Self::Stack,
            _ => Self::Resident,
        }
    }
}

/// The workload's backbone (on `device`) and its fine-tune and test sets' layer inputs.
fn load(workload: Workload, scratch: &Path, device: &Device) -> (Backbone, LayerRows, LayerRows) {
    match workload {
        Workload::VitTi => {
            let backbone = Backbone::load(
                resolve("timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", None)
                    .expect("set BENIGN_MODELS_DIR"),
                device,
                TextOptions::default(),
            )
            .unwrap();
            let dataset = data::load(&DatasetName::Cifar10, &data::data_root(None))
                .expect("set BENIGN_DATA_DIR");
            let train = dataset.train.as_ref().unwrap();
            // The split of the README's main command: seed 42, n = 200, the rest of the partial
            // training pool for phase 1.
            let plan = SplitPlan {
                pretrain_n: train.len() - N,
                n: N,
                test_n: None,
                seed: 42,
                carve_train_from_test: None,
                rng: RngChoice::Own,
            };
            let split = partition(&dataset, &plan).unwrap();
            let cache = FeatureCache::open(cache_root(None)).unwrap();
            let read = |name: &str, data, positions: &[usize]| {
                let (features, _) = cache
                    .features(
                        &backbone,
                        "cifar10",
                        name,
                        data,
                        positions,
                        Contents::Full,
                        32,
                        &mut |_| {},
                    )
                    .unwrap();
                features.layer_inputs.unwrap()
            };
            let finetune = read("train", train, &split.finetune).resident().unwrap();
            let test = read("test", &dataset.test, &split.test);
            (backbone, finetune, test)
        }
        Workload::VitB => {
            let dir = scratch.join("model");
            std::fs::create_dir_all(&dir).unwrap();
            if !dir.join("model.safetensors").exists() {
                write_checkpoint(Size::VitB, &dir);
            }
            let backbone = Backbone::load(
                resolve(dir.to_str().unwrap(), None).unwrap(),
                device,
                TextOptions::default(),
            )
            .unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
            let mut random = |n: usize| {
                let (t, d) = (197, 768);
                let values: Vec<f32> = (0..n * t * d)
                    .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                    .collect();
                let inputs = Tensor::from_vec(values, (n, t, d), &Device::Cpu).unwrap();
                LayerRows::from_padded(&inputs, vec![t; n]).unwrap()
            };
            let finetune = random(N);
            let test = random(N);
            (backbone, finetune, test)
        }
    }
}

/// The child: the workload's five runs as `kind` says, on every core; prints "seconds
/// peak_rss_bytes large_product_rate".
fn child(workload: Workload, kind: Kind, scratch: &Path) {
    let device = match kind {
        Kind::Resident => common::bench_device(),
        Kind::Alone | Kind::Stack => Device::Cpu,
    };
    let route = match kind {
        Kind::Resident => Route::Resident,
        Kind::Alone | Kind::Stack => Route::Host,
    };
    let (backbone, finetune, test) = load(workload, scratch, &device);
    let (hidden, _, _, _) = workload.shape();
    let classes = 10;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let classifiers: Vec<Classifier> = (0..RUNS)
        .map(|_| Classifier::new(hidden, classes, None, &mut rng, &device).unwrap())
        .collect();
    // Fig. 8's η of the grid's five: each run its own flips of the same samples.
    let labels: Vec<Vec<u32>> = (0..RUNS)
        .map(|k| {
            (0..N)
                .map(|i| ((i + usize::from(i % 20 < 2 * k)) % classes) as u32)
                .collect()
        })
        .collect();
    let noisy_mask: Vec<bool> = (0..N).map(|i| i % 10 == 0).collect();
    let test_labels: Vec<u32> = (0..test.len()).map(|i| (i % classes) as u32).collect();
    let config = RunConfig {
        n: N,
        batch_size: 16,
        ..RunConfig::paper(&DatasetName::Cifar10).unwrap()
    };
    let threads = rayon::current_num_threads();
    let epochs = workload.epochs();
    let started = Instant::now();
    if kind != Kind::Alone {
        let sets = Sets {
            model: &backbone.model,
            finetune: &finetune,
            test: &test,
            test_labels: &test_labels,
            classifiers: &classifiers,
            labels: &labels,
            noisy_mask: &noisy_mask,
            config: &config,
            route,
            device: &device,
        };
        train_stack(&sets, RUNS, epochs, threads, &mut |_| {});
    } else {
        for k in 0..RUNS {
            let sets = Sets {
                model: &backbone.model,
                finetune: &finetune,
                test: &test,
                test_labels: &test_labels,
                classifiers: &classifiers[k..k + 1],
                labels: &labels[k..k + 1],
                noisy_mask: &noisy_mask,
                config: &config,
                route,
                device: &device,
            };
            train_stack(&sets, 1, epochs, threads, &mut |_| {});
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let limit = common::large_product_rate();
    println!("{seconds} {} {limit}", common::peak_rss_bytes());
}

/// One child's report.
struct ChildRun {
    seconds: f64,
    peak: f64,
    limit: f64,
}

fn spawn(workload: Workload, kind: Kind, scratch: &Path) -> ChildRun {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .env(CHILD, format!("{} {}", workload.name(), kind.name()))
        .env("BENIGN_STACK_SCRATCH", scratch)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    let v: Vec<f64> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    ChildRun {
        seconds: v[0],
        peak: v[1],
        limit: v[2],
    }
}

fn main() {
    // SAFETY: first statement, no other thread yet. The same thread settings as the binary.
    unsafe { benign_attention::runtime::configure_process() };
    if let Ok(spec) = std::env::var(CHILD) {
        let mut parts = spec.split_whitespace();
        let workload = Workload::parse(parts.next().unwrap());
        let kind = Kind::parse(parts.next().unwrap());
        let scratch = std::env::var("BENIGN_STACK_SCRATCH").unwrap();
        child(workload, kind, Path::new(&scratch));
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let cores = rayon::current_num_threads();
    let device = std::env::var("BENIGN_BENCH_DEVICE").unwrap_or_else(|_| "cpu".into());
    println!(
        "| five runs (Fig. 8's η, n = {N}), {cores} threads | alone, one after another | one stack | ratio | one stack, resident route on {device} | resident / host stack |"
    );
    println!("|---|---|---|---|---|---|");
    let only = std::env::var("BENIGN_STACK_ONLY").ok();
    for workload in [Workload::VitTi, Workload::VitB] {
        if only.as_deref().is_some_and(|o| o != workload.name()) {
            continue;
        }
        // Fill the caches and write the checkpoint before anything is timed.
        let _ = spawn(workload, Kind::Stack, scratch.path());
        let _ = spawn(workload, Kind::Resident, scratch.path());
        let (mut alone, mut together, mut resident) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..CHILDREN {
            alone.push(spawn(workload, Kind::Alone, scratch.path()));
            together.push(spawn(workload, Kind::Stack, scratch.path()));
            resident.push(spawn(workload, Kind::Resident, scratch.path()));
        }
        let epochs = (RUNS * workload.epochs()) as f64;
        let rate = |runs: &[ChildRun]| median(runs.iter().map(|r| epochs / r.seconds).collect());
        let (a, t, r) = (rate(&alone), rate(&together), rate(&resident));
        let (d, m, h, tokens) = workload.shape();
        let macs = common::phase2_epoch_macs(N, d, m, h, tokens);
        let limit = alone
            .iter()
            .chain(&together)
            .map(|r| r.limit)
            .fold(0f64, f64::max);
        let peak = |runs: &[ChildRun]| {
            runs.iter().map(|r| r.peak).fold(0f64, f64::max) / f64::from(1u32 << 20)
        };
        println!(
            "| {} | {a:.1} run-epochs/s ({}; peak {:.0} MiB) | {t:.1} run-epochs/s ({}; peak {:.0} MiB) | **{:.2}×** throughput, {:.2}× peak | {r:.1} run-epochs/s (peak {:.0} MiB host) | **{:.2}×** |",
            match workload {
                Workload::VitTi => "ViT-Ti/16, CIFAR-10",
                Workload::VitB => "ViT-B/16 size, random weights",
            },
            common::rate_line(macs * a, limit),
            peak(&alone),
            common::rate_line(macs * t, limit),
            peak(&together),
            t / a,
            peak(&together) / peak(&alone),
            peak(&resident),
            r / t,
        );
        println!(
            "|  | children: alone {:?} s; together {:?} s; resident {:?} s |  |  |  |  |",
            alone
                .iter()
                .map(|r| (r.seconds * 100.0).round() / 100.0)
                .collect::<Vec<_>>(),
            together
                .iter()
                .map(|r| (r.seconds * 100.0).round() / 100.0)
                .collect::<Vec<_>>(),
            resident
                .iter()
                .map(|r| (r.seconds * 100.0).round() / 100.0)
                .collect::<Vec<_>>()
        );
    }
}
