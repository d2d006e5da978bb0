//! Parity with Hugging Face transformers 4.51.3 (the authors' version), on the fixtures written by
//! scripts/parity_fixtures.py: every hidden state of a tiny ViT and a tiny BERT, the
//! ViTImageProcessor's resize and normalisation, and bert-base-uncased tokenization. The two
//! encoders run on `BENIGN_TEST_DEVICE` (the CPU by default; `cuda` on a GPU build), against the
//! same references.

use std::collections::HashMap;

use benign_attention::encoder::bert::{Bert, BertConfig};
use benign_attention::encoder::preprocess::{ImagePreprocessor, Resample};
use benign_attention::encoder::text::TextPreprocessor;
use benign_attention::encoder::vit::{Vit, VitConfig};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

mod common;
use common::{bert_batch, config, fixtures, load, max_abs_diff, model_vb, test_device};

#[test]
fn tiny_vit_matches_every_hidden_state() {
    let device = test_device();
    let io = load("tiny_vit_io.safetensors");
    let config: VitConfig = config("tiny_vit");
    assert_eq!(config.layer_norm_eps, 1e-6);
    let vit = Vit::load(model_vb("tiny_vit", &device), &config).unwrap();
    let pixels = &io["pixel_values"].to_device(&device).unwrap();
    let states = vit.hidden_states(pixels).unwrap();
    assert_eq!(states.len(), 4);
    for (i, state) in states.iter().enumerate() {
        let diff = max_abs_diff(state, &io[&format!("hidden_states.{i}")]);
        assert!(diff < 1e-4, "hidden state {i}: max |Δ| = {diff}");
    }
    // The cached path: last-layer input, then the last layer and the final LayerNorm.
    let layer_input = vit.last_layer_input(pixels).unwrap();
    assert!(max_abs_diff(&layer_input, &io["hidden_states.2"]) < 1e-4);
    let diff = max_abs_diff(&vit.finish(&layer_input).unwrap(), &io["last_hidden_state"]);
    assert!(diff < 1e-4, "last hidden state: max |Δ| = {diff}");
}

/// The same tiny ViT's weights as `pytorch_model.bin` (torch.save, scripts/timm_fixtures.py), as
/// an older checkpoint holds them, load through candle's pickle reader to the same hidden states.
#[test]
fn pytorch_model_bin_weights_load_to_the_same_hidden_states() {
    let device = test_device();
    let io = load("tiny_vit_io.safetensors");
    let config: VitConfig = config("tiny_vit");
    let vb = benign_attention::encoder::backbone::weights(
        &fixtures().join("tiny_vit_bin/pytorch_model.bin"),
        &device,
    )
    .unwrap();
    let vit = Vit::load(vb, &config).unwrap();
    let pixels = &io["pixel_values"].to_device(&device).unwrap();
    let last = vit.finish(&vit.last_layer_input(pixels).unwrap()).unwrap();
    let diff = max_abs_diff(&last, &io["last_hidden_state"]);
    assert!(diff < 1e-4, "last hidden state: max |Δ| = {diff}");
}

/// A checkpoint in timm's own format (scripts/timm_fixtures.py: real timm, random weights) loads
/// natively, tensor names mapped and the fused qkv split at load time, and matches timm's own
/// forward pass block for block.
#[test]
fn a_timm_format_vit_loads_natively_and_matches_timm() {
    use benign_attention::encoder::hub::BackboneFiles;
    use benign_attention::encoder::{Backbone, Model, TextOptions};
    let device = test_device();
    let folder = fixtures().join("tiny_timm_vit");
    let files = BackboneFiles {
        id: "timm/tiny-fixture".into(),
        config: folder.join("config.json"),
        weights: folder.join("model.safetensors"),
        preprocessor: None,
        tokenizer: None,
        source: "fixture".into(),
    };
    let backbone = Backbone::load(files, &device, TextOptions::default()).unwrap();
    let Model::Vit(vit) = &backbone.model else {
        panic!("a ViT was expected")
    };
    let io = load("tiny_timm_vit_io.safetensors");
    let pixels = &io["pixel_values"].to_device(&device).unwrap();
    let states = vit.hidden_states(pixels).unwrap();
    assert_eq!(states.len(), 3);
    for (i, state) in states.iter().enumerate() {
        let diff = max_abs_diff(state, &io[&format!("hidden_states.{i}")]);
        assert!(diff < 1e-4, "hidden state {i}: max |Δ| = {diff}");
    }
    let last = vit.finish(&vit.last_layer_input(pixels).unwrap()).unwrap();
    let diff = max_abs_diff(&last, &io["last_hidden_state"]);
    assert!(diff < 1e-4, "last hidden state: max |Δ| = {diff}");
}

#[test]
fn tiny_bert_matches_every_hidden_state_and_the_pooler() {
    let device = test_device();
    let io = load("tiny_bert_io.safetensors");
    let config: BertConfig = config("tiny_bert");
    assert_eq!(config.layer_norm_eps, 1e-7);
    let bert = Bert::load(model_vb("tiny_bert", &device), &config).unwrap();
    let batch = bert_batch(&io, &device);
    let states = bert.hidden_states(&batch).unwrap();
    for (i, state) in states.iter().enumerate() {
        let diff = max_abs_diff(state, &io[&format!("hidden_states.{i}")]);
        assert!(diff < 1e-4, "hidden state {i}: max |Δ| = {diff}");
    }
    let layer_input = bert.last_layer_input(&batch).unwrap();
    let final_tokens = bert.finish(&layer_input, &batch.attention_mask).unwrap();
    assert!(max_abs_diff(&final_tokens, &io["hidden_states.3"]) < 1e-4);
    let pooled = bert
        .pooled(&final_tokens)
        .unwrap()
        .expect("the fixture has a pooler");
    let diff = max_abs_diff(&pooled, &io["pooler_output"]);
    assert!(diff < 1e-4, "pooler: max |Δ| = {diff}");
}

/// PIL's 8-bit resize reproduced exactly (0 levels of difference is the goal; 1 is the bound),
/// and the rescale/normalise arithmetic to float precision.
#[test]
fn image_preprocessing_matches_vit_image_processor() {
    let io = load("image_preprocess.safetensors");
    let mut worst = 0u8;
    for resample in [Resample::Bilinear, Resample::Bicubic] {
        let tag = if resample == Resample::Bilinear {
            "bilinear"
        } else {
            "bicubic"
        };
        let processor = ImagePreprocessor {
            size: Some((224, 224)),
            resample,
            rescale_factor: Some(1.0 / 255.0),
            normalize: Some(([0.5; 3], [0.5; 3])),
        };
        for name in ["mnist_0", "mnist_1", "cifar_0", "cifar_1"] {
            let input = &io[&format!("input.{name}")];
            let (channels, h, w) = match input.dims() {
                [h, w] => (1, *h, *w),
                [c, h, w] => (*c, *h, *w),
                other => panic!("{other:?}"),
            };
            let pixels: Vec<u8> = input.flatten_all().unwrap().to_vec1().unwrap();
            let ours = processor.resize_u8(&pixels, channels, h, w).unwrap(); // (3, 224, 224)
            // Reference is HWC.
            let reference: Vec<u8> = io[&format!("resized.{tag}.{name}")]
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let mut differing = 0;
            for c in 0..3 {
                for p in 0..224 * 224 {
                    let d = ours[c * 224 * 224 + p].abs_diff(reference[p * 3 + c]);
                    worst = worst.max(d);
                    differing += usize::from(d != 0);
                }
            }
            assert_eq!(
                differing, 0,
                "{tag} {name}: {differing} pixels differ from PIL (worst {worst})"
            );
            let values = processor.pixel_values(&pixels, channels, h, w).unwrap();
            let crop: Vec<f32> = io[&format!("pixel_values_crop.{tag}.{name}")]
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            for c in 0..3 {
                for y in 0..16 {
                    for x in 0..16 {
                        let ours = values[c * 224 * 224 + (100 + y) * 224 + 100 + x];
                        assert_eq!(
                            ours,
                            crop[(c * 16 + y) * 16 + x],
                            "{tag} {name} c{c} y{y} x{x}"
                        );
                    }
                }
            }
        }
    }
    assert_eq!(worst, 0);
}

#[derive(serde::Deserialize)]
struct TokenFixture {
    source: String,
    text: String,
    input_ids: Vec<u32>,
    attention_mask: Vec<u32>,
    input_ids_special: Vec<u32>,
    attention_mask_special: Vec<u32>,
}

/// The paper's tokenizer (bert-base-uncased, from the model mirror): ids identical to HF's, with
/// special tokens off (the authors' setting) and on.
#[test]
#[cfg_attr(
    benign_no_models,
    ignore = "needs real checkpoints: BENIGN_MODELS_DIR is not set"
)]
fn tokenization_matches_bert_base_uncased() {
    let Some(root) = common::models_root("encoder_parity::tokenization_matches_bert_base_uncased")
    else {
        return;
    };
    let tokenizer_path = root.join("google-bert/bert-base-uncased/tokenizer.json");
    let fixtures: Vec<TokenFixture> = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("trec_tokens.json")).unwrap(),
    )
    .unwrap();
    assert!(fixtures.len() >= 5);
    for special in [false, true] {
        let tokenizer = TextPreprocessor::from_file(&tokenizer_path, 128, special).unwrap();
        let texts: Vec<String> = fixtures.iter().map(|f| f.text.clone()).collect();
        let encoded = tokenizer.encode(&texts).unwrap();
        for (k, f) in fixtures.iter().enumerate() {
            let (ids, mask) = if special {
                (&f.input_ids_special, &f.attention_mask_special)
            } else {
                (&f.input_ids, &f.attention_mask)
            };
            assert_eq!(
                &encoded.input_ids[k], ids,
                "{} (special tokens {special})",
                f.source
            );
            assert_eq!(
                &encoded.attention_mask[k], mask,
                "{} (special tokens {special})",
                f.source
            );
        }
    }
}

/// The original bert-base-uncased checkpoint names its LayerNorm parameters `gamma`/`beta` and
/// prefixes everything with `bert.`; it must load through the same code with the same result.
#[test]
fn bert_checkpoints_with_gamma_beta_names_and_a_prefix_load_the_same() {
    let original = candle_core::safetensors::load(
        fixtures().join("tiny_bert/model.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let renamed: HashMap<String, Tensor> = original
        .iter()
        .map(|(name, t)| {
            let name = name
                .replace("LayerNorm.weight", "LayerNorm.gamma")
                .replace("LayerNorm.bias", "LayerNorm.beta");
            (format!("bert.{name}"), t.clone())
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    candle_core::safetensors::save(&renamed, &path).unwrap();
    let vb =
        unsafe { VarBuilder::from_mmaped_safetensors(&[path], DType::F32, &Device::Cpu).unwrap() };
    let config: BertConfig = config("tiny_bert");
    let bert = Bert::load(vb, &config).unwrap();
    let io = load("tiny_bert_io.safetensors");
    let batch = bert_batch(&io, &Device::Cpu);
    let last = bert.hidden_states(&batch).unwrap().pop().unwrap();
    assert!(max_abs_diff(&last, &io["hidden_states.3"]) < 1e-4);
}
