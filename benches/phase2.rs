//! Phase 2 of the paper on cached last-layer inputs against the named baseline, what the authors'
//! code does: every step a full forward of the batch through the frozen backbone, then the last
//! layer with the trainable query/key, backward and AdamW (same machine, same run).
//!
//!   ours:      one epoch of phase 2's loop at n = 200, batch 16 (13 steps), including the
//!              per-epoch evaluation of the 200 fine-tune samples that feeds metrics.jsonl, on
//!              one thread and on all cores (as `finetune` runs alone: the host pass's chunks on
//!              every core);
//!   baseline:  the authors' code, all cores: 13 × their step (backbone to the last layer's
//!              input + full last layer + classifier, backward, AdamW) on batches of 16 images,
//!              and their epoch: those steps plus the per-epoch `AttentionScoreCallback`, the same
//!              forward over the 200 fine-tune samples in batches of 16 (docs/protocol.md §3), which our
//!              per-epoch evaluation stands for.
//!
//! ViT-Ti/16 with its real weights ($BENIGN_MODELS_DIR); the inputs are deterministic pixel
//! patterns (the cost does not depend on the content). Median of 5 (ours: of 5 blocks of 10
//! epochs). `cargo bench --bench phase2`.

mod common;

use std::time::Instant;

use common::{median, median_seconds};

use benign_attention::data::DatasetName;
use benign_attention::encoder::layer_rows::LayerRows;
use benign_attention::encoder::{Backbone, Model, TextOptions, resolve};
use benign_attention::model::{Classifier, LastLayer, QueryKey};
use benign_attention::train::optim::{AdamW, OptimizerConfig};
use benign_attention::train::run::RunConfig;
use candle_core::{Device, Tensor};
use rand::SeedableRng;

const N: usize = 200;
const BATCH: usize = 16;

fn pixels(first: usize, batch: usize) -> Tensor {
    let mut values = Vec::with_capacity(batch * 3 * 224 * 224);
    for b in first..first + batch {
        for c in 0..3 {
            for y in 0..224 {
                for x in 0..224 {
                    values.push(((b * 7 + c * 3 + y + 2 * x) % 255) as f32 / 127.5 - 1.0);
                }
            }
        }
    }
    Tensor::from_vec(values, (batch, 3, 224, 224), &Device::Cpu).unwrap()
}

fn main() {
    // SAFETY: first statement, no other thread yet. The same thread settings as the binary.
    unsafe { benign_attention::runtime::configure_process() };
    let device = Device::Cpu;
    let backbone = Backbone::load(
        resolve("timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", None)
            .expect("set BENIGN_MODELS_DIR"),
        &device,
        TextOptions::default(),
    )
    .unwrap();
    let Model::Vit(vit) = &backbone.model else {
        panic!("ViT-Ti is a ViT")
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let hidden = backbone.hidden_size();
    let classifiers = [Classifier::new(hidden, 10, None, &mut rng, &device).unwrap()];
    let layer = LastLayer::new(&backbone.model, &classifiers[0]).unwrap();
    let labels: Vec<u32> = (0..N).map(|i| (i % 10) as u32).collect();
    let noisy_mask: Vec<bool> = (0..N).map(|i| i % 5 == 0).collect();
    let steps = N.div_ceil(BATCH);

    // Ours: the cache is filled once (not timed; `finetune` reads it from disk).
    let inputs: Vec<Tensor> = (0..N)
        .step_by(BATCH)
        .map(|first| {
            vit.last_layer_input(&pixels(first, BATCH.min(N - first)))
                .unwrap()
        })
        .collect();
    let all = Tensor::cat(&inputs, 0).unwrap();
    let cached = LayerRows::from_padded(&all, vec![all.dim(1).unwrap(); N]).unwrap();
    let qk = QueryKey::reset(hidden, &mut rng, &device).unwrap();
    let config = RunConfig {
        n: N,
        batch_size: BATCH,
        ..RunConfig::paper(&DatasetName::Cifar10).unwrap()
    };
    let run_labels = [labels.clone()];
    // The "test" set is the same 200 samples here; it is scored after each block's last epoch,
    // so ours is slightly overstated.
    let sets = common::stack::Sets {
        model: &backbone.model,
        finetune: &cached,
        test: &cached,
        test_labels: &labels,
        classifiers: &classifiers,
        labels: &run_labels,
        noisy_mask: &noisy_mask,
        config: &config,
        route: benign_attention::train::phase2::runs::Route::Host,
        device: &candle_core::Device::Cpu,
    };
    let block = 10;
    // As `finetune` trains: the host pass on the CPU, its samples on `threads` threads, each
    // epoch's fine-tune evaluation during the next epoch's steps.
    let ours_on = |threads: usize| {
        median(
            (0..5)
                .map(|_| {
                    let started = Instant::now();
                    common::stack::train_stack(&sets, 1, block, threads, &mut |_| {});
                    started.elapsed().as_secs_f64()
                })
                .collect(),
        ) / block as f64
    };
    let cores = rayon::current_num_threads();
    let (ours, ours_all) = (ours_on(1), ours_on(cores));
    // The limit on one thread and on all, in this process.
    let (limit_1, limit_all) = common::large_product_rates();
    let epoch_macs = common::phase2_epoch_macs(N, hidden, 4 * hidden, 3, 197);

    // Baseline: the authors' step and a batch of their attention callback, timed per batch
    // and scaled to an epoch.
    let mut opt = AdamW::new(qk.named().unwrap(), OptimizerConfig::default(), 100).unwrap();
    let batch_pixels = pixels(0, BATCH);
    let targets = Tensor::from_slice(&labels[..BATCH], BATCH, &device).unwrap();
    let forward_full = || {
        let x = vit.last_layer_input(&batch_pixels).unwrap();
        layer.full_forward_logits(&qk, &x, None).unwrap()
    };
    let mut step = || {
        let loss = candle_nn::loss::cross_entropy(&forward_full(), &targets).unwrap();
        opt.step(&loss.backward().unwrap()).unwrap();
    };
    let step_s = median_seconds(5, &mut step);
    let callback_s = median_seconds(5, &mut || {
        forward_full().detach();
    });
    let (baseline_steps, baseline_epoch) =
        (step_s * steps as f64, (step_s + callback_s) * steps as f64);

    println!("| phase 2, ViT-Ti, n = {N}, batch {BATCH} (baseline on {cores} threads) | s/epoch |");
    println!("|---|---|");
    println!(
        "| ours, 1 thread (incl. the per-epoch evaluation of the fine-tune set) | {ours:.4} ({}) |",
        common::rate_line(epoch_macs / ours, limit_1)
    );
    println!(
        "| ours, {cores} threads | {ours_all:.4} ({}) |",
        common::rate_line(epoch_macs / ours_all, limit_all)
    );
    println!("| authors: 13 steps (full forward + backward per step) | {baseline_steps:.3} |");
    println!(
        "| authors: epoch = 13 steps + the attention callback's forward of the 200 samples | {baseline_epoch:.3} |"
    );
    println!(
        "| ratio, steps / ours (1 thread) | {:.0}× |",
        baseline_steps / ours
    );
    println!(
        "| ratio, epoch / ours (1 thread; {cores} threads) | {:.0}×; {:.0}× |",
        baseline_epoch / ours,
        baseline_epoch / ours_all
    );
}
