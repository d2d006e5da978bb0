//! The synthetic one-layer encoder against the authors' torch `OneLayerEncoder`, run verbatim by
//! scripts/encoder_parity_fixture.py on parameters and tokens this crate wrote
//! (`tests/fixtures/encoder_parity_inputs.safetensors`): the logits, the CLS attention, every
//! parameter's gradient, and the logits and attention after three SGD steps agree within 1e-5.

use std::collections::HashMap;

use benign_attention::synthetic::data::generate;
use benign_attention::synthetic::encoder::EncoderParams;
use benign_attention::synthetic::encoder::pass::{
    NormedTokens, Update, backward, forward, logistic_loss_grads,
};
use candle_core::{Device, Tensor};

mod common;
use common::{fixtures, load};

const INPUTS: &str = "encoder_parity_inputs.safetensors";
const TORCH: &str = "encoder_parity_torch.safetensors";
const DIM: usize = 64;
const MLP_DIM: usize = 48;
const SEQ_LEN: usize = 8;
const SAMPLES: usize = 8;
const LEARNING_RATE: f32 = 0.05;
const STEPS: usize = 3;

/// The parameters (torch's initialisation, the LayerNorms moved off the identity so that their
/// scale and shift are exercised), the tokens and the ±1 labels of the parity check.
fn parity_inputs() -> (EncoderParams, Vec<f32>, Vec<f64>) {
    let mut params = EncoderParams::init(DIM, MLP_DIM, 7);
    let perturb = |values: &mut Vec<f32>, base: f32, k: usize| {
        for (j, v) in values.iter_mut().enumerate() {
            *v = base + 0.1 * (((j * 37 + k * 11) % 23) as f32 / 11.0 - 1.0);
        }
    };
    perturb(&mut params.attn_norm.weight, 1.0, 1);
    perturb(&mut params.attn_norm.bias, 0.0, 2);
    perturb(&mut params.ff_norm.weight, 1.0, 3);
    perturb(&mut params.ff_norm.bias, 0.0, 4);
    perturb(&mut params.final_norm.weight, 1.0, 5);
    perturb(&mut params.final_norm.bias, 0.0, 6);
    let mut rng = benign_attention::rng::stream(3, benign_attention::rng::Stream::SyntheticTrain);
    let set = generate(SAMPLES, SEQ_LEN, DIM, 0.1, 4.0, 0.25, &mut rng);
    (params, set.tokens, set.labels)
}

fn tensor(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(values, shape, &Device::Cpu).unwrap()
}

fn values(tensors: &HashMap<String, Tensor>, name: &str) -> Vec<f32> {
    tensors[name].flatten_all().unwrap().to_vec1().unwrap()
}

/// Writes the inputs file the fixture script reads (run when the parity inputs change).
#[test]
#[ignore = "writes tests/fixtures/encoder_parity_inputs.safetensors; then run scripts/encoder_parity_fixture.py"]
fn write_encoder_parity_inputs() {
    let (params, tokens, labels) = parity_inputs();
    let mut out: HashMap<String, Tensor> = params
        .named()
        .into_iter()
        .map(|(name, shape, values)| (name.to_string(), tensor(values, &shape)))
        .collect();
    out.insert("data".into(), tensor(&tokens, &[SAMPLES, SEQ_LEN, DIM]));
    let target: Vec<f32> = labels.iter().map(|&y| y as f32).collect();
    out.insert("target".into(), tensor(&target, &[SAMPLES]));
    out.insert("learning_rate".into(), tensor(&[LEARNING_RATE], &[1]));
    out.insert("steps".into(), tensor(&[STEPS as f32], &[1]));
    candle_core::safetensors::save(&out, fixtures().join(INPUTS)).unwrap();
}

fn assert_close(what: &str, ours: &[f32], torch: &[f32]) {
    assert_eq!(ours.len(), torch.len(), "{what}: lengths");
    let worst = ours
        .iter()
        .zip(torch)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // Within 1e-5, and within 1e-4 of the largest value: the gradients are of order 1e-2.
    let largest = torch.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        worst <= 1e-5 && worst <= 1e-4 * largest,
        "{what}: max |ours − torch| = {worst:e} (largest |torch| {largest:e})"
    );
}

/// The data tokens' share of the CLS row (the authors' `attention_scores[:, 0, 1:]`).
fn data_attention(attention: &[f32]) -> Vec<f32> {
    attention
        .chunks_exact(SEQ_LEN + 1)
        .flat_map(|row| row[1..].to_vec())
        .collect()
}

#[test]
fn the_authors_torch_encoder_gives_the_same_logits_attention_and_gradients() {
    let (mut params, tokens, labels) = parity_inputs();
    // The committed inputs are what this crate writes today: the fixture is not stale.
    let inputs = load(INPUTS);
    for (name, _, ours) in params.named() {
        assert_eq!(
            values(&inputs, name),
            ours,
            "{INPUTS}: {name} is not today's"
        );
    }
    assert_eq!(values(&inputs, "data"), tokens, "{INPUTS}: data");
    let torch = load(TORCH);

    let normed = NormedTokens::of(&tokens, SAMPLES, SEQ_LEN, DIM);
    let pass = forward(&params, &normed);
    assert_close("logits", &pass.logits, &values(&torch, "logits"));
    assert_close(
        "attention",
        &data_attention(&pass.attention),
        &values(&torch, "attention"),
    );
    let loss: f64 = pass
        .logits
        .iter()
        .zip(&labels)
        .map(|(&f, &y)| (1.0 + (-y * f as f64).exp()).ln())
        .sum::<f64>()
        / SAMPLES as f64;
    assert_close("loss", &[loss as f32], &values(&torch, "loss"));

    let mut grads = params.clone();
    let d_logits = logistic_loss_grads(&pass.logits, &labels);
    backward(
        &mut params,
        &pass,
        &normed,
        &d_logits,
        Update::Gradients(&mut grads),
    );
    for (name, _, grad) in grads.named() {
        assert_close(
            &format!("∇ {name}"),
            grad,
            &values(&torch, &format!("grad.{name}")),
        );
    }

    for _ in 0..STEPS {
        let pass = forward(&params, &normed);
        let d_logits = logistic_loss_grads(&pass.logits, &labels);
        backward(
            &mut params,
            &pass,
            &normed,
            &d_logits,
            Update::Descend(LEARNING_RATE),
        );
    }
    let after = forward(&params, &normed);
    assert_close(
        "logits after SGD",
        &after.logits,
        &values(&torch, "after.logits"),
    );
    assert_close(
        "attention after SGD",
        &data_attention(&after.attention),
        &values(&torch, "after.attention"),
    );
}
