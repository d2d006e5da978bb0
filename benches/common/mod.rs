//! Timing helpers shared by the benches (each bench compiles what it uses).
#![allow(dead_code)]

use std::time::Instant;

/// The median of `times`.
pub fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}

/// Seconds per call of `run`: the median of `runs` timed calls after one untimed warm-up.
pub fn median_seconds(runs: usize, run: &mut dyn FnMut()) -> f64 {
    run();
    median(
        (0..runs)
            .map(|_| {
                let started = Instant::now();
                run();
                started.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// The machine's limit as the benches state it: multiply-adds per second of a large f32 product
/// (1024 × 1024 by 1024 × 1024 through candle, the gemm every op here ends in), measured in the
/// calling thread pool (`rayon::current_num_threads()` threads), median of 5 after a warm-up.
pub fn large_product_rate() -> f64 {
    large_product_rate_on(&candle_core::Device::Cpu)
}

/// [`large_product_rate`] on `device`. A GPU gets a 4096-wide product (about 2 ms on an H100;
/// a 1024-wide one is over before its launch cost is), timed from launch to `synchronize`.
pub fn large_product_rate_on(device: &candle_core::Device) -> f64 {
    use candle_core::Tensor;
    let side: usize = if device.is_cpu() { 1024 } else { 4096 };
    let values: Vec<f32> = (0..side * side)
        .map(|k| ((k * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let a = Tensor::from_vec(values, (side, side), device).unwrap();
    let b = a.t().unwrap().contiguous().unwrap();
    let seconds = median_seconds(5, &mut || {
        drop(a.matmul(&b).unwrap());
        device.synchronize().unwrap();
    });
    (side * side * side) as f64 / seconds
}

/// [`large_product_rate`] on one thread and on all of the calling pool's, in this process.
pub fn large_product_rates() -> (f64, f64) {
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    (one_thread.install(large_product_rate), large_product_rate())
}

/// Multiply-adds of our phase-2 epoch over `n` fine-tune samples, as the host pass does them
/// (element-wise work not counted), for width `d`, MLP width `m`, `h` heads and `t` tokens. A
/// forward of the CLS row: the query row and the per-head key fold (2·D²), the value and output
/// products (2·D²), the MLP (2·D·M) and the attention's scores and weighted sums over the T
/// tokens, per head (2·H·T·D). The backward goes to the inputs of the frozen products only
/// (value, output, MLP: 2·D² + 2·D·M) and to both operands of the trained ones (query and key:
/// 3·D²), and through the attention (2·H·T·D). Each epoch makes a forward and a backward of every
/// sample, then the evaluation's forward.
pub fn phase2_epoch_macs(n: usize, d: usize, m: usize, h: usize, t: usize) -> f64 {
    let (d, m, h, t) = (d as f64, m as f64, h as f64, t as f64);
    let forward = 4.0 * d * d + 2.0 * d * m + 2.0 * h * t * d;
    let backward = 5.0 * d * d + 2.0 * d * m + 2.0 * h * t * d;
    n as f64 * (2.0 * forward + backward)
}

/// "12.3 G multiply-adds/s, 45 % of the large product's 27.1 G".
pub fn rate_line(macs_per_second: f64, limit: f64) -> String {
    format!(
        "{:.1} G multiply-adds/s, {:.0} % of the large product's {:.1} G",
        macs_per_second / 1e9,
        100.0 * macs_per_second / limit,
        limit / 1e9
    )
}

pub mod stack {
    //! Phase 2 of a stack of runs through the trainee and loop `finetune` uses, for the benches:
    //! the runs read one fine-tune set in one batch order from one seed (η-siblings: only their
    //! labels differ) and one test set, and every epoch's metrics are computed as `finetune`
    //! computes them.

    use std::sync::{Arc, Mutex};

    use anyhow::Result;
    use benign_attention::data::split::SplitName;
    use benign_attention::encoder::Model;
    use benign_attention::encoder::layer_rows::LayerRows;
    use benign_attention::model::Classifier;
    use benign_attention::rng::Shuffle;
    use benign_attention::train::phase2::epochs::{EpochPlan, Record, train};
    use benign_attention::train::phase2::query_key::LastLayerTrainee;
    use benign_attention::train::phase2::record::MetricsLog;
    use benign_attention::train::phase2::runs::{Labels, Route, RunData, Samples, StackShared};
    use benign_attention::train::phase2::trainee::EpochEvaluation;
    use benign_attention::train::run::RunConfig;
    use candle_core::Device;
    use rand::SeedableRng;

    /// What a stack trains on.
    pub struct Sets<'a> {
        pub model: &'a Model,
        pub finetune: &'a LayerRows,
        pub test: &'a LayerRows,
        pub test_labels: &'a [u32],
        /// Each run's classifier and noisy labels: one run per entry.
        pub classifiers: &'a [Classifier],
        pub labels: &'a [Vec<u32>],
        pub noisy_mask: &'a [bool],
        /// The runs' configuration (n, batch size, epochs, η's and seeds aside).
        pub config: &'a RunConfig,
        /// How a step runs: the host pass, or the device-resident route.
        pub route: Route,
        /// Where the stack trains (the model's and the classifiers' device).
        pub device: &'a Device,
    }

    /// Times each evaluated epoch from the last one's end, after the metrics are computed.
    struct Timed<'a> {
        log: MetricsLog<'a>,
        on_epoch: &'a mut (dyn FnMut(usize) + Send),
    }

    impl Record for Timed<'_> {
        fn epoch(
            &mut self,
            evaluation: EpochEvaluation,
            batch_losses: Option<&[Vec<f64>]>,
        ) -> Result<()> {
            let epoch = evaluation.epoch;
            self.log.epoch(evaluation, batch_losses)?;
            (self.on_epoch)(epoch);
            Ok(())
        }
    }

    /// `runs` of the sets' runs (the first ones) trained together for `epochs` epochs on
    /// `threads` threads, the test set scored after the last; `on_epoch` is called as each
    /// epoch's metrics are in (with the look-ahead, epoch e's at the end of epoch e + 1's steps).
    pub fn train_stack(
        sets: &Sets,
        runs: usize,
        epochs: usize,
        threads: usize,
        on_epoch: &mut (dyn FnMut(usize) + Send),
    ) {
        let finetune: Vec<usize> = (0..sets.finetune.len()).collect();
        let test: Vec<usize> = (0..sets.test.len()).collect();
        let data: Vec<RunData> = (0..runs)
            .map(|k| RunData {
                config: sets.config,
                classifier: &sets.classifiers[k],
                labels: Labels {
                    labels: &sets.labels[k],
                    clean_labels: &sets.labels[0],
                    noisy_mask: sets.noisy_mask,
                    test_labels: sets.test_labels,
                },
                finetune: sets.finetune,
                test: sets.test,
                finetune_samples: Samples {
                    split: SplitName::Train,
                    positions: &finetune,
                    token_noise: None,
                },
                test_samples: Samples {
                    split: SplitName::Test,
                    positions: &test,
                    token_noise: None,
                },
                final_token_noise: None,
                init_rng: Mutex::new(rand_chacha::ChaCha8Rng::seed_from_u64(0)),
            })
            .collect();
        let refs: Vec<&RunData> = data.iter().collect();
        let spill = tempfile::tempdir().unwrap();
        let shared = StackShared {
            model: sets.model,
            device: sets.device,
            route: sets.route,
            hidden: sets.classifiers[0].weight.dims()[1],
            spill_dir: spill.path(),
        };
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap(),
        );
        let mut trainee = LastLayerTrainee::new(&shared, &refs, Arc::clone(&pool)).unwrap();
        let never = |_: usize| false;
        let plan = EpochPlan {
            start_epoch: 0,
            epochs,
            batch_size: sets.config.batch_size,
            n: sets.finetune.len(),
            shuffles: vec![Shuffle::own(0); runs],
            eval_every: usize::MAX,
            measure_reset: false,
            kept: &never,
        };
        let labels = data.iter().map(|d| d.labels).collect();
        let mut record = Timed {
            log: MetricsLog::new(labels, vec![Vec::new(); runs]),
            on_epoch,
        };
        pool.install(|| train(&mut trainee, &plan, &mut record))
            .unwrap();
    }
}

/// The device of `BENIGN_BENCH_DEVICE` (`cpu`, the default, or `cuda`: GPU 0 of a `--features
/// cuda` build, as `--device cuda` picks it).
pub fn bench_device() -> candle_core::Device {
    // Parsed as `--device` parses its value.
    let kind = match std::env::var("BENIGN_BENCH_DEVICE") {
        Err(_) => benign_attention::runtime::DeviceKind::Cpu,
        Ok(value) => {
            <benign_attention::runtime::DeviceKind as clap::ValueEnum>::from_str(&value, false)
                .unwrap_or_else(|e| panic!("BENIGN_BENCH_DEVICE={value}: {e}"))
        }
    };
    kind.device()
        .unwrap_or_else(|e| panic!("BENIGN_BENCH_DEVICE: {e}"))
}

pub mod random_checkpoint {
    //! Backbones of the paper's sizes with RANDOM weights (seeded; for memory and speed only,
    //! never results), written as Hugging Face checkpoints.

    use std::path::Path;

    use benign_attention::encoder::bert::BertConfig;
    use candle_core::{DType, Device, Tensor};
    use candle_nn::{VarBuilder, VarMap};
    use rand::{RngExt, SeedableRng};

    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum Size {
        VitB,
        BertBase,
    }

    impl Size {
        pub fn name(self) -> &'static str {
            match self {
                Size::VitB => "ViT-B/16 size",
                Size::BertBase => "bert-base size",
            }
        }

        pub fn tokens(self) -> usize {
            match self {
                Size::VitB => 197,
                Size::BertBase => 128,
            }
        }
    }

    /// A seeded random-weight checkpoint of `size` in Hugging Face layout under `dir`.
    pub fn write_checkpoint(size: Size, dir: &Path) {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        match size {
            Size::VitB => {
                std::fs::write(
                    dir.join("config.json"),
                    serde_json::json!({
                        "model_type": "vit", "hidden_size": 768, "num_hidden_layers": 12,
                        "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
                        "layer_norm_eps": 1e-12, "image_size": 224, "patch_size": 16,
                        "num_channels": 3, "qkv_bias": true
                    })
                    .to_string(),
                )
                .unwrap();
                std::fs::write(
                    dir.join("preprocessor_config.json"),
                    r#"{"size": {"height": 224, "width": 224}, "resample": 2}"#,
                )
                .unwrap();
                let config: benign_attention::encoder::vit::VitConfig = Default::default();
                benign_attention::encoder::vit::Vit::load(vb, &config).unwrap();
            }
            Size::BertBase => {
                std::fs::write(
                    dir.join("config.json"),
                    serde_json::json!({
                        "model_type": "bert", "vocab_size": 30522, "hidden_size": 768,
                        "num_hidden_layers": 12, "num_attention_heads": 12,
                        "intermediate_size": 3072, "hidden_act": "gelu",
                        "max_position_embeddings": 512, "type_vocab_size": 2,
                        "layer_norm_eps": 1e-12, "pad_token_id": 0
                    })
                    .to_string(),
                )
                .unwrap();
                // A word-level vocabulary: the bench never tokenizes, the backbone needs one.
                std::fs::write(
                    dir.join("tokenizer.json"),
                    serde_json::json!({
                        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
                        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
                        "post_processor": null, "decoder": null,
                        "model": {"type": "WordLevel", "vocab": {"[PAD]": 0, "[UNK]": 1},
                                  "unk_token": "[UNK]"}
                    })
                    .to_string(),
                )
                .unwrap();
                let config = BertConfig::default();
                benign_attention::encoder::bert::Bert::load(vb, &config).unwrap();
            }
        }
        // Seeded values with HF's initialisation scales: N(0, 0.02²) weights, unit norms, zero biases.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2025);
        let normal = rand_distr::Normal::new(0f32, 0.02).unwrap();
        let mut names: Vec<(String, candle_core::Var)> = varmap
            .data()
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, var) in names {
            let shape = var.shape().clone();
            let count = shape.elem_count();
            let norm = name.to_lowercase().contains("layernorm") || name.contains("LayerNorm");
            let values: Vec<f32> = if name.ends_with("bias") {
                vec![0.0; count]
            } else if norm {
                vec![1.0; count]
            } else {
                (0..count).map(|_| rng.sample(normal)).collect()
            };
            var.set(&Tensor::from_vec(values, shape, &Device::Cpu).unwrap())
                .unwrap();
        }
        varmap.save(dir.join("model.safetensors")).unwrap();
    }
}

/// This process's peak resident memory (VmHWM), bytes.
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}
