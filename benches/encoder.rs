//! Backbone throughput on CPU against the named baseline, PyTorch CPU on the same inputs
//! (scripts/bench_torch.py, run separately on the same machine; README keeps both numbers).
//!
//!   ViT-Ti/16, real weights ($BENIGN_MODELS_DIR/timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k),
//!     batch 16 × 3 × 224 × 224                                              → images/s
//!   ViT-B/16, random weights (HF ViTConfig defaults), batch 16             → images/s
//!   all-MiniLM-L6-v2, real weights, batch 32 × 128 tokens, all attended    → sentences/s
//!
//! Inputs as in bench_torch.py: pixel_values[b,c,y,x] = ((b*7 + c*3 + y + 2*x) % 255)/127.5 − 1,
//! input_ids[b,t] = 1000 + (b*131 + t*17) % 20000. Two warm-up batches, median of 5.
//! `cargo bench --bench encoder`.

use std::time::Instant;

use benign_attention::encoder::bert::{Bert, TextBatch};
use benign_attention::encoder::vit::{Vit, VitConfig};
use benign_attention::encoder::{Backbone, Model, TextOptions, resolve};
use candle_core::{DType, Device, Tensor};
use candle_nn::{Module, VarBuilder, VarMap};

fn median_seconds(mut run: impl FnMut()) -> f64 {
    run();
    run();
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let started = Instant::now();
            run();
            started.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times[2]
}

fn pixels(batch: usize) -> Tensor {
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
    Tensor::from_vec(values, (batch, 3, 224, 224), &Device::Cpu).unwrap()
}

fn row(model: &str, batch: usize, seconds: f64, unit: &str) {
    println!(
        "| {model} | {batch} | {seconds:.3} | {:.1} {unit}/s |",
        batch as f64 / seconds
    );
}

fn main() {
    let device = Device::Cpu;
    println!(
        "| model (candle, {} threads) | batch | s/batch | throughput |",
        rayon::current_num_threads()
    );
    println!("|---|---|---|---|");
    let load = |id: &str| {
        Backbone::load(
            resolve(id, None).expect("set BENIGN_MODELS_DIR"),
            &device,
            TextOptions::default(),
        )
        .unwrap()
    };

    let vit_tiny = load("timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k");
    let Model::Vit(vit) = &vit_tiny.model else {
        panic!("ViT-Ti is a ViT")
    };
    let x = pixels(16);
    let full = |vit: &Vit| {
        let states = vit.hidden_states(&x).unwrap();
        vit.layernorm.forward(states.last().unwrap()).unwrap()
    };
    row(
        "ViT-Ti/16 (real weights)",
        16,
        median_seconds(|| drop(full(vit))),
        "images",
    );

    // ViT-B/16 with random weights: HF ViTConfig defaults.
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let vit_base = Vit::load(vb, &VitConfig::default()).unwrap();
    row(
        "ViT-B/16 (random weights)",
        16,
        median_seconds(|| drop(full(&vit_base))),
        "images",
    );

    let minilm = load("sentence-transformers/all-MiniLM-L6-v2");
    let Model::Bert(bert) = &minilm.model else {
        panic!("MiniLM is a BERT")
    };
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
    row(
        "all-MiniLM-L6-v2 (real weights), length 128",
        32,
        median_seconds(|| run(bert)),
        "sentences",
    );
}
