//! Phase 2 at the paper's scale: memory and speed with backbones of the paper's sizes, against the
//! named baseline of the authors' code path, in the same run.
//!
//! For ViT-B/16 (HF ViTConfig defaults: 768 wide, 12 layers, 12 heads, 197 tokens) and for
//! bert-base-uncased's size (768 wide, 12 layers, 128 tokens): a checkpoint of RANDOM weights
//! (seeded; they serve memory and speed only, never results) is written to a temporary folder, and
//! random layer inputs of 10 000 test and 200 fine-tune samples are written straight into a
//! feature cache (the bench measures phase 2, not extraction; text samples get random unpadded
//! lengths, as real sentences have). Then, in a child process so that its peak RSS is phase 2's
//! alone, `finetune`'s phase 2 reads them back: the 200 fine-tune samples into memory, the test
//! set streamed from the cache. Reported:
//!
//!   ours:      one epoch at n = 200, batch 16 (13 steps plus the per-epoch evaluation of the 200
//!              fine-tune samples), on one thread and on all cores (as `finetune` runs when it
//!              is alone; `reproduce --jobs` divides them); one evaluation of the 10 000 test
//!              samples; the child's peak RSS (VmHWM);
//!   baseline:  the authors' code, all cores: 13 × their step (the batch of 16 through the frozen
//!              backbone to the last layer, the full last layer with the trainable query/key, the
//!              classifier, backward and AdamW), and their epoch: those steps plus the per-epoch
//!              `AttentionScoreCallback`, the same forward over the 200 fine-tune samples in
//!              batches of 16 (docs/protocol.md §3), which our per-epoch evaluation stands for.
//!
//! Last, ViT-B's epoch as multiply-adds per second beside a large product's rate (benches/common)
//! timed in the same child process and thread pool after each timed epoch, on one thread and on
//! all. Each thread count runs in three children, alternately; the figures are the median epoch
//! against the fastest product.
//!
//! `cargo bench --bench scale`; about 10 GB of temporary disk.

mod common;

use common::random_checkpoint::{Size, write_checkpoint};

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{median, median_seconds};

use benign_attention::data::DatasetName;
use benign_attention::data::{ImageSet, Inputs, Split};
use benign_attention::encoder::bert::TextBatch;
use benign_attention::encoder::cache::{Contents, FeatureCache};
use benign_attention::encoder::layer_rows::LayerRows;
use benign_attention::encoder::{Backbone, Encoded, Model, TextOptions, resolve};
use benign_attention::model::{Classifier, LastLayer, QueryKey};
use benign_attention::train::optim::{AdamW, OptimizerConfig};
use benign_attention::train::run::RunConfig;
use candle_core::{Device, Tensor};
use rand::{RngExt, SeedableRng};

const TEST_N: usize = 10_000;
const N: usize = 200;
const BATCH: usize = 16;
const CHILD: &str = "BENIGN_SCALE_CHILD";
/// Children run for each thread count.
const CHILDREN: usize = 3;

/// TEST_N + N distinct samples (only their bytes' digests matter: nothing is encoded).
fn samples(size: Size) -> Split {
    let count = TEST_N + N;
    let inputs = match size {
        Size::VitB => Inputs::Images(ImageSet {
            count,
            channels: 1,
            height: 2,
            width: 2,
            pixels: (0..count as u32).flat_map(u32::to_le_bytes).collect(),
        }),
        Size::BertBase => Inputs::Texts((0..count).map(|i| format!("sample {i}")).collect()),
    };
    Split {
        inputs,
        labels: (0..count).map(|i| (i % 4) as u32).collect(),
        release_index: (0..count).collect(),
    }
}

/// Random features of every sample written into the cache, 256 samples per shard.
fn fill_cache(size: Size, backbone: &Backbone, cache: &FeatureCache, data: &Split) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let (t, d) = (size.tokens(), 768);
    let positions: Vec<usize> = (0..data.len()).collect();
    for part in positions.chunks(256) {
        let b = part.len();
        let mut random = |len: usize| -> Vec<f32> {
            (0..len).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect()
        };
        let layer_inputs = Tensor::from_vec(random(b * t * d), (b, t, d), &Device::Cpu).unwrap();
        let cls = Tensor::from_vec(random(b * d), (b, d), &Device::Cpu).unwrap();
        let attention_mask = (size == Size::BertBase).then(|| {
            let mask: Vec<u32> = (0..b)
                .flat_map(|_| {
                    let len = 8 + (rng.random::<u32>() as usize % (t - 8));
                    (0..t).map(move |k| u32::from(k < len))
                })
                .collect();
            Tensor::from_vec(mask, (b, t), &Device::Cpu).unwrap()
        });
        let encoded = Encoded {
            layer_inputs,
            attention_mask,
            pooled: (size == Size::BertBase).then(|| cls.clone()),
            mean: cls.clone(),
            cls,
        };
        cache
            .store(
                backbone,
                "scale",
                "test",
                data,
                part,
                Contents::Full,
                &[encoded],
            )
            .unwrap();
    }
}

/// The checkpoint folder `model` as a backbone on the CPU.
fn load(model: &Path) -> Backbone {
    Backbone::load(
        resolve(model.to_str().unwrap(), None).unwrap(),
        &Device::Cpu,
        TextOptions::default(),
    )
    .unwrap()
}

/// The child: phase 2 from the cache on `threads` threads; prints
/// "epoch_s test_eval_s peak_rss_bytes large_product_rate" (the fastest of three).
///
/// The large product is timed in this process and thread pool right after each timed epoch, so
/// that the epoch and the rate it is read against meet the same load on the host: on machine G
/// that load moved the same two-thread epoch between 0.10 and 0.19 s within minutes
/// (docs/performance.md).
fn phase2_child(size: Size, dir: &Path, threads: usize) {
    let device = Device::Cpu;
    let backbone = load(&dir.join("model"));
    let cache = FeatureCache::open(dir.join("cache")).unwrap();
    let data = samples(size);
    let test: Vec<usize> = (0..TEST_N).collect();
    let finetune: Vec<usize> = (TEST_N..TEST_N + N).collect();
    let read = |positions: &[usize]| -> LayerRows {
        let (features, stats) = cache
            .features(
                &backbone,
                "scale",
                "test",
                &data,
                positions,
                Contents::Full,
                32,
                &mut |_| panic!("the bench's cache is complete"),
            )
            .unwrap();
        assert_eq!(stats.computed, 0);
        features.layer_inputs.unwrap()
    };
    let train_rows = read(&finetune).resident().unwrap();
    let test_rows = read(&test);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let classes = 4;
    let pooler = match &backbone.model {
        Model::Bert(bert) => bert
            .pooler
            .as_ref()
            .map(|p| (p.weight(), p.bias().unwrap())),
        Model::Vit(_) => None,
    };
    let classifiers = [Classifier::new(768, classes, pooler, &mut rng, &device).unwrap()];
    let labels: Vec<u32> = (0..N).map(|i| (i % classes) as u32).collect();
    let noisy_mask: Vec<bool> = (0..N).map(|i| i % 5 == 0).collect();
    let test_labels: Vec<u32> = (0..TEST_N).map(|i| (i % classes) as u32).collect();
    let config = RunConfig {
        n: N,
        batch_size: BATCH,
        ..RunConfig::paper(&DatasetName::Cifar10).unwrap()
    };
    let run_labels = [labels];
    // As `finetune` reads them: the fine-tune set normed once and held, the test set streamed.
    let sets = common::stack::Sets {
        model: &backbone.model,
        finetune: &train_rows,
        test: &test_rows,
        test_labels: &test_labels,
        classifiers: &classifiers,
        labels: &run_labels,
        noisy_mask: &noisy_mask,
        config: &config,
        route: benign_attention::train::phase2::runs::Route::Host,
        device: &candle_core::Device::Cpu,
    };
    let epochs = 5;
    // Each epoch's fine-tune evaluation rides along the next epoch's steps, as in `finetune`, so
    // the metrics of epoch e arrive at the end of epoch e + 1's steps: the first arrival spans two
    // epochs, the next ones one each, and the last is the last epoch's own evaluation, the
    // fine-tune set's and the test set's.
    let mut times = Vec::new();
    let mut limits = Vec::new();
    let mut last = Instant::now();
    common::stack::train_stack(&sets, 1, epochs, threads, &mut |_| {
        times.push(last.elapsed().as_secs_f64());
        if (1..epochs - 1).contains(&(times.len() - 1)) {
            limits.push(common::large_product_rate());
        }
        last = Instant::now();
    });
    let epoch = median(times[1..epochs - 1].to_vec());
    let test_eval = times[epochs - 1];
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let peak_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    // The fastest of the products: one slowed by the host must not flatter the share.
    let limit = limits.into_iter().fold(0f64, f64::max);
    println!("{epoch} {test_eval} {} {limit}", peak_kb * 1024);
}

/// What a child reports: its median epoch (s), its evaluation of the test set (s), its peak RSS
/// (bytes), and the fastest rate of the large product timed beside its epochs (multiply-adds/s).
struct ChildRun {
    epoch: f64,
    test_eval: f64,
    peak: f64,
    limit: f64,
}

impl ChildRun {
    /// Several children's runs as one: the median epoch and test evaluation, the highest peak
    /// and the fastest product.
    fn combine(runs: Vec<ChildRun>) -> ChildRun {
        let all = |f: fn(&ChildRun) -> f64| runs.iter().map(f).collect::<Vec<_>>();
        let max = |v: Vec<f64>| v.into_iter().fold(0f64, f64::max);
        ChildRun {
            epoch: median(all(|r| r.epoch)),
            test_eval: median(all(|r| r.test_eval)),
            peak: max(all(|r| r.peak)),
            limit: max(all(|r| r.limit)),
        }
    }
}

/// Every file under `dir` written through to the disk.
fn sync_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sync_files(&path);
        } else {
            std::fs::File::open(&path).unwrap().sync_all().unwrap();
        }
    }
}

/// The authors' code at this size, all cores, seconds (median of 3 after a warm-up): one
/// training step (a batch through the frozen backbone, the full last layer with the trainable
/// query/key, the classifier, backward and AdamW), and one batch of the per-epoch attention
/// callback (the same forward, no backward).
fn baseline_batch(dir: &Path) -> (f64, f64) {
    let device = Device::Cpu;
    let backbone = load(&dir.join("model"));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let classifier = Classifier::new(768, 4, None, &mut rng, &device).unwrap();
    let layer = LastLayer::new(&backbone.model, &classifier).unwrap();
    let qk = QueryKey::reset(768, &mut rng, &device).unwrap();
    let mut opt = AdamW::new(qk.named().unwrap(), OptimizerConfig::default(), 100).unwrap();
    let targets = Tensor::from_vec(
        (0..BATCH as u32).map(|i| i % 4).collect::<Vec<_>>(),
        BATCH,
        &device,
    )
    .unwrap();
    let forward = || match &backbone.model {
        Model::Vit(vit) => {
            let pixels = Tensor::randn(0f32, 1.0, (BATCH, 3, 224, 224), &device).unwrap();
            let x = vit.last_layer_input(&pixels).unwrap();
            layer.full_forward_logits(&qk, &x, None).unwrap()
        }
        Model::Bert(bert) => {
            let ids: Vec<u32> = (0..BATCH * 128)
                .map(|k| 1000 + (k as u32 * 17) % 20000)
                .collect();
            let input_ids = Tensor::from_vec(ids, (BATCH, 128), &device).unwrap();
            let batch = TextBatch {
                token_type_ids: input_ids.zeros_like().unwrap(),
                attention_mask: input_ids.ones_like().unwrap(),
                input_ids,
            };
            let x = bert.last_layer_input(&batch).unwrap();
            layer
                .full_forward_logits(&qk, &x, Some(&batch.attention_mask))
                .unwrap()
        }
    };
    let mut step = || {
        let loss = candle_nn::loss::cross_entropy(&forward(), &targets).unwrap();
        opt.step(&loss.backward().unwrap()).unwrap();
    };
    let step_s = median_seconds(3, &mut step);
    let callback_s = median_seconds(3, &mut || {
        forward().detach();
    });
    (step_s, callback_s)
}

fn main() {
    // SAFETY: first statement, no other thread yet. The same thread settings as the binary.
    unsafe { benign_attention::runtime::configure_process() };
    if let Ok(spec) = std::env::var(CHILD) {
        let mut parts = spec.splitn(3, ':');
        let (size, threads, dir) = (
            parts.next().unwrap(),
            parts.next().unwrap().parse().unwrap(),
            parts.next().unwrap(),
        );
        let size = if size == "vit" {
            Size::VitB
        } else {
            Size::BertBase
        };
        phase2_child(size, &PathBuf::from(dir), threads);
        return;
    }
    let cores = rayon::current_num_threads();
    println!(
        "| phase 2 at paper size, n = {N}, {TEST_N} cached test samples | ours, 1 thread: s/epoch | ours, {cores} threads: s/epoch | ours: test eval (s) | ours: peak RSS | authors: 13 steps (s) | authors: epoch = steps + attention callback (s) | ratio, steps | ratio, epoch (1 thread; {cores} threads) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut vit_runs = None;
    for size in [Size::VitB, Size::BertBase] {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let model = dir.path().join("model");
        std::fs::create_dir_all(&model).unwrap();
        write_checkpoint(size, &model);
        let backbone = load(&model);
        let cache = FeatureCache::open(dir.path().join("cache")).unwrap();
        fill_cache(size, &backbone, &cache, &samples(size));
        drop(backbone);
        // The cache's gigabytes on disk before anything is timed, not written back under a child.
        sync_files(&dir.path().join("cache"));
        let child = |threads: usize| -> ChildRun {
            let name = if size == Size::VitB { "vit" } else { "bert" };
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .env(CHILD, format!("{name}:{threads}:{}", dir.path().display()))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let values: Vec<f64> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(|v| v.parse().unwrap())
                .collect();
            ChildRun {
                epoch: values[0],
                test_eval: values[1],
                peak: values[2],
                limit: values[3],
            }
        };
        // Three children a thread count, taken alternately, against the host's load from minute
        // to minute: the median epoch, the fastest product, the highest peak.
        let mut runs: [Vec<ChildRun>; 2] = Default::default();
        for _ in 0..CHILDREN {
            runs[0].push(child(1));
            runs[1].push(child(cores));
        }
        let [one, all] = runs.map(ChildRun::combine);
        let (epoch, test_eval, peak, epoch_all) = (one.epoch, one.test_eval, one.peak, all.epoch);
        let (step, callback) = baseline_batch(dir.path());
        let batches = N.div_ceil(BATCH) as f64;
        let (steps, authors_epoch) = (step * batches, (step + callback) * batches);
        println!(
            "| {} | {epoch:.3} | {epoch_all:.3} | {test_eval:.1} | {:.2} GiB | {steps:.1} | {authors_epoch:.1} | {:.0}× | {:.0}×; {:.0}× |",
            size.name(),
            peak / f64::from(1u32 << 30),
            steps / epoch,
            authors_epoch / epoch,
            authors_epoch / epoch_all,
        );
        if size == Size::VitB {
            vit_runs = Some((one, all));
        }
    }
    // ViT-B's epoch as a share of this machine's limit (its tokens are all unpadded; the text
    // samples' random lengths leave bert-base's count inexact).
    let epoch_macs = common::phase2_epoch_macs(N, 768, 3072, 12, 197);
    if let Some((one, all)) = vit_runs {
        println!(
            "\nViT-B/16 size, our epoch: 1 thread {}; {cores} threads {}",
            common::rate_line(epoch_macs / one.epoch, one.limit),
            common::rate_line(epoch_macs / all.epoch, all.limit)
        );
    }
}
