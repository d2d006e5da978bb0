//! `--precision bf16` against PyTorch's own bf16, on the real ViT-Ti/16 and all-MiniLM-L6-v2 of
//! the offline model mirror (`BENIGN_MODELS_DIR`) and the references of
//! tests/fixtures/bf16_parity.safetensors (scripts/bf16_parity_fixture.py: transformers 4.51.3,
//! float32 with eager attention and bfloat16 with SDPA, on the inputs of benches/encoder.rs).
//!
//! The tolerance is PyTorch's own bf16 error, measured on the same inputs. PyTorch's bf16 keeps
//! every activation in bf16 (weights, hidden states, LayerNorm, softmax and GELU outputs, the
//! residual stream); ours rounds only the operands of the products (dense layers and attention) to
//! bf16, accumulates in f32 and keeps every activation in f32. Ours rounds a subset of what
//! PyTorch rounds, so it must be at least as close to the f32 reference as PyTorch's bf16 is:
//!
//! - (a) our f32 against PyTorch's f32: max |Δ| < 1e-3, so that the inputs and the model match
//!   and what follows measures precision alone;
//! - (b) max |ours_bf16 − torch_f32| ≤ max |torch_bf16 − torch_f32|;
//! - (c) max |ours_bf16 − torch_bf16| ≤ 2 · max |torch_bf16 − torch_f32|, which (b) and the
//!   triangle inequality give, checked on its own so that a failure says which side moved;
//! - (d) every row's cosine(ours_bf16, torch_f32) ≥ the smallest row cosine(torch_bf16,
//!   torch_f32);
//! - (e) ours_bf16 ≠ ours_f32 (max |Δ| > 0): a bf16 backbone that silently computed in f32 would
//!   pass (a)–(d) trivially.
//!
//! Without the models root each test says on stderr that it was skipped (a failure under
//! `BENIGN_REQUIRE_DATA=1`); on a CPU without AVX512-BF16 it says so and is skipped.

use std::io::Write;
use std::path::Path;

use benign_attention::encoder::bert::TextBatch;
use benign_attention::encoder::layers::first_token;
use benign_attention::encoder::vit::Vit;
use benign_attention::encoder::{Backbone, Model, TextOptions, resolve};
use benign_attention::kernels::Precision;
use candle_core::{Device, Tensor};
use candle_nn::Module;

mod common;

const BATCH: usize = 4;
const TOKENS: usize = 32;

/// The models root, on a CPU that computes bf16; else the test is skipped, with the reason on
/// stderr (a missing root is a failure under `BENIGN_REQUIRE_DATA=1`, a CPU without bf16 never is).
fn models_with_bf16(test: &str) -> Option<std::path::PathBuf> {
    let models = common::models_root(test)?;
    if let Err(e) = Precision::Bf16.check_supported() {
        // The stderr handle itself, as common::skip writes, so that the line shows while the test
        // harness captures output.
        let _ = writeln!(std::io::stderr(), "skipped {test}: {e:#}");
        return None;
    }
    Some(models)
}

fn backbone(models: &Path, id: &str, precision: Precision) -> Backbone {
    let files = resolve(id, Some(models)).unwrap_or_else(|e| panic!("{e:#}"));
    Backbone::load(files, &Device::Cpu, TextOptions::default())
        .and_then(|b| b.in_precision(precision))
        .unwrap_or_else(|e| panic!("{id} in {}: {e:#}", precision.name()))
}

/// pixel_values[b,c,y,x] = ((b*7 + c*3 + y + 2*x) % 255)/127.5 − 1, as benches/encoder.rs.
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

/// input_ids[b,t] = 1000 + (b*131 + t*17) % 20000, all attended, token type 0, as
/// benches/encoder.rs.
fn text_batch(batch: usize, tokens: usize) -> TextBatch {
    let ids: Vec<u32> = (0..batch * tokens)
        .map(|k| (1000 + ((k / tokens) * 131 + (k % tokens) * 17) % 20000) as u32)
        .collect();
    let input_ids = Tensor::from_vec(ids, (batch, tokens), &Device::Cpu).unwrap();
    TextBatch {
        token_type_ids: input_ids.zeros_like().unwrap(),
        attention_mask: input_ids.ones_like().unwrap(),
        input_ids,
    }
}

/// The CLS row of the final tokens (after the final LayerNorm), HF's `last_hidden_state[:, 0]`.
fn vit_cls(backbone: &Backbone, pixel_values: &Tensor) -> Tensor {
    let Model::Vit(vit) = &backbone.model else {
        panic!("ViT-Ti is a ViT")
    };
    let states = vit.hidden_states(pixel_values).unwrap();
    let final_tokens = vit.layernorm.forward(states.last().unwrap()).unwrap();
    Vit::cls_feature(&final_tokens).unwrap()
}

/// The CLS row of the last hidden state, HF's `last_hidden_state[:, 0]`.
fn bert_cls(backbone: &Backbone, batch: &TextBatch) -> Tensor {
    let Model::Bert(bert) = &backbone.model else {
        panic!("MiniLM is a BERT")
    };
    let states = bert.hidden_states(batch).unwrap();
    first_token(states.last().unwrap()).unwrap()
}

type Rows = Vec<Vec<f64>>;

/// A (rows, features) tensor in f64, every entry finite (a NaN would slip through the maxima).
fn rows(what: &str, t: &Tensor) -> Rows {
    let rows: Rows = t
        .to_vec2::<f32>()
        .unwrap()
        .into_iter()
        .map(|row| row.into_iter().map(f64::from).collect())
        .collect();
    assert!(
        rows.iter().flatten().all(|v| v.is_finite()),
        "{what}: a non-finite entry"
    );
    rows
}

fn max_abs_diff(a: &Rows, b: &Rows) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f64::max)
}

fn row_cosines(a: &Rows, b: &Rows) -> Vec<f64> {
    let norm = |v: &[f64]| v.iter().map(|p| p * p).sum::<f64>().sqrt();
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let dot: f64 = x.iter().zip(y).map(|(p, q)| p * q).sum();
            dot / (norm(x) * norm(y))
        })
        .collect()
}

fn min(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

/// Assertions (a)–(e) of the module's doc on one model's CLS rows; the fixture's are
/// `<prefix>.f32.<name>` and `<prefix>.bf16.<name>`.
fn check(model: &str, prefix: &str, name: &str, ours_f32: &Tensor, ours_bf16: &Tensor) {
    let fixture = common::load("bf16_parity.safetensors");
    let reference = |precision: &str| {
        let key = format!("{prefix}.{precision}.{name}");
        let t = fixture
            .get(&key)
            .unwrap_or_else(|| panic!("bf16_parity.safetensors has no {key}"));
        assert_eq!(t.dims(), ours_f32.dims(), "{key}");
        rows(&key, t)
    };
    let (torch_f32, torch_bf16) = (reference("f32"), reference("bf16"));
    let (ours_f32, ours_bf16) = (
        rows(&format!("{model}, ours in f32"), ours_f32),
        rows(&format!("{model}, ours in bf16"), ours_bf16),
    );

    let f32_vs_f32 = max_abs_diff(&ours_f32, &torch_f32);
    let torch_error = max_abs_diff(&torch_bf16, &torch_f32);
    let our_error = max_abs_diff(&ours_bf16, &torch_f32);
    let ours_vs_torch_bf16 = max_abs_diff(&ours_bf16, &torch_bf16);
    let bf16_effect = max_abs_diff(&ours_bf16, &ours_f32);
    let torch_cosine = min(&row_cosines(&torch_bf16, &torch_f32));
    let our_cosines = row_cosines(&ours_bf16, &torch_f32);
    eprintln!(
        "{model}: max |Δ| ours f32 vs torch f32 {f32_vs_f32:.3e}; vs torch f32: ours bf16 \
         {our_error:.4e}, torch bf16 {torch_error:.4e}; ours bf16 vs torch bf16 \
         {ours_vs_torch_bf16:.4e}; ours bf16 vs ours f32 {bf16_effect:.4e}; min row cosine vs \
         torch f32: ours bf16 {:.9}, torch bf16 {torch_cosine:.9}",
        min(&our_cosines)
    );

    assert!(
        f32_vs_f32 < 1e-3,
        "{model} (a): our f32 is {f32_vs_f32:e} from PyTorch's f32 (inputs or model differ)"
    );
    assert!(
        our_error <= torch_error,
        "{model} (b): our bf16 is {our_error:e} from PyTorch's f32, PyTorch's bf16 {torch_error:e}"
    );
    assert!(
        ours_vs_torch_bf16 <= 2.0 * torch_error,
        "{model} (c): our bf16 is {ours_vs_torch_bf16:e} from PyTorch's bf16, more than twice \
         PyTorch's bf16 error {torch_error:e}"
    );
    for (row, cosine) in our_cosines.iter().enumerate() {
        assert!(
            *cosine >= torch_cosine,
            "{model} (d): row {row}: cosine(our bf16, PyTorch's f32) = {cosine}, below PyTorch's \
             bf16's smallest {torch_cosine}"
        );
    }
    assert!(
        bf16_effect > 0.0,
        "{model} (e): the bf16 backbone's output equals the f32 one's: bf16 did not run"
    );
}

#[test]
#[cfg_attr(
    benign_no_models,
    ignore = "needs real checkpoints: BENIGN_MODELS_DIR is not set"
)]
fn vit_tiny_bf16_is_as_close_to_f32_as_pytorchs_bf16() {
    let Some(models) =
        models_with_bf16("bf16_parity::vit_tiny_bf16_is_as_close_to_f32_as_pytorchs_bf16")
    else {
        return;
    };
    let id = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k";
    let x = pixels(BATCH);
    let ours_f32 = vit_cls(&backbone(&models, id, Precision::F32), &x);
    let ours_bf16 = vit_cls(&backbone(&models, id, Precision::Bf16), &x);
    assert_eq!(ours_f32.dims(), [BATCH, 192]);
    check(
        "ViT-Ti/16",
        "vit",
        "last_hidden_state_cls",
        &ours_f32,
        &ours_bf16,
    );
}

#[test]
#[cfg_attr(
    benign_no_models,
    ignore = "needs real checkpoints: BENIGN_MODELS_DIR is not set"
)]
fn minilm_bf16_is_as_close_to_f32_as_pytorchs_bf16() {
    let Some(models) =
        models_with_bf16("bf16_parity::minilm_bf16_is_as_close_to_f32_as_pytorchs_bf16")
    else {
        return;
    };
    let id = "sentence-transformers/all-MiniLM-L6-v2";
    let batch = text_batch(BATCH, TOKENS);
    let ours_f32 = bert_cls(&backbone(&models, id, Precision::F32), &batch);
    let ours_bf16 = bert_cls(&backbone(&models, id, Precision::Bf16), &batch);
    assert_eq!(ours_f32.dims(), [BATCH, 384]);
    check("all-MiniLM-L6-v2", "minilm", "cls", &ours_f32, &ours_bf16);
}
