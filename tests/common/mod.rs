//! Helpers shared by the integration tests that read the committed fixtures (tests/fixtures/).

#![allow(dead_code)] // each test crate uses its own subset

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use benign_attention::encoder::bert::TextBatch;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Every tensor of a fixture safetensors file.
pub fn load(name: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixtures().join(name), &Device::Cpu).unwrap()
}

/// The weights of a fixture model folder (`tiny_vit`, `tiny_bert`).
pub fn model_vb(dir: &str) -> VarBuilder<'static> {
    let path = fixtures().join(dir).join("model.safetensors");
    // SAFETY: committed fixtures are not modified while the tests run.
    unsafe { VarBuilder::from_mmaped_safetensors(&[path], DType::F32, &Device::Cpu).unwrap() }
}

/// The config.json of a fixture model folder.
pub fn config<T: serde::de::DeserializeOwned>(dir: &str) -> T {
    serde_json::from_str(
        &std::fs::read_to_string(fixtures().join(dir).join("config.json")).unwrap(),
    )
    .unwrap()
}

/// The tiny BERT's input batch from its io fixture.
pub fn bert_batch(io: &HashMap<String, Tensor>) -> TextBatch {
    let u32s = |name: &str| io[name].to_dtype(DType::U32).unwrap();
    TextBatch {
        input_ids: u32s("input_ids"),
        token_type_ids: u32s("token_type_ids"),
        attention_mask: u32s("attention_mask"),
    }
}

/// The largest absolute entry.
pub fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    max_abs(&(a - b).unwrap())
}
