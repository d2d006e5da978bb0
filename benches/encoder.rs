//! Backbone throughput against the named baseline, PyTorch on the same inputs and device
//! (scripts/bench_torch.py, run separately on the same machine; docs/performance.md keeps both
//! numbers). On the CPU by default; `BENIGN_BENCH_DEVICE=cuda` in a `--features cuda` build runs
//! the three forwards on GPU 0 (`bench_torch.py --device cuda` is its baseline).
//!
//!   ViT-Ti/16, real weights ($BENIGN_MODELS_DIR/timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k),
//!     batch 16 × 3 × 224 × 224                                              → images/s
//!   ViT-B/16, random weights (HF ViTConfig defaults), batch 16             → images/s
//!   all-MiniLM-L6-v2, real weights, batch 32 × 128 tokens, all attended    → sentences/s
//!
//! Inputs as in bench_torch.py: pixel_values[b,c,y,x] = ((b*7 + c*3 + y + 2*x) % 255)/127.5 − 1,
//! input_ids[b,t] = 1000 + (b*131 + t*17) % 20000. Two warm-up batches, median of 5. Each model
//! in f32 and, where the CPU has AVX512-BF16, with `--precision bf16`'s products
//! (`bench_torch.py --dtype bfloat16 --attn sdpa` is that row's baseline), each beside the
//! machine's limit in its precision measured in this process. BENIGN_BENCH_NO_PROFILE=1 skips
//! the profile below; BENIGN_BENCH_MODELS=vit_tiny,vit_base,minilm keeps only those rows, and
//! BENIGN_BENCH_PRECISION=f32 (or bf16) only that precision's (to profile one).
//!
//! Then a profile: the per-op time of one layer of ViT-Ti and of MiniLM on the same batch, op by
//! op through candle's generic ops (the path before the fused attention: separate Q/K/V products,
//! head split and merge copies, the (B, H, T, T) scores, softmax, P·V, and each dense layer's
//! product, bias, residual and GELU as separate tensors) and through the path the encoders take
//! now (one QKV product and the fused attention pass; each dense layer one product into its bias
//! and residual, the GELU in place). `cargo bench --bench encoder`.

mod common;

use std::time::Instant;

use benign_attention::encoder::bert::{Bert, BertLayer, TextBatch};
use benign_attention::encoder::layers::{SelfAttention, additive_mask};
use benign_attention::encoder::projections::{Dense, Then, activate};
use benign_attention::encoder::vit::{Vit, VitConfig, VitLayer};
use benign_attention::encoder::{Backbone, Model, TextOptions, resolve};
use benign_attention::kernels::Precision;
use candle_core::{DType, Device, Tensor};
use candle_nn::{Module, VarBuilder, VarMap};

/// Seconds per call of `run` on `device`: two warm-up calls, then the median of 5, each timed
/// until the device has finished (a GPU's ops return at launch).
fn median_seconds(device: &Device, mut run: impl FnMut()) -> f64 {
    let mut synced = || {
        run();
        device.synchronize().unwrap();
    };
    synced();
    synced();
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let started = Instant::now();
            synced();
            started.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times[2]
}

fn pixels(batch: usize, device: &Device) -> Tensor {
    let mut values = Vec::with_capacity(batch * 3 * 224 * 224);
    for b in 0..batch {
        for c in 0..3 {
            for y in 0..224 {
                for x in 0..224 {
                    values.push(((b * 7 + c * 3 + y + 2 * x) % 255) as f32 / 127.5 - 1.0);
                }
            }
        }
    }
    Tensor::from_vec(values, (batch, 3, 224, 224), device).unwrap()
}

/// Multiply-adds of one encoder forward over `tokens` tokens: per layer the Q, K, V and output
/// products (4·T·D²), the MLP (2·T·D·M) and the attention's scores and weighted sums (2·T²·D), plus
/// for a ViT the patch embedding (patches · 3·P² · D). Element-wise work (LayerNorm, GELU, softmax)
/// is not counted.
fn forward_macs(
    layers: usize,
    tokens: usize,
    hidden: usize,
    mlp: usize,
    patch: Option<usize>,
) -> f64 {
    let (t, d, m) = (tokens as f64, hidden as f64, mlp as f64);
    let layer = 4.0 * t * d * d + 2.0 * t * d * m + 2.0 * t * t * d;
    let embed = patch.map_or(0.0, |p| (t - 1.0) * 3.0 * (p * p) as f64 * d);
    layers as f64 * layer + embed
}

fn row(model: &str, batch: usize, seconds: f64, unit: &str, macs_per_input: f64, limit: &Limit) {
    println!(
        "| {model} | {} | {batch} | {seconds:.3} | {:.1} {unit}/s | {} |",
        limit.precision.name(),
        batch as f64 / seconds,
        limit.line(batch as f64 * macs_per_input / seconds)
    );
}

/// The machine's limit in one precision, measured in this process: f32, candle's (gemm's)
/// large product; bf16, which no crate here computes on the CPU's bf16 units, our own packed bf16
/// product through a 1024 → 1024 dense layer over 1024 rows (extraction's path), beside its f32
/// twin so the two precisions' products compare on one footing.
struct Limit {
    precision: Precision,
    /// Multiply-adds per second of the large product (f32) or of the packed layer (bf16).
    rate: f64,
    what: &'static str,
}

impl Limit {
    fn line(&self, macs_per_second: f64) -> String {
        format!(
            "{:.1} G multiply-adds/s, {:.0} % of {} {:.1} G",
            macs_per_second / 1e9,
            100.0 * macs_per_second / self.rate,
            self.what,
            self.rate / 1e9
        )
    }
}

/// Multiply-adds per second of a 1024 → 1024 frozen dense layer over 1024 rows in `precision`.
fn packed_layer_rate(precision: Precision) -> f64 {
    let side = 1024;
    let values: Vec<f32> = (0..side * side)
        .map(|k| ((k * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let weight = Tensor::from_vec(values, (side, side), &Device::Cpu).unwrap();
    let layer = Dense::new(candle_nn::Linear::new(weight.clone(), None)).in_precision(precision);
    let seconds = median_seconds(&Device::Cpu, || {
        drop(layer.forward_then(&weight, Then::Nothing).unwrap())
    });
    (side * side * side) as f64 / seconds
}

/// The precisions this machine computes in: f32, and bf16 where the CPU has its units.
fn precisions(device: &Device) -> Vec<Precision> {
    let capped = std::env::var("BENIGN_SIMD_ARM").is_ok_and(|arm| arm != "avx512");
    if capped {
        // Below AVX-512 bf16 products run the instruction's model in plain Rust: a test, not a speed.
        println!("(bf16: skipped, BENIGN_SIMD_ARM caps the kernels below AVX-512)");
        return vec![Precision::F32];
    }
    let bf16 = device.is_cpu() && Precision::Bf16.check_supported().is_ok();
    if !bf16 {
        println!(
            "(bf16: {})",
            if device.is_cpu() {
                "this CPU has no AVX512-BF16; its rows skipped"
            } else {
                "the GPU backbone computes in f32"
            }
        );
    }
    let wanted = std::env::var("BENIGN_BENCH_PRECISION").ok();
    [Precision::F32]
        .into_iter()
        .chain(bf16.then_some(Precision::Bf16))
        .filter(|p| wanted.as_deref().is_none_or(|w| w == p.name()))
        .collect()
}

fn main() {
    // As the binary starts: its thread and allocator settings (src/runtime.rs).
    // SAFETY: first statement of main, no other thread exists yet.
    unsafe { benign_attention::runtime::configure_process() };
    let device = common::bench_device();
    let runs_on = match &device {
        Device::Cpu => format!(
            "{} threads, {}",
            rayon::current_num_threads(),
            benign_attention::runtime::float_kernels()
        ),
        _ => "GPU 0".to_string(),
    };
    let precisions = precisions(&device);
    // The machine's limits in this process (and thread pool), the baselines of the rate column.
    let large = common::large_product_rate_on(&device);
    let limits: Vec<Limit> = precisions
        .iter()
        .map(|&precision| match precision {
            Precision::F32 => Limit {
                precision,
                rate: large,
                what: "the large product's",
            },
            Precision::Bf16 => Limit {
                precision,
                rate: packed_layer_rate(precision),
                what: "our bf16 packed product's",
            },
        })
        .collect();
    if device.is_cpu() {
        println!(
            "packed 1024³ layer: f32 {:.1} G multiply-adds/s{}",
            packed_layer_rate(Precision::F32) / 1e9,
            limits
                .get(1)
                .map_or(String::new(), |l| format!(", bf16 {:.1} G", l.rate / 1e9))
        );
    }
    println!(
        "| model (candle, {runs_on}) | precision | batch | s/batch | throughput | arithmetic rate |"
    );
    println!("|---|---|---|---|---|---|");
    let load = |id: &str, precision: Precision| {
        Backbone::load(
            resolve(id, None).expect("set BENIGN_MODELS_DIR"),
            &device,
            TextOptions::default(),
        )
        .unwrap()
        .in_precision(precision)
        .unwrap()
    };
    let x = pixels(16, &device);
    let full = |vit: &Vit| {
        let states = vit.hidden_states(&x).unwrap();
        vit.layernorm.forward(states.last().unwrap()).unwrap()
    };
    // BENIGN_BENCH_MODELS=vit_tiny,vit_base,minilm: only these rows (for a profiler's run).
    let wanted = |name: &str| {
        std::env::var("BENIGN_BENCH_MODELS").map_or(true, |m| m.split(',').any(|w| w == name))
    };
    let vit_id = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k";
    for limit in limits.iter().filter(|_| wanted("vit_tiny")) {
        let vit_tiny = load(vit_id, limit.precision);
        let Model::Vit(vit) = &vit_tiny.model else {
            panic!("ViT-Ti is a ViT")
        };
        row(
            "ViT-Ti/16 (real weights)",
            16,
            median_seconds(&device, || drop(full(vit))),
            "images",
            forward_macs(12, 197, 192, 768, Some(16)),
            limit,
        );
    }
    // ViT-B/16 with random weights: HF ViTConfig defaults.
    let mut vit = random_vit_base(&device);
    for limit in limits.iter().filter(|_| wanted("vit_base")) {
        vit.layers = vit
            .layers
            .iter()
            .map(|l| l.in_precision(limit.precision))
            .collect();
        row(
            "ViT-B/16 (random weights)",
            16,
            median_seconds(&device, || drop(full(&vit))),
            "images",
            forward_macs(12, 197, 768, 3072, Some(16)),
            limit,
        );
    }

    // A GPU machine is sent what fits in its lease's transfer: the 91 MB MiniLM may stay behind.
    let minilm_id = "sentence-transformers/all-MiniLM-L6-v2";
    if resolve(minilm_id, None).is_err() {
        println!(
            "\n(all-MiniLM-L6-v2 is not under BENIGN_MODELS_DIR: its row and the profile skipped)"
        );
        return;
    }
    let ids: Vec<u32> = (0..32 * 128)
        .map(|k| (1000 + ((k / 128) * 131 + (k % 128) * 17) % 20000) as u32)
        .collect();
    let input_ids = Tensor::from_vec(ids, (32, 128), &device).unwrap();
    let batch = TextBatch {
        token_type_ids: input_ids.zeros_like().unwrap(),
        attention_mask: input_ids.ones_like().unwrap(),
        input_ids,
    };
    let run = |bert: &Bert| drop(bert.hidden_states(&batch).unwrap());
    for limit in limits.iter().filter(|_| wanted("minilm")) {
        let minilm = load(minilm_id, limit.precision);
        let Model::Bert(bert) = &minilm.model else {
            panic!("MiniLM is a BERT")
        };
        row(
            "all-MiniLM-L6-v2 (real weights), length 128",
            32,
            median_seconds(&device, || run(bert)),
            "sentences",
            forward_macs(6, 128, 384, 1536, None),
            limit,
        );
    }
    if std::env::var_os("BENIGN_BENCH_NO_PROFILE").is_some() {
        return;
    }
    if device.is_cpu() {
        let vit_tiny = load(vit_id, Precision::F32);
        let minilm = load(minilm_id, Precision::F32);
        let (Model::Vit(vit), Model::Bert(bert)) = (&vit_tiny.model, &minilm.model) else {
            panic!("ViT-Ti is a ViT, MiniLM a BERT")
        };
        profile(vit, bert, &x, &batch);
    } else {
        println!("\n(the per-op profile times the CPU kernels; it runs only on the CPU)");
    }
}

/// ViT-B/16 (HF ViTConfig defaults) with candle's random initial weights, as plain tensors: a
/// VarMap's tensors are variables, and a forward over variables tracks gradients, which sends
/// the attention, the LayerNorms and the GELU through their differentiable generic forms.
/// Extraction loads plain tensors from a checkpoint, and so must what measures it.
fn random_vit_base(device: &Device) -> Vit {
    let varmap = VarMap::new();
    Vit::load(
        VarBuilder::from_varmap(&varmap, DType::F32, device),
        &VitConfig::default(),
    )
    .unwrap();
    let tensors: std::collections::HashMap<String, Tensor> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(name, var)| (name.clone(), var.as_tensor().detach()))
        .collect();
    let vit = Vit::load(
        VarBuilder::from_tensors(tensors, DType::F32, device),
        &VitConfig::default(),
    )
    .unwrap();
    assert!(
        !vit.layers[0].attention.query.weight().track_op(),
        "the bench's ViT-B must run extraction's path"
    );
    vit
}

/// Milliseconds per op of one layer, summed by name in first-seen order.
#[derive(Default)]
struct Profile(Vec<(&'static str, f64)>);

impl Profile {
    fn time<T>(&mut self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        let ms = started.elapsed().as_secs_f64() * 1e3;
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total += ms,
            None => self.0.push((name, ms)),
        }
        out
    }

    /// The median-free average of `reps` runs of `layer`, after one warm-up.
    fn of(reps: usize, mut layer: impl FnMut(&mut Profile)) -> Self {
        layer(&mut Profile::default());
        let mut total = Profile::default();
        for _ in 0..reps {
            layer(&mut total);
        }
        total.0.iter_mut().for_each(|(_, ms)| *ms /= reps as f64);
        total
    }

    fn print(&self, title: &str) {
        let sum: f64 = self.0.iter().map(|(_, ms)| ms).sum();
        println!("\n| {title} | ms | share |");
        println!("|---|---|---|");
        let mut rows = self.0.clone();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (name, ms) in rows {
            println!("| {name} | {ms:.1} | {:.0} % |", 100.0 * ms / sum);
        }
        println!("| one layer | {sum:.1} | |");
    }
}

/// The attention of a layer op by op through candle's generic ops (the path before this round).
fn attention_generic(
    p: &mut Profile,
    a: &SelfAttention,
    xs: &Tensor,
    mask: Option<&Tensor>,
) -> Tensor {
    let (q, k, v) = p.time("Q, K, V products (three)", || {
        (
            a.query.forward(xs).unwrap(),
            a.key.forward(xs).unwrap(),
            a.value.forward(xs).unwrap(),
        )
    });
    let (q, k, v) = p.time("split heads (contiguous copies)", || {
        (
            a.split_heads(&q).unwrap(),
            a.split_heads(&k).unwrap(),
            a.split_heads(&v).unwrap(),
        )
    });
    let scores = p.time("scores Q·Kᵀ (B·H batched products)", || {
        q.matmul(&k.t().unwrap()).unwrap()
    });
    let scores = p.time("scale and mask", || {
        let s = (scores / (a.head_dim as f64).sqrt()).unwrap();
        match mask {
            Some(m) => s.broadcast_add(m).unwrap(),
            None => s,
        }
    });
    let probs = p.time("softmax", || {
        candle_nn::ops::softmax_last_dim(&scores).unwrap()
    });
    let context = p.time("weighted sum P·V", || probs.matmul(&v).unwrap());
    p.time("merge heads (copy)", || {
        SelfAttention::merge_heads(&context).unwrap()
    })
}

fn attention_fused(
    p: &mut Profile,
    a: &SelfAttention,
    xs: &Tensor,
    mask: Option<&Tensor>,
) -> Tensor {
    p.time("attention: one QKV product + fused pass", || {
        a.forward(xs, mask).unwrap()
    })
}

type Attention = fn(&mut Profile, &SelfAttention, &Tensor, Option<&Tensor>) -> Tensor;

/// The path a profile takes through a layer.
#[derive(Clone, Copy)]
struct Path {
    attention: Attention,
    /// Each dense layer as one product into its bias and residual, the GELU in place
    /// (`Dense::forward_then`), instead of candle's product, bias add, residual add and GELU.
    fused_products: bool,
}

const PATHS: [(Path, &str); 2] = [
    (
        Path {
            attention: attention_generic,
            fused_products: false,
        },
        "generic ops (before)",
    ),
    (
        Path {
            attention: attention_fused,
            fused_products: true,
        },
        "fused (now)",
    ),
];

/// `layer`(x) followed by `then`, through `path`.
fn product(p: &mut Profile, path: Path, layer: &Dense, x: &Tensor, then: Then) -> Tensor {
    if path.fused_products {
        return p.time(
            "output and MLP products, with bias, residual and GELU",
            || layer.forward_then(x, then).unwrap(),
        );
    }
    let out = p.time("output and MLP products", || layer.forward(x).unwrap());
    match then {
        Then::Nothing => out,
        Then::AddTo(residual) => p.time("residual adds", || (residual + out).unwrap()),
        Then::Activate(activation) => p.time("GELU", || activate(activation, &out).unwrap()),
    }
}

fn vit_layer(p: &mut Profile, layer: &VitLayer, xs: &Tensor, path: Path) {
    let normed = p.time("LayerNorm", || layer.layernorm_before.forward(xs).unwrap());
    let context = (path.attention)(p, &layer.attention, &normed, None);
    let hidden = product(p, path, &layer.attention_output, &context, Then::AddTo(xs));
    let mlp = p.time("LayerNorm", || {
        layer.layernorm_after.forward(&hidden).unwrap()
    });
    let mlp = product(
        p,
        path,
        &layer.intermediate,
        &mlp,
        Then::Activate(layer.activation),
    );
    drop(product(p, path, &layer.output, &mlp, Then::AddTo(&hidden)));
}

fn bert_layer(p: &mut Profile, layer: &BertLayer, xs: &Tensor, mask: &Tensor, path: Path) {
    let context = (path.attention)(p, &layer.attention, xs, Some(mask));
    let hidden = product(p, path, &layer.attention_output, &context, Then::AddTo(xs));
    let attended = p.time("LayerNorm", || {
        layer.attention_norm.forward(&hidden).unwrap()
    });
    let mlp = product(
        p,
        path,
        &layer.intermediate,
        &attended,
        Then::Activate(layer.activation),
    );
    let sum = product(p, path, &layer.output, &mlp, Then::AddTo(&attended));
    p.time("LayerNorm", || {
        drop(layer.output_norm.forward(&sum).unwrap())
    });
}

/// The per-op profiles of one ViT-Ti layer (batch 16) and one MiniLM layer (batch 32 × 128).
fn profile(vit: &Vit, bert: &Bert, pixels: &Tensor, batch: &TextBatch) {
    let xs = vit.embed(pixels).unwrap();
    let layer = &vit.layers[0];
    for (path, name) in PATHS {
        Profile::of(5, |p| vit_layer(p, layer, &xs, path))
            .print(&format!("ViT-Ti layer, batch 16, {name}"));
    }
    let xs = &bert.hidden_states(batch).unwrap()[0];
    let mask = additive_mask(&batch.attention_mask).unwrap();
    let layer = &bert.layers[0];
    for (path, name) in PATHS {
        Profile::of(5, |p| bert_layer(p, layer, xs, &mask, path))
            .print(&format!("MiniLM layer, batch 32 × 128, {name}"));
    }
}
