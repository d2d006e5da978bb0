//! The fused CPU attention passes against candle's generic ops on `BENIGN_TEST_DEVICE` (the CPU
//! by default): the encoders' self-attention (`SelfAttention::forward`), phase 2's one-query
//! attention (`KeyValues::attend`, outputs and gradients) and the head mode's token selection.
//! Off the CPU, `forward` and `attend` take the generic path there, so this compares that device
//! with the fused CPU results; on the CPU it compares the fused and generic paths.

use std::collections::HashMap;
use std::sync::Arc;

use benign_attention::encoder::layers::SelfAttention;
use benign_attention::model::TokenSelectionHead;
use benign_attention::model::attend::KeyValues;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarBuilder;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

mod common;
use common::{max_abs, max_abs_diff, on_cpu, test_device};

fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(seed)
}

/// N(0, std²) entries, on the CPU.
fn random(shape: &[usize], std: f32, rng: &mut rand_chacha::ChaCha8Rng) -> Tensor {
    let normal = Normal::new(0f32, std).unwrap();
    let data: Vec<f32> = (0..shape.iter().product())
        .map(|_| normal.sample(rng))
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
}

/// max |a − b| / max |b|.
fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
    max_abs_diff(a, b) / max_abs(b).max(1e-12)
}

#[test]
fn self_attention_matches_the_fused_cpu_pass() {
    let device = test_device();
    let (hidden, heads) = (24, 3);
    let mut rng = rng(5);
    let mut weights = HashMap::new();
    for name in ["query", "key", "value"] {
        weights.insert(
            format!("{name}.weight"),
            random(&[hidden, hidden], 0.3, &mut rng),
        );
        weights.insert(format!("{name}.bias"), random(&[hidden], 0.3, &mut rng));
    }
    let load = |device: &Device| {
        let vb = VarBuilder::from_tensors(weights.clone(), DType::F32, device);
        SelfAttention::load(vb, hidden, heads, true).unwrap()
    };
    let (on_host, on_device) = (load(&Device::Cpu), load(&device));
    let xs = random(&[2, 7, hidden], 1.0, &mut rng);
    // Trailing padding in the first sample, a masked hole in the second (HF's additive mask).
    let keep = Tensor::new(
        &[[1f32, 1., 1., 1., 1., 0., 0.], [1., 0., 1., 1., 1., 1., 1.]],
        &Device::Cpu,
    )
    .unwrap();
    let mask = ((1.0 - keep).unwrap() * f64::from(f32::MIN))
        .unwrap()
        .reshape((2, 1, 1, 7))
        .unwrap();
    for mask in [None, Some(&mask)] {
        let fused = on_host.forward(&xs, mask).unwrap();
        let generic = on_host.forward_reference(&xs, mask).unwrap();
        assert!(
            max_abs_diff(&fused, &generic) < 1e-5,
            "CPU: fused vs generic"
        );
        let there = on_device
            .forward(
                &xs.to_device(&device).unwrap(),
                mask.map(|m| m.to_device(&device).unwrap()).as_ref(),
            )
            .unwrap();
        assert!(there.device().same_device(&device));
        let diff = max_abs_diff(&there, &fused);
        assert!(
            diff < 1e-5,
            "{device:?} vs the fused CPU pass: max |Δ| {diff}"
        );
    }
}

/// Outputs of one attention pass and the gradients of a loss that reads both the pooled tokens
/// and the probabilities, on the CPU.
struct Attention {
    pooled: Tensor,
    probs: Tensor,
    grad_queries: Tensor,
    grad_bias: Tensor,
}

#[test]
fn one_query_attention_and_its_gradients_match_the_fused_cpu_op() {
    let device = test_device();
    let mut rng = rng(3);
    let (n, t, d) = (5, 7, 20);
    let tokens = random(&[n, t, d], 1.0, &mut rng);
    for (heads, lengths, rows) in [
        (3, Some(vec![7, 6, 7, 2, 5]), vec![3, 0, 1, 0]),
        (1, None, vec![3, 0, 1, 0]),
        // Rows 0..B in order: the device path reads its tokens without a gather.
        (2, Some(vec![7, 1, 4, 7, 3]), vec![0, 1, 2, 3, 4]),
    ] {
        let b = rows.len();
        let queries = random(&[b, heads, d], 1.0, &mut rng);
        let bias = random(&[b, heads], 1.0, &mut rng);
        let weights_c = random(&[b, heads, d], 1.0, &mut rng);
        let weights_p = random(&[b, heads, t], 1.0, &mut rng);
        let run = |device: &Device, generic: bool| {
            let on = |x: &Tensor| x.to_device(device).unwrap();
            let kv =
                Arc::new(KeyValues::new(&on(&tokens), heads, lengths.as_deref(), 0.37).unwrap());
            let (q, c) = (
                Var::from_tensor(&on(&queries)).unwrap(),
                Var::from_tensor(&on(&bias)).unwrap(),
            );
            let out = if generic {
                kv.attend_reference(&q, &c, &rows).unwrap()
            } else {
                kv.attend(&q, &c, &rows).unwrap()
            };
            assert!(out.pooled.device().same_device(device));
            let loss = ((&out.pooled * on(&weights_c)).unwrap().sum_all().unwrap()
                + (&out.probs * on(&weights_p)).unwrap().sum_all().unwrap())
            .unwrap();
            let grads = loss.backward().unwrap();
            Attention {
                pooled: on_cpu(&out.pooled),
                probs: on_cpu(&out.probs),
                grad_queries: on_cpu(grads.get(&q).unwrap()),
                grad_bias: on_cpu(grads.get(&c).unwrap()),
            }
        };
        let fused = run(&Device::Cpu, false);
        for (what, other) in [
            ("CPU generic ops", run(&Device::Cpu, true)),
            ("test device", run(&device, false)),
        ] {
            assert!(
                max_rel(&other.pooled, &fused.pooled) < 1e-5,
                "{what}: pooled"
            );
            assert!(
                max_rel(&other.probs, &fused.probs) < 1e-5,
                "{what}: probabilities"
            );
            let diff = max_rel(&other.grad_queries, &fused.grad_queries);
            assert!(diff < 1e-5, "{what}: query gradient {diff}");
            // Σₜ ∂L/∂sₜ = 0: the bias only shifts the scores, so both are rounding noise.
            let diff = max_abs_diff(&other.grad_bias, &fused.grad_bias);
            assert!(diff < 1e-5, "{what}: bias gradient {diff}");
        }
    }
}

#[test]
fn token_selection_head_matches_on_the_test_device() {
    let device = test_device();
    let (n, t, d) = (4, 6, 16);
    let mut data = rng(11);
    let tokens = random(&[n, t, d], 1.0, &mut data);
    let p = random(&[d], 1.0, &mut data);
    let lengths = [6, 3, 5, 6];
    let rows = [1, 0, 3];
    let select = |device: &Device| {
        // The same draw of W on both devices; p set away from 0 so that the softmax is not flat.
        let head = TokenSelectionHead::new(d, &mut rng(1), device).unwrap();
        head.p.set(&p.to_device(device).unwrap()).unwrap();
        let kv = Arc::new(
            KeyValues::new(&tokens.to_device(device).unwrap(), 1, Some(&lengths), 1.0).unwrap(),
        );
        let selection = head.select(&kv, &rows).unwrap();
        let grads = selection.pooled.sum_all().unwrap().backward().unwrap();
        (
            on_cpu(&selection.pooled),
            on_cpu(&selection.attention),
            on_cpu(grads.get(&head.w).unwrap()),
        )
    };
    let (pooled, attention, grad_w) = select(&Device::Cpu);
    let (pooled_there, attention_there, grad_w_there) = select(&device);
    assert!(max_rel(&pooled_there, &pooled) < 1e-5);
    assert!(max_rel(&attention_there, &attention) < 1e-5);
    assert!(max_rel(&grad_w_there, &grad_w) < 1e-5);
    // Padded positions are never selected (sample 1 has 3 tokens).
    let probs: Vec<Vec<f32>> = attention.to_vec2().unwrap();
    assert!(probs[0][3..].iter().all(|&x| x == 0.0));
    assert!(probs[0][..3].iter().all(|&x| x > 0.0));
}
