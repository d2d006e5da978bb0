//! Phase 2 from cached layer inputs (CLS query row only) is the same function as a full forward
//! through the whole model with the re-initialised query/key in its last layer: same loss, same
//! gradients of W_Q, b_Q, W_K, b_K (tiny fixture ViT and BERT). Both run on `BENIGN_TEST_DEVICE`
//! (the CPU by default); off the CPU, the cached path's loss and gradients are also compared with
//! the CPU's.

use std::collections::HashMap;

use benign_attention::encoder::Model;
use benign_attention::encoder::bert::{Bert, BertConfig};
use benign_attention::encoder::layer_rows::LayerRows;
use benign_attention::encoder::layers::unpadded_lengths;
use benign_attention::encoder::vit::{Vit, VitConfig};
use benign_attention::model::last_layer::HostSpread;
use benign_attention::model::{Classifier, LastLayer, QueryKey};
use candle_core::{Device, Tensor};
use rand::SeedableRng;

mod common;
use common::{bert_batch, config, load, max_abs, max_abs_diff, model_vb, on_cpu, test_device};

/// The cache's round trip: layer inputs saved as safetensors and read back.
fn through_cache(inputs: &Tensor) -> Tensor {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cached.safetensors");
    candle_core::safetensors::save(
        &HashMap::from([("layer_inputs".to_string(), on_cpu(inputs))]),
        &path,
    )
    .unwrap();
    candle_core::safetensors::load(&path, &Device::Cpu)
        .unwrap()
        .remove("layer_inputs")
        .unwrap()
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    max_abs_diff(a, b) / max_abs(b).max(1e-12)
}

/// The cached path's loss and query/key gradients (by name), on the CPU.
struct Phase2Step {
    loss: f32,
    grads: Vec<(String, Tensor)>,
}

/// Loss and query/key gradients both ways, on the device of `layer_inputs`; asserts they agree to
/// 1e-4 and returns the cached path's.
fn check(
    model: &Model,
    classifier: &Classifier,
    layer_inputs: &Tensor,
    mask: Option<&Tensor>,
    labels: &Tensor,
) -> Phase2Step {
    let device = layer_inputs.device();
    let hidden = layer_inputs.dim(2).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let qk = QueryKey::reset(hidden, &mut rng, device).unwrap();
    let mut layer = LastLayer::new(model, classifier).unwrap();

    let full_logits = layer.full_forward_logits(&qk, layer_inputs, mask).unwrap();
    let full_loss = candle_nn::loss::cross_entropy(&full_logits, labels).unwrap();
    let full_grads = full_loss.backward().unwrap();

    // The cache keeps each sample's rows up to its last attended token; a batch comes back
    // zero-padded to its longest sample.
    let n = layer_inputs.dim(0).unwrap();
    let lengths = match mask {
        Some(m) => unpadded_lengths(m).unwrap(),
        None => vec![layer_inputs.dim(1).unwrap(); n],
    };
    let rows = LayerRows::from_padded(&through_cache(layer_inputs), lengths).unwrap();
    let batch = rows.batch(&(0..n).collect::<Vec<_>>(), device).unwrap();
    let out = layer.forward(&qk, &batch.inputs, &batch.lengths).unwrap();
    // The resident path (the fine-tune set, normed once) is the same function too.
    let resident = layer.resident(&rows, device).unwrap();
    let again = layer
        .forward_resident(&qk, &resident, &(0..n).collect::<Vec<_>>())
        .unwrap();
    assert!(max_rel_diff(&again.logits.detach(), &out.logits.detach()) < 1e-5);
    let loss = candle_nn::loss::cross_entropy(&out.logits, labels).unwrap();
    let grads = loss.backward().unwrap();

    let (a, b) = (
        loss.to_scalar::<f32>().unwrap(),
        full_loss.to_scalar::<f32>().unwrap(),
    );
    assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "loss {a} vs {b}");
    let magnitude = max_abs;
    for (name, var) in qk.named().unwrap() {
        let (ours, reference) = (grads.get(&var).unwrap(), full_grads.get(&var).unwrap());
        eprintln!(
            "{name}: max |grad| {:e}, max |Δ| {:e}",
            magnitude(reference),
            magnitude(&(ours - reference).unwrap())
        );
        if name == "key.bias" {
            continue; // checked below: its true gradient is 0, so only the absolute size matters
        }
        let diff = max_rel_diff(ours, reference);
        assert!(diff < 1e-4, "{name}: relative gradient difference {diff}");
    }
    // The key bias adds q₀ₕ·b_Kₕ to every score of a row, which the softmax cancels: its true
    // gradient is 0, so both paths must leave only rounding, far below the other gradients.
    let scale = magnitude(full_grads.get(&qk.wq).unwrap());
    for g in [grads.get(&qk.bk).unwrap(), full_grads.get(&qk.bk).unwrap()] {
        assert!(
            magnitude(g) <= 1e-4 * scale,
            "key-bias gradient {:e} vs W_Q's {scale:e}",
            magnitude(g)
        );
    }
    if device.is_cpu() {
        // Both ways of sharing the rows out over threads, to the same bits.
        let mut runs = Vec::new();
        for spread in [HostSpread::Chunks, HostSpread::Operations] {
            layer.set_host_spread(spread).unwrap();
            assert_eq!(layer.host_spread(), Some(spread));
            runs.push(check_host_pass(
                &layer, &qk, &resident, &rows, &batch, labels,
            ));
        }
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        let (chunks, operations) = (&runs[0], &runs[1]);
        assert_eq!(chunks.0.to_bits(), operations.0.to_bits(), "loss by spread");
        for (a, b) in chunks
            .1
            .iter()
            .zip(&operations.1)
            .chain([(&chunks.2, &operations.2)])
        {
            assert_eq!(bits(a), bits(b), "gradients and logits by spread");
        }
    }
    Phase2Step {
        loss: a,
        grads: qk
            .named()
            .unwrap()
            .into_iter()
            .map(|(name, var)| (name, on_cpu(grads.get(&var).unwrap())))
            .collect(),
    }
}

/// The CPU's host pass (its training step and evaluation, written out by hand) against autograd
/// through the resident path, on the samples in reverse order: logits and attention to 1e-5,
/// loss to 1e-5, every gradient to 1e-4, and the same evaluation read straight from cached rows; (the key bias's, whose true value is 0, to 1e-4 of W_Q's). Returns the host pass's loss,
/// gradients and evaluated logits.
fn check_host_pass(
    layer: &LastLayer,
    qk: &QueryKey,
    resident: &benign_attention::model::last_layer::ResidentSet,
    cached: &LayerRows,
    batch: &benign_attention::encoder::layer_rows::LayerBatch,
    labels: &Tensor,
) -> (f64, Vec<Tensor>, Tensor) {
    let n = labels.dim(0).unwrap();
    let rows: Vec<usize> = (0..n).rev().collect();
    let labels: Vec<u32> = labels.to_vec1().unwrap();
    let targets: Vec<u32> = rows.iter().map(|&i| labels[i]).collect();
    let reference = layer.forward_resident(qk, resident, &rows).unwrap();
    let loss = candle_nn::loss::cross_entropy(
        &reference.logits,
        &Tensor::new(targets.as_slice(), &Device::Cpu).unwrap(),
    )
    .unwrap();
    let grads = loss.backward().unwrap();
    let step = layer
        .host_step(qk, resident, &rows, &targets, None)
        .unwrap()
        .expect("the CPU has the host pass");
    let (host_loss, host_grads) = (step.loss, step.gradients);
    check_look_ahead(
        layer,
        qk,
        resident,
        &rows,
        &targets,
        (host_loss, &host_grads),
    );
    let reference_loss = f64::from(loss.to_scalar::<f32>().unwrap());
    assert!(
        (host_loss - reference_loss).abs() <= 1e-5 * reference_loss.abs().max(1.0),
        "host loss {host_loss} vs autograd's {reference_loss}"
    );
    let scale = max_abs(grads.get(&qk.wq).unwrap());
    for ((name, var), ours) in qk.named().unwrap().iter().zip(&host_grads) {
        let reference = grads.get(var).unwrap();
        let diff = max_abs_diff(ours, reference);
        let bound = if name == "key.bias" {
            scale
        } else {
            max_abs(reference)
        };
        eprintln!(
            "host {name}: max |grad| {:e}, max |Δ| {diff:e}",
            max_abs(reference)
        );
        assert!(
            diff <= 1e-4 * bound,
            "host {name}: max |Δ| {diff:e} from autograd's"
        );
    }
    let evaluated = layer.evaluate_resident(qk, resident, &rows).unwrap();
    assert!(max_rel_diff(&evaluated.logits, &reference.logits.detach()) < 1e-5);
    assert!(max_abs_diff(&evaluated.cls_attention, &reference.cls_attention.detach()) < 1e-6);
    let streamed = layer.forward(qk, &batch.inputs, &batch.lengths).unwrap();
    // Straight from the cached rows (the streamed test set), its own LayerNorm included.
    let in_order: Vec<usize> = (0..n).collect();
    let from_rows = layer.evaluate_rows(qk, cached, &in_order).unwrap();
    assert!(max_rel_diff(&from_rows.logits, &streamed.logits.detach()) < 1e-5);
    assert!(max_abs_diff(&from_rows.cls_attention, &streamed.cls_attention.detach()) < 1e-6);
    // The test set held in memory (read and normed once) gives the streamed rows' logits bit for
    // bit, for any rows in any order.
    let held = layer
        .host_rows(cached)
        .unwrap()
        .expect("the CPU has the host pass");
    for which in [in_order, rows, vec![n - 1]] {
        let bits = |out: benign_attention::model::last_layer::Output| -> Vec<u32> {
            let logits: Vec<f32> = out.logits.flatten_all().unwrap().to_vec1().unwrap();
            logits.iter().map(|v| v.to_bits()).collect()
        };
        assert_eq!(
            bits(layer.evaluate_host_rows(qk, &held, &which).unwrap()),
            bits(layer.evaluate_rows(qk, cached, &which).unwrap()),
            "rows {which:?}: held and streamed logits differ"
        );
    }
    (host_loss, host_grads, evaluated.logits)
}

/// A step that also evaluates its rows at other parameters (the training loop's look-ahead) is
/// the plain step, bit for bit, and its evaluation is [`LastLayer::evaluate_resident`]'s at those
/// parameters, bit for bit.
fn check_look_ahead(
    layer: &LastLayer,
    qk: &QueryKey,
    resident: &benign_attention::model::last_layer::ResidentSet,
    rows: &[usize],
    targets: &[u32],
    (loss, grads): (f64, &[Tensor]),
) {
    let bits = |t: &Tensor| -> Vec<u32> {
        let values: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        values.iter().map(|v| v.to_bits()).collect()
    };
    let hidden = qk.wq.dim(0).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let earlier = QueryKey::reset(hidden, &mut rng, &Device::Cpu).unwrap();
    let step = layer
        .host_step(qk, resident, rows, targets, Some(&earlier))
        .unwrap()
        .expect("the CPU has the host pass");
    assert_eq!(
        step.loss.to_bits(),
        loss.to_bits(),
        "look-ahead step's loss"
    );
    for (a, b) in step.gradients.iter().zip(grads) {
        assert_eq!(bits(a), bits(b), "look-ahead step's gradients");
    }
    let ahead = step.evaluated.expect("the step evaluated its rows");
    let alone = layer.evaluate_resident(&earlier, resident, rows).unwrap();
    assert_eq!(
        bits(&ahead.logits),
        bits(&alone.logits),
        "look-ahead logits"
    );
    assert_eq!(
        bits(&ahead.cls_attention),
        bits(&alone.cls_attention),
        "look-ahead attention"
    );
    let at_qk = layer.evaluate_resident(qk, resident, rows).unwrap();
    assert_ne!(
        bits(&ahead.logits),
        bits(&at_qk.logits),
        "the evaluation read the step's own parameters"
    );
}

/// The same step on another device: loss and gradients to 1e-4 of the CPU's (the key bias's,
/// whose true value is 0, to 1e-4 of W_Q's).
fn assert_same_step(ours: &Phase2Step, cpu: &Phase2Step) {
    assert!(
        (ours.loss - cpu.loss).abs() <= 1e-4 * cpu.loss.abs().max(1.0),
        "loss {} vs the CPU's {}",
        ours.loss,
        cpu.loss
    );
    let scale = max_abs(&cpu.grads[0].1);
    for ((name, g), (_, reference)) in ours.grads.iter().zip(&cpu.grads) {
        let diff = max_abs_diff(g, reference);
        let bound = if name == "key.bias" {
            scale
        } else {
            max_abs(reference)
        };
        assert!(
            diff <= 1e-4 * bound,
            "{name}: max |Δ| {diff:e} from the CPU's"
        );
    }
}

/// The ViT case on `device`.
fn vit_step(device: &Device) -> Phase2Step {
    let config: VitConfig = config("tiny_vit");
    let vit = Vit::load(model_vb("tiny_vit", device), &config).unwrap();
    let io = load("tiny_vit_io.safetensors");
    let pixels = io["pixel_values"].to_device(device).unwrap();
    let layer_inputs = vit.last_layer_input(&pixels).unwrap();
    let model = Model::Vit(vit);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let classifier = Classifier::new(config.hidden_size, 5, None, &mut rng, device).unwrap();
    let labels = Tensor::new(&[3u32, 1], device).unwrap();
    check(&model, &classifier, &layer_inputs, None, &labels)
}

/// The BERT case (padded text, a pooler) on `device`.
fn bert_step(device: &Device) -> Phase2Step {
    let config: BertConfig = config("tiny_bert");
    let bert = Bert::load(model_vb("tiny_bert", device), &config).unwrap();
    let io = load("tiny_bert_io.safetensors");
    let batch = bert_batch(&io, device);
    let layer_inputs = bert.last_layer_input(&batch).unwrap();
    let pooler = bert.pooler.as_ref().expect("the fixture has a pooler");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let classifier = Classifier::new(
        config.hidden_size,
        4,
        Some((pooler.weight(), pooler.bias().unwrap())),
        &mut rng,
        device,
    )
    .unwrap();
    let model = Model::Bert(bert);
    let labels = Tensor::new(&[0u32, 2], device).unwrap();
    check(
        &model,
        &classifier,
        &layer_inputs,
        Some(&batch.attention_mask),
        &labels,
    )
}

#[test]
fn vit_phase2_from_cache_equals_the_full_forward() {
    let device = test_device();
    let ours = vit_step(&device);
    if !device.is_cpu() {
        assert_same_step(&ours, &vit_step(&Device::Cpu));
    }
}

#[test]
fn bert_phase2_from_cache_equals_the_full_forward() {
    let device = test_device();
    let ours = bert_step(&device);
    if !device.is_cpu() {
        assert_same_step(&ours, &bert_step(&Device::Cpu));
    }
}

/// Three runs stepped as one stack by the host pass (two reading the same samples in the same
/// order with other labels, one other samples in another order, each with its own classifier,
/// query, key and look-ahead parameters) get what each gets alone, bit for bit: loss, every
/// gradient and the look-ahead's evaluation; and a stacked evaluation is each run's own. In both
/// spreads of the rows over the threads.
fn check_stack(
    model: &Model,
    inputs: &Tensor,
    lengths: Vec<usize>,
    pooler: Option<(&Tensor, &Tensor)>,
) {
    use benign_attention::model::last_layer::{HostSource, StackEval, StackRun};
    let bits = |t: &Tensor| -> Vec<u32> {
        let values: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        values.iter().map(|v| v.to_bits()).collect()
    };
    let (n, _, hidden) = inputs.dims3().unwrap();
    let classes = 4;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
    let classifiers: Vec<Classifier> = (0..3)
        .map(|_| Classifier::new(hidden, classes, pooler, &mut rng, &Device::Cpu).unwrap())
        .collect();
    let qks: Vec<QueryKey> = (0..3)
        .map(|_| QueryKey::reset(hidden, &mut rng, &Device::Cpu).unwrap())
        .collect();
    let aheads: Vec<QueryKey> = (0..3)
        .map(|_| QueryKey::reset(hidden, &mut rng, &Device::Cpu).unwrap())
        .collect();
    let stacked = |of: &[QueryKey]| -> Vec<Tensor> {
        (0..4)
            .map(|p| {
                Tensor::stack(
                    &of.iter()
                        .map(|qk| qk.tensors()[p].clone())
                        .collect::<Vec<_>>(),
                    0,
                )
                .unwrap()
            })
            .collect()
    };
    let cached = LayerRows::from_padded(inputs, lengths).unwrap();
    let forward_rows: Vec<usize> = (0..n).collect();
    let other_rows: Vec<usize> = (0..n).rev().collect();
    let targets: Vec<Vec<u32>> = vec![
        (0..n as u32).map(|i| i % classes as u32).collect(),
        (0..n as u32).map(|i| (i + 1) % classes as u32).collect(),
        (0..n as u32).map(|i| (i * 3) % classes as u32).collect(),
    ];
    for spread in [HostSpread::Chunks, HostSpread::Operations] {
        let mut base = LastLayer::new(model, &classifiers[0]).unwrap();
        base.set_host_spread(spread).unwrap();
        let layers = [
            base.with_classifier(&classifiers[1]).unwrap(),
            base.with_classifier(&classifiers[2]).unwrap(),
        ];
        let layers = [&base, &layers[0], &layers[1]];
        let resident = base.resident(&cached, &Device::Cpu).unwrap();
        let rows = [&forward_rows, &forward_rows, &other_rows];
        let runs: Vec<StackRun> = (0..3)
            .map(|k| StackRun {
                layer: layers[k],
                source: HostSource::Resident(&resident),
                rows: rows[k],
                targets: &targets[k],
            })
            .collect();
        let ahead = stacked(&aheads);
        let stack = LastLayer::host_step_stack(&stacked(&qks), Some(&ahead), &runs)
            .unwrap()
            .expect("the CPU has the host pass");
        let evals: Vec<StackEval> = (0..3)
            .map(|k| StackEval {
                layer: layers[k],
                source: HostSource::Resident(&resident),
                rows: rows[k],
            })
            .collect();
        let evaluated = LastLayer::evaluate_stack(&stacked(&qks), &evals)
            .unwrap()
            .unwrap();
        for k in 0..3 {
            let alone = layers[k]
                .host_step(&qks[k], &resident, rows[k], &targets[k], Some(&aheads[k]))
                .unwrap()
                .unwrap();
            assert_eq!(
                stack.losses[k].to_bits(),
                alone.loss.to_bits(),
                "{spread:?} run {k}: loss"
            );
            for (p, g) in alone.gradients.iter().enumerate() {
                assert_eq!(
                    bits(&stack.gradients[p].get(k).unwrap()),
                    bits(g),
                    "{spread:?} run {k}: gradient {p}"
                );
            }
            let (ours, theirs) = (
                stack.evaluated[k].as_ref().unwrap(),
                alone.evaluated.as_ref().unwrap(),
            );
            assert_eq!(
                bits(&ours.logits),
                bits(&theirs.logits),
                "{spread:?} run {k}: look-ahead logits"
            );
            assert_eq!(
                bits(&ours.cls_attention),
                bits(&theirs.cls_attention),
                "{spread:?} run {k}: look-ahead attention"
            );
            let own = layers[k]
                .evaluate_resident(&qks[k], &resident, rows[k])
                .unwrap();
            assert_eq!(
                bits(&evaluated[k].logits),
                bits(&own.logits),
                "{spread:?} run {k}: evaluation"
            );
        }
        assert_ne!(stack.losses[0].to_bits(), stack.losses[1].to_bits());
    }
}

#[test]
fn a_vit_stack_steps_each_run_as_alone() {
    let config: VitConfig = config("tiny_vit");
    let vit = Vit::load(model_vb("tiny_vit", &Device::Cpu), &config).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let values: Vec<f32> = (0..11 * 3 * 32 * 32)
        .map(|_| rand::RngExt::random_range(&mut rng, -1.0f32..1.0))
        .collect();
    let pixels = Tensor::from_vec(values, (11, 3, 32, 32), &Device::Cpu).unwrap();
    let inputs = vit.last_layer_input(&pixels).unwrap();
    let tokens = inputs.dim(1).unwrap();
    check_stack(&Model::Vit(vit), &inputs, vec![tokens; 11], None);
}

#[test]
fn a_bert_stack_steps_each_run_as_alone() {
    let config: BertConfig = config("tiny_bert");
    let bert = Bert::load(model_vb("tiny_bert", &Device::Cpu), &config).unwrap();
    let io = load("tiny_bert_io.safetensors");
    let batch = bert_batch(&io, &Device::Cpu);
    let inputs = bert.last_layer_input(&batch).unwrap();
    let lengths = unpadded_lengths(&batch.attention_mask).unwrap();
    let pooler = bert.pooler.clone().expect("the fixture has a pooler");
    let (w, b) = (pooler.weight().clone(), pooler.bias().unwrap().clone());
    check_stack(&Model::Bert(bert), &inputs, lengths, Some((&w, &b)));
}
