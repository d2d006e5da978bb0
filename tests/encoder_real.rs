//! The encoders with the real checkpoints of the offline model mirror (`BENIGN_MODELS_DIR`) on
//! real data (`BENIGN_DATA_DIR`): weights, architecture and preprocessing right end to end. Without
//! those roots each test says on stderr that it was skipped (a failure under `BENIGN_REQUIRE_DATA=1`).

use std::path::Path;

use benign_attention::data::{self, DatasetName, Inputs};
use benign_attention::encoder::layers::masked_mean;
use benign_attention::encoder::{Backbone, Model, TextOptions, resolve};
use candle_core::{D, Device, Tensor};

mod common;

fn backbone(models: &Path, id: &str, text: TextOptions) -> Backbone {
    let files = resolve(id, Some(models)).unwrap_or_else(|e| panic!("{e:#}"));
    Backbone::load(files, &Device::Cpu, text).unwrap_or_else(|e| panic!("{e:#}"))
}

fn cosine(a: &Tensor, b: &Tensor) -> f32 {
    let dot = (a * b)
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let norm = |x: &Tensor| {
        x.sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            .sqrt()
    };
    dot / (norm(a) * norm(b))
}

/// MANIFEST.md's sanity values: mean-pooled, normalised sentence embeddings with the
/// sentence-transformers convention (special tokens on).
#[test]
#[cfg_attr(
    benign_no_models,
    ignore = "needs real checkpoints: BENIGN_MODELS_DIR is not set"
)]
fn minilm_sentence_similarities() {
    let Some(models) = common::models_root("encoder_real::minilm_sentence_similarities") else {
        return;
    };
    let minilm = backbone(
        &models,
        "sentence-transformers/all-MiniLM-L6-v2",
        TextOptions {
            special_tokens: true,
            ..Default::default()
        },
    );
    let Model::Bert(bert) = &minilm.model else {
        panic!("MiniLM is a BERT")
    };
    let sentences = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "A woman is playing violin.",
    ]
    .map(String::from);
    let batch = minilm.text_batch(&sentences).unwrap();
    let states = bert.hidden_states(&batch).unwrap();
    let embeddings = masked_mean(states.last().unwrap(), &batch.attention_mask).unwrap();
    let row = |i: usize| embeddings.get(i).unwrap();
    let (same, different) = (cosine(&row(0), &row(1)), cosine(&row(0), &row(2)));
    assert!(
        (same - 0.755).abs() <= 0.005,
        "cos(eating food, eating bread) = {same}"
    );
    assert!(
        (different + 0.070).abs() <= 0.005,
        "cos(eating food, violin) = {different}"
    );
}

/// A 10-nearest-neighbour classifier (cosine) on the final-LN CLS feature of ViT-Ti/16 with its
/// own preprocessing: ≥ 0.80 on CIFAR-10 (random weights give ≈ 0.2).
#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn vit_tiny_cls_features_classify_cifar10() {
    let test = "encoder_real::vit_tiny_cls_features_classify_cifar10";
    let Some((root, models)) = common::data_and_models_roots(test, &["cifar10"]) else {
        return;
    };
    let vit = backbone(
        &models,
        "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k",
        TextOptions::default(),
    );
    let cifar = data::load(&DatasetName::Cifar10, &root).unwrap_or_else(|e| panic!("{e}"));
    let features = |inputs: &Inputs, count: usize| -> Tensor {
        let rows: Vec<Tensor> = (0..count)
            .collect::<Vec<_>>()
            .chunks(50)
            .map(|chunk| vit.encode(inputs, chunk).unwrap().cls)
            .collect();
        let all = Tensor::cat(&rows, 0).unwrap();
        all.broadcast_div(
            &all.sqr()
                .unwrap()
                .sum_keepdim(D::Minus1)
                .unwrap()
                .sqrt()
                .unwrap(),
        )
        .unwrap()
    };
    let train = cifar.train.as_ref().unwrap();
    let (train_x, test_x) = (
        features(&train.inputs, 1000),
        features(&cifar.test.inputs, 500),
    );
    let similarity: Vec<Vec<f32>> = test_x
        .matmul(&train_x.t().unwrap())
        .unwrap()
        .to_vec2()
        .unwrap();
    let mut correct = 0;
    for (i, row) in similarity.iter().enumerate() {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let mut votes = [0usize; 10];
        order
            .iter()
            .take(10)
            .for_each(|&j| votes[train.labels[j] as usize] += 1);
        let predicted = (0..10)
            .max_by_key(|&c| (votes[c], std::cmp::Reverse(c)))
            .unwrap();
        correct += usize::from(predicted as u32 == cifar.test.labels[i]);
    }
    let accuracy = correct as f64 / 500.0;
    eprintln!("ViT-Ti 10-NN CIFAR-10 accuracy: {accuracy}");
    assert!(accuracy >= 0.80, "10-NN accuracy {accuracy}");
}

/// A checkpoint folder with config.json but no weights (the paper's bert-base-uncased in the
/// offline mirror) is one clear error; with its weights it resolves.
#[test]
#[cfg_attr(
    benign_no_models,
    ignore = "needs real checkpoints: BENIGN_MODELS_DIR is not set"
)]
fn the_papers_bert_without_weights_is_one_clear_error() {
    let test = "encoder_real::the_papers_bert_without_weights_is_one_clear_error";
    let Some(models) = common::models_root(test) else {
        return;
    };
    let dir = models.join("google-bert/bert-base-uncased");
    if !dir.join("config.json").is_file() {
        common::skip::<()>(test, &format!("{} has no config.json", dir.display()));
        return;
    }
    let resolved = resolve("bert-base-uncased", Some(&models));
    if dir.join("model.safetensors").is_file() {
        assert_eq!(resolved.unwrap().config, dir.join("config.json"));
        return;
    }
    let err = resolved.unwrap_err().to_string();
    assert!(
        err.contains("google-bert/bert-base-uncased") && err.contains("no model.safetensors"),
        "{err}"
    );
}
